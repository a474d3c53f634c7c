// Compiled into libllama (it needs llama.cpp's internal headers).
#include "model_tensors.h"

#include "ggml-backend.h"
#include "llama-mmap.h"
#include "llama-model-loader.h"
#include "llama-model.h"

#include <cmath>
#include <set>
#include <stdexcept>
#include <string>

namespace selectinfer {

void release_copied_weights(const llama_model & model, llama_model_loader & loader) {
    if (!loader.use_mmap) {
        return;
    }
    // a weight can back several tensors (a tied output matrix is the token embedding again): its
    // pages stay while any of them reads the mapping, or reads it later (lazily read weights)
    std::set<std::string> copied, still_mapped;
    for (const auto & [name, t] : model.tensors_by_name) {
        const llama_model_loader::llama_tensor_weight * w = loader.get_weight(name.c_str());
        if (!w || !t->data) continue;
        const auto & mapping = loader.mappings.at(w->idx);
        if (!mapping) continue;
        const char * base = (const char *) mapping->addr();
        const bool mapped = (const char *) t->data >= base && (const char *) t->data < base + mapping->size();
        (mapped || loader.lazy.has(t) ? still_mapped : copied).insert(name);
    }
    for (const std::string & name : copied) {
        if (!still_mapped.count(name)) {
            loader.unmap_weight(*loader.get_weight(name.c_str()));  // whole pages inside the weight only
        }
    }
}

namespace {

const char * buffer_name(const ggml_tensor * t) {
    return t->buffer ? ggml_backend_buft_name(ggml_backend_buffer_get_type(t->buffer)) : "none";
}

}  // namespace

std::map<std::string, uint64_t> weight_bytes_by_buffer(const llama_model & model) {
    std::map<std::string, uint64_t> bytes;
    for (const auto & [name, t] : model.tensors_by_name) bytes[buffer_name(t)] += ggml_nbytes(t);
    return bytes;
}

std::map<std::string, WeightPlacement> weight_placement(const llama_model & model) {
    std::map<std::string, WeightPlacement> out;
    for (const auto & [name, t] : model.tensors_by_name) {
        out[name] = {std::vector<int64_t>(t->ne, t->ne + ggml_n_dims(t)), buffer_name(t)};
    }
    return out;
}

}  // namespace selectinfer
