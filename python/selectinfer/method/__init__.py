"""The method's tools: data sets, profiling, profiles and their reports, conversion to SelectInfer
GGUF files, and prepare (profile + convert to a memory budget)."""
