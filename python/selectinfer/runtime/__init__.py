"""What a user needs to run a model: the Model API, the model registry, downloads, cache paths,
memory limits and runs in a child process."""
