// Compiled into libllama (it needs llama.cpp's internal headers).
#include "activation_stats.h"

#include "ggml-backend.h"
#include "ggml.h"
#include "llama-model.h"

#include <map>
#include <stdexcept>
#include <string>

namespace selectinfer {

ActivationStats::ActivationStats(const llama_model * model) {
    const int n_layer = (int) model->hparams.n_layer();
    std::map<ggml_backend_buffer_type_t, ggml_context *> ctx_of_buft;
    for (int il = 0; il < n_layer; ++il) {
        ggml_backend_buffer_type_t buft = ggml_backend_dev_buffer_type(model->dev_layer(il));
        ggml_context *& ctx = ctx_of_buft[buft];
        if (!ctx) {
            ggml_init_params params = {(size_t) n_layer * ggml_tensor_overhead(), nullptr, /*no_alloc=*/true};
            ctx = ggml_init(params);
            ctxs_.push_back(ctx);
        }
        const int64_t n_ff = model->hparams.n_ff(il);
        ggml_tensor * t = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, n_ff);
        ggml_format_name(t, "si_abs_act_sum-%d", il);
        sums_.push_back(t);
        widths_.push_back(n_ff);
    }
    for (const auto & [buft, ctx] : ctx_of_buft) {
        ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors_from_buft(ctx, buft);
        if (!buf) {
            throw std::runtime_error("could not allocate activation-statistics buffers");
        }
        bufs_.push_back(buf);
    }
    reset();
}

ActivationStats::~ActivationStats() {
    for (ggml_backend_buffer_t buf : bufs_) ggml_backend_buffer_free(buf);
    for (ggml_context * ctx : ctxs_) ggml_free(ctx);
}

void ActivationStats::add_to_graph(ggml_context * ctx, ggml_cgraph * gf, ggml_tensor * act, int il) const {
    ggml_tensor * sum = sums_.at(il);
    if (act->ne[0] != sum->ne[0] || ggml_n_dims(act) > 2 || act->type != GGML_TYPE_F32) {
        throw std::runtime_error("FFN activation of layer " + std::to_string(il) + " has an unexpected shape or type");
    }
    // tokens along ne0 after the transpose, so that sum_rows adds over tokens
    ggml_tensor * abs_t = ggml_cont(ctx, ggml_transpose(ctx, ggml_abs(ctx, act)));          // [n_tokens, n_ff]
    ggml_tensor * per_neuron = ggml_reshape_1d(ctx, ggml_sum_rows(ctx, abs_t), sum->ne[0]);  // [n_ff]
    ggml_build_forward_expand(gf, ggml_cpy(ctx, ggml_add(ctx, sum, per_neuron), sum));
}

std::vector<std::vector<float>> ActivationStats::read() const {
    std::vector<std::vector<float>> out;
    for (ggml_tensor * t : sums_) {
        std::vector<float> v(t->ne[0]);
        ggml_backend_tensor_get(t, v.data(), 0, ggml_nbytes(t));
        out.push_back(std::move(v));
    }
    return out;
}

void ActivationStats::reset() {
    for (ggml_backend_buffer_t buf : bufs_) ggml_backend_buffer_clear(buf, 0);
}

}  // namespace selectinfer
