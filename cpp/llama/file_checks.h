// The values of a GGUF that the pinned llama.cpp asserts on (aborting the process) instead of
// refusing: one table, checked before llama.cpp reads any of them, for every file the engine or
// llama.cpp's tools load, plain or SelectInfer (ggml-patches/0009 calls check_file_values at the
// start of llama_model_load). The selectinfer.* keys are checked after the load (si_gguf.h), where
// their tensors can be compared with them. docs/reliability.md lists both.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

struct ggml_tensor;
struct gguf_context;

namespace selectinfer {

// One rule: the keys or tensors it reads ("{arch}" stands for general.architecture), what
// llama.cpp takes without aborting, and the assert a broken value would reach.
struct FileCheck {
    const char * keys;
    const char * allowed;
    const char * aborts_in;
};

// The table's rules (the fuzzer mutates their keys: tests/fuzzing.py, via _native.FILE_CHECKS).
const std::vector<FileCheck> & file_checks();

// A tensor of the file as llama.cpp's loader describes it before reading it.
struct FileTensor {
    const ggml_tensor * tensor;  // name, type and shape
    size_t file_offset;          // where its data starts in its file
};

// Throws std::runtime_error "KEY = VALUE (allowed: ...): the file is corrupted or not a model this
// build supports" for the first rule the file breaks.
void check_file_values(const gguf_context * meta, const std::vector<FileTensor> & tensors);

}  // namespace selectinfer
