// Compiled into libllama (it needs llama.cpp's internal headers).
#include "activation_stats.h"

#include "ggml-backend.h"
#include "ggml.h"
#include "llama-model.h"

#include <stdexcept>
#include <string>

namespace selectinfer {

namespace {

std::vector<std::vector<float>> read_layers(const LayerTensors & tensors) {
    std::vector<std::vector<float>> out;
    for (size_t il = 0; il < tensors.size(); ++il) {
        ggml_tensor * t = tensors[il];
        std::vector<float> v(t->ne[0]);
        ggml_backend_tensor_get(t, v.data(), 0, ggml_nbytes(t));
        out.push_back(std::move(v));
    }
    return out;
}

}  // namespace

ActivationStats::ActivationStats(const llama_model * model, bool input_moments) {
    std::vector<int> layers;
    std::vector<int64_t> widths;
    for (int il = 0; il < (int) model->hparams.n_layer(); ++il) {
        layers.push_back(il);
        widths.push_back(model->hparams.n_ff(il));
    }
    sums_ = std::make_unique<LayerTensors>(model, layers, GGML_TYPE_F32, widths, "si_abs_act_sum");
    if (input_moments) {
        const int64_t n_embd = model->hparams.n_embd;
        moments_ = std::make_unique<LayerTensors>(model, layers, GGML_TYPE_F32,
                                                  std::vector<int64_t>(layers.size(), n_embd * n_embd + n_embd),
                                                  "si_ffn_input_moment");
    }
    reset();
}

void ActivationStats::reset() {
    sums_->clear();
    if (moments_) moments_->clear();
}

void ActivationStats::add_to_graph(ggml_context * ctx, ggml_cgraph * gf, ggml_tensor * act, int il) const {
    ggml_tensor * sum = (*sums_)[il];
    if (act->ne[0] != sum->ne[0] || ggml_n_dims(act) > 2 || act->type != GGML_TYPE_F32) {
        throw std::runtime_error("FFN activation of layer " + std::to_string(il) + " has an unexpected shape or type");
    }
    // tokens along ne0 after the transpose, so that sum_rows adds over tokens
    ggml_tensor * abs_t = ggml_cont(ctx, ggml_transpose(ctx, ggml_abs(ctx, act)));          // [n_tokens, n_ff]
    ggml_tensor * per_neuron = ggml_reshape_1d(ctx, ggml_sum_rows(ctx, abs_t), sum->ne[0]);  // [n_ff]
    ggml_build_forward_expand(gf, ggml_cpy(ctx, ggml_add(ctx, sum, per_neuron), sum));
}

void ActivationStats::add_input_to_graph(ggml_context * ctx, ggml_cgraph * gf, ggml_tensor * x, int il) const {
    if (!moments_ || x->ne[1] < 2) return;
    ggml_tensor * acc = (*moments_)[il];
    const int64_t n = x->ne[0];
    if (n * n + n != acc->ne[0] || ggml_n_dims(x) > 2 || x->type != GGML_TYPE_F32) {
        throw std::runtime_error("FFN input of layer " + std::to_string(il) + " has an unexpected shape or type");
    }
    // tokens along ne0, so that the matmul sums x_i x_j over them and sum_rows x_i (upstream's
    // ops: any backend); x x^T in the first n * n floats, x in the last n
    ggml_tensor * by_channel = ggml_cont(ctx, ggml_transpose(ctx, x));  // [n_tokens, n_embd]
    ggml_tensor * outer = ggml_reshape_1d(ctx, ggml_mul_mat(ctx, by_channel, by_channel), n * n);
    ggml_tensor * total = ggml_reshape_1d(ctx, ggml_sum_rows(ctx, by_channel), n);
    ggml_tensor * moments = ggml_view_1d(ctx, acc, n * n, 0);
    ggml_tensor * sums = ggml_view_1d(ctx, acc, n, n * n * sizeof(float));
    ggml_build_forward_expand(gf, ggml_cpy(ctx, ggml_add(ctx, moments, outer), moments));
    ggml_build_forward_expand(gf, ggml_cpy(ctx, ggml_add(ctx, sums, total), sums));
}

std::vector<std::vector<float>> ActivationStats::read() const {
    return read_layers(*sums_);
}

std::vector<std::vector<float>> ActivationStats::read_input_moments() const {
    return moments_ ? read_layers(*moments_) : std::vector<std::vector<float>>{};
}

}  // namespace selectinfer
