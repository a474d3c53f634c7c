"""The evaluation harness: eval grids and their reports, benchmarks, metrics, the lm-eval model,
synthetic models and provenance of results."""
