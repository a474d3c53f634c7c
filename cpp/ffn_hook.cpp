// Compiled into libllama (it needs llama.cpp's internal headers).
#include "ffn_hook.h"

#include "activation_stats.h"
#include "llama-context.h"
#include "llama-model.h"

using selectinfer::ContextHooks;

ggml_tensor * selectinfer_ffn_hook(void * hooks, ggml_context * ctx, ggml_cgraph * gf, ggml_tensor * act, int il) {
    auto * h = static_cast<ContextHooks *>(hooks);
    if (il < 0 || il >= (int) h->model->layers.size()) {
        return act;
    }
    if (h->stats) {
        h->stats->add_to_graph(ctx, gf, act, il);
    }
    const llama_layer & layer = h->model->layers[il];
    if (layer.ffn_down_t && !layer.ffn_down) {
        // one row of ffn_down_t per loaded neuron: out[:, t] = sum_i act[i, t] * ffn_down_t[i, :]
        return ggml_out_prod(ctx, layer.ffn_down_t, ggml_transpose(ctx, act));
    }
    return act;
}

void * selectinfer_context_create(const llama_model * model) {
    return new ContextHooks(model);
}

void selectinfer_context_free(void * hooks) {
    delete static_cast<ContextHooks *>(hooks);
}

namespace selectinfer {

ContextHooks::ContextHooks(const llama_model * model) : model(model) {}
ContextHooks::~ContextHooks() = default;

ContextHooks & context_hooks(llama_context * ctx) {
    return *static_cast<ContextHooks *>(ctx->get_cparams().selectinfer);
}

}  // namespace selectinfer
