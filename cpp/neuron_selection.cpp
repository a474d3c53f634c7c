// Compiled into libllama (it needs llama.cpp's internal headers).
#include "neuron_selection.h"

#include "ggml-backend.h"
#include "ggml.h"
#include "llama-model.h"
#include "sparse_ffn_ops.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <sstream>
#include <stdexcept>

namespace selectinfer {

namespace {

std::string meta(const llama_model * model, const char * key) {
    std::string buf(256, '\0');
    int32_t n = llama_model_meta_val_str(model, key, buf.data(), buf.size());
    if (n < 0) return "";
    if (n >= (int32_t) buf.size()) {
        buf.resize(n + 1);
        llama_model_meta_val_str(model, key, buf.data(), buf.size());
    }
    buf.resize(n);
    return buf;
}

float env_float(const char * name, float fallback) {
    const char * v = std::getenv(name);
    if (!v || !*v) return fallback;
    char * end = nullptr;
    const float x = std::strtof(v, &end);
    if (*end != '\0') throw std::invalid_argument(std::string(name) + "='" + v + "' is not a number");
    return x;
}

bool env_flag(const char * name) {
    const char * v = std::getenv(name);
    return v && *v && std::strcmp(v, "0") != 0;
}

}  // namespace

std::unique_ptr<NeuronSelection> NeuronSelection::for_model(const llama_model * model) {
    if (meta(model, "selectinfer.format_version").empty()) {
        return nullptr;
    }
    std::unique_ptr<NeuronSelection> s(new NeuronSelection(model));
    try {
        SelectionConfig cfg;
        cfg.compute_ratio = env_float("SELECTINFER_COMPUTE_RATIO", -1);
        cfg.token_ratio   = env_float("SELECTINFER_TOKEN_RATIO", -1);
        const char * by = std::getenv("SELECTINFER_SELECT_BY");
        if (by && *by && std::strcmp(by, "value") != 0 && std::strcmp(by, "magnitude") != 0) {
            throw std::invalid_argument(std::string("SELECTINFER_SELECT_BY='") + by + "': use value or magnitude");
        }
        cfg.by_magnitude  = by && std::strcmp(by, "magnitude") == 0;
        cfg.dense         = env_flag("SELECTINFER_DENSE");
        cfg.coreinfer     = env_flag("SELECTINFER_COREINFER");
        s->configure(cfg);
    } catch (const std::invalid_argument & e) {
        // upstream's tools silence llama.cpp's log, where the failed context would be explained
        std::fprintf(stderr, "selectinfer: %s (from the SELECTINFER_* environment)\n", e.what());
        throw;
    }
    return s;
}

NeuronSelection::NeuronSelection(const llama_model * model) : model_(model) {
    n_original_   = std::atoi(meta(model, "selectinfer.original_feed_forward_length").c_str());
    load_ratio_   = std::strtof(meta(model, "selectinfer.load_ratio").c_str(), nullptr);
    static_ratio_ = std::strtof(meta(model, "selectinfer.static_ratio").c_str(), nullptr);
    const std::string phi = meta(model, "selectinfer.compute_ratio");
    const std::string alpha = meta(model, "selectinfer.token_ratio");
    // defaults of the authors' reference code: phi 0.4 (within [delta, gamma]), alpha 0.2
    default_phi_   = phi.empty() ? std::min(load_ratio_, std::max(static_ratio_, 0.4f)) : std::strtof(phi.c_str(), nullptr);
    default_alpha_ = alpha.empty() ? 0.2f : std::strtof(alpha.c_str(), nullptr);

    // llama.cpp keeps no array metadata in the model: SelectInfer layers are those stored with
    // ffn_down_t, and each has the same number of static neurons (the converter's rule)
    const std::string n_static = meta(model, "selectinfer.static_count");
    const int static_count = n_static.empty() ? (int) std::lround(static_ratio_ * n_original_) : std::atoi(n_static.c_str());
    const int n_layer = (int) model->layers.size();
    layer_index_.assign(n_layer, -1);
    for (int il = 0; il < n_layer; ++il) {
        if (!model->layers[il].ffn_down_t) continue;
        Layer l;
        l.il = il;
        l.n_load = (int) model->layers[il].ffn_down_t->ne[1];
        l.n_static = std::min(static_count, l.n_load);
        layer_index_[il] = (int) layers_.size();
        layers_.push_back(l);
    }
}

void NeuronSelection::configure(const SelectionConfig & requested) {
    SelectionConfig cfg = requested;
    if (cfg.compute_ratio < 0) cfg.compute_ratio = default_phi_;
    if (cfg.token_ratio < 0) cfg.token_ratio = default_alpha_;
    const float eps = 0.5f / std::max(1, n_original_);
    const float lowest = cfg.coreinfer ? eps : static_ratio_;  // CoreInfer keeps no static neuron
    if (cfg.compute_ratio + eps < lowest || cfg.compute_ratio > load_ratio_ + eps) {
        std::ostringstream msg;
        msg << "compute ratio (phi) " << cfg.compute_ratio << " must lie between "
            << (cfg.coreinfer ? "0 (CoreInfer mode)" : "the file's static ratio (delta) " + std::to_string(static_ratio_))
            << " and the load ratio (gamma) " << load_ratio_;
        throw std::invalid_argument(msg.str());
    }
    if (!(cfg.token_ratio > 0 && cfg.token_ratio <= 1)) {
        std::ostringstream msg;
        msg << "token ratio (alpha) must be in (0, 1], got " << cfg.token_ratio;
        throw std::invalid_argument(msg.str());
    }
    config_ = cfg;
    for (Layer & l : layers_) {
        l.n_select = std::max({1, kept_static(l), std::min(l.n_load, (int) std::lround(cfg.compute_ratio * n_original_))});
    }
    allocate();
}

void NeuronSelection::allocate() {
    std::vector<int> layers;
    std::vector<int64_t> lengths;
    for (const Layer & l : layers_) {
        layers.push_back(l.il);
        lengths.push_back(l.n_select);
    }
    ids_ = std::make_unique<LayerTensors>(model_, layers, GGML_TYPE_I32, lengths, "si_selected");
    // before any prompt: the static neurons and the best-ranked secondary ones (stored in that order)
    for (size_t i = 0; i < layers_.size(); ++i) {
        std::vector<int32_t> first(layers_[i].n_select);
        std::iota(first.begin(), first.end(), 0);
        ggml_backend_tensor_set((*ids_)[i], first.data(), 0, first.size() * sizeof(int32_t));
    }
}

ggml_tensor * NeuronSelection::build_ffn(ggml_context * ctx, ggml_cgraph * gf, ggml_tensor * x, int il,
                                         int64_t n_ubatch) const {
    if (il < 0 || il >= (int) layer_index_.size() || layer_index_[il] < 0) {
        return nullptr;
    }
    const Layer & l = layers_[layer_index_[il]];
    ggml_tensor * ids = (*ids_)[layer_index_[il]];
    const llama_layer & w = model_->layers[il];
    // x has fewer rows than the batch in the last layer (only the output tokens reach it): the
    // batch size, not the rows, tells a prompt from a decode step
    const bool prompt = phase_ == Phase::prompt || (phase_ == Phase::by_batch_size && n_ubatch > 1);
    built_prompt_ = prompt;
    const bool all_loaded = config_.dense || l.n_select == l.n_load;
    if (!prompt && !all_loaded) {
        return build_sparse_ffn(ctx, w.ffn_gate, w.ffn_up, w.ffn_down_t, x, ids, kept_static(l),
                                l.n_select - kept_static(l));
    }
    // dense over the loaded neurons; a prompt selects its neurons in the same graph
    ggml_tensor * act = ggml_swiglu_split(ctx, ggml_mul_mat(ctx, w.ffn_gate, x), ggml_mul_mat(ctx, w.ffn_up, x));
    if (prompt && !all_loaded) {
        ggml_tensor * chosen = ggml_si_select(ctx, act, kept_static(l), l.n_select - kept_static(l),
                                              config_.token_ratio, config_.by_magnitude);
        ggml_build_forward_expand(gf, ggml_cpy(ctx, chosen, ids));
    }
    return ggml_si_mul_rows_t(ctx, w.ffn_down_t, act, nullptr);
}

ggml_tensor * build_sparse_ffn(ggml_context * ctx, ggml_tensor * gate, ggml_tensor * up, ggml_tensor * down_t,
                               ggml_tensor * x, ggml_tensor * ids, int n_static, int n_dynamic) {
    ggml_tensor * out = nullptr;
    if (n_static > 0) {
        // the static neurons are the first rows: upstream's dense matmul over them (its tiled
        // kernel reads a contiguous block faster than any row gather)
        auto first_rows = [&](ggml_tensor * t) { return ggml_view_2d(ctx, t, t->ne[0], n_static, t->nb[1], 0); };
        ggml_tensor * act = ggml_swiglu_split(ctx, ggml_mul_mat(ctx, first_rows(gate), x),
                                              ggml_mul_mat(ctx, first_rows(up), x));
        out = ggml_si_mul_rows_t(ctx, down_t, act, nullptr);
    }
    if (n_dynamic > 0) {
        ggml_tensor * dynamic = ggml_view_1d(ctx, ids, n_dynamic, n_static * sizeof(int32_t));
        ggml_tensor * act = ggml_swiglu_split(ctx, ggml_si_mul_rows(ctx, gate, x, dynamic),
                                              ggml_si_mul_rows(ctx, up, x, dynamic));
        ggml_tensor * part = ggml_si_mul_rows_t(ctx, down_t, act, dynamic);
        out = out ? ggml_add(ctx, out, part) : part;
    }
    return out;
}

bool NeuronSelection::graph_reusable() const {
    return phase_ == Phase::by_batch_size || built_prompt_ == (phase_ == Phase::prompt);
}

std::vector<std::vector<int32_t>> NeuronSelection::selected() const {
    std::vector<std::vector<int32_t>> out;
    for (size_t i = 0; i < layers_.size(); ++i) {
        std::vector<int32_t> v(layers_[i].n_select);
        ggml_backend_tensor_get((*ids_)[i], v.data(), 0, v.size() * sizeof(int32_t));
        out.push_back(std::move(v));
    }
    return out;
}

bool NeuronSelection::sparsifies_last_layer() const {
    return !layers_.empty() && layers_.back().il == (int) model_->layers.size() - 1;
}

std::vector<int> NeuronSelection::layers() const {
    std::vector<int> out;
    for (const Layer & l : layers_) out.push_back(l.il);
    return out;
}

}  // namespace selectinfer
