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

namespace {

// A type a weight matrix can have: float, or a quantization with a conversion to float and a dot
// product (Q8_1 and Q8_K only quantize activations: ggml's CPU backend has no dot product for them
// as weights). Told from the type alone, so that libllama needs no CPU backend symbol (a build
// may load its CPU backend at run time).
bool is_weight_type(ggml_type type) {
    if (type == GGML_TYPE_F16 || type == GGML_TYPE_BF16) return true;
    return ggml_is_quantized(type) && ggml_get_type_traits(type)->to_float && type != GGML_TYPE_Q8_1 &&
           type != GGML_TYPE_Q8_K;
}

}  // namespace

void check_model(const llama_model & model) {
    for (const auto & [key, eps] : {std::pair<const char *, float>{"attention.layer_norm_rms_epsilon", model.hparams.f_norm_rms_eps},
                                    {"attention.layer_norm_epsilon", model.hparams.f_norm_eps}}) {
        if (!std::isfinite(eps) || eps < 0.0f) {
            throw std::runtime_error(std::string(key) + " = " + std::to_string(eps) + " is not a number >= 0: the file is damaged");
        }
    }
    for (const auto & [name, t] : model.tensors_by_name) {
        const bool matrix = ggml_n_dims(t) >= 2;
        const bool ok = t->type == GGML_TYPE_F32 || (matrix && is_weight_type(t->type));
        if (!ok) {
            throw std::runtime_error("tensor '" + name + "' is " + ggml_type_name(t->type) + ", which the CPU kernels " +
                                     (matrix ? "cannot multiply" : "do not take for a vector (F32)") +
                                     "; the file is damaged or was written by a faulty converter");
        }
    }
}

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
