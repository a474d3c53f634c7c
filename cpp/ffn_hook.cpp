// Compiled into libllama (it needs llama.cpp's internal headers).
#include "ffn_hook.h"

#include "activation_stats.h"
#include "neuron_selection.h"
#include "llama-context.h"
#include "llama-model.h"

using selectinfer::ContextHooks;

ggml_tensor * selectinfer_ffn_begin(void * hooks, ggml_context * ctx, ggml_cgraph * gf, ggml_tensor * x, int il,
                                    int64_t n_ubatch) {
    auto * h = static_cast<ContextHooks *>(hooks);
    return h->selection ? h->selection->build_ffn(ctx, gf, x, il, n_ubatch) : nullptr;
}

ggml_tensor * selectinfer_ffn_hook(void * hooks, ggml_context * ctx, ggml_cgraph * gf, ggml_tensor * act, int il) {
    auto * h = static_cast<ContextHooks *>(hooks);
    if (h->stats && il >= 0 && il < (int) h->model->layers.size()) {
        h->stats->add_to_graph(ctx, gf, act, il);
    }
    return act;
}

bool selectinfer_graph_reusable(void * hooks) {
    auto * h = static_cast<ContextHooks *>(hooks);
    return !h->selection || h->selection->graph_reusable();
}

void * selectinfer_context_create(const llama_model * model) {
    return new ContextHooks(model);
}

void selectinfer_context_free(void * hooks) {
    delete static_cast<ContextHooks *>(hooks);
}

namespace selectinfer {

ContextHooks::ContextHooks(const llama_model * model) : model(model), selection(NeuronSelection::for_model(model)) {}
ContextHooks::~ContextHooks() = default;

ContextHooks & context_hooks(llama_context * ctx) {
    return *static_cast<ContextHooks *>(ctx->get_cparams().selectinfer);
}

}  // namespace selectinfer
