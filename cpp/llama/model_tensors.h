// A loaded model's tensors (any GGUF, dense or SelectInfer): where the weights ended up, and the
// pages of the mapping that a copy made redundant. (Their types are checked before the load: file_checks.h.)
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

struct llama_model;
struct llama_model_loader;

namespace selectinfer {

// With the weights mapped from the file, ggml still copies some into other buffers (repacked for
// AMX or CPU_REPACK, or on a GPU); their pages of the mapping stay resident, a second copy of the
// same weights. Unmaps those pages (never a page that a mapped weight shares). No-op without mmap.
void release_copied_weights(const llama_model & model, llama_model_loader & loader);

// Bytes of weights per buffer type ("CPU", "CPU_Mapped", "CPU_REPACK", "AMX", "CUDA0", ...):
// whether ggml repacked them for its faster kernels, and what that costs in memory.
std::map<std::string, uint64_t> weight_bytes_by_buffer(const llama_model & model);

// Every weight tensor: name -> (shape ne[0..n_dims), buffer type), as the model loaded it.
struct WeightPlacement {
    std::vector<int64_t> ne;
    std::string buffer;
};
std::map<std::string, WeightPlacement> weight_placement(const llama_model & model);

}  // namespace selectinfer
