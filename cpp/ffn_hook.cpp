// Compiled into libllama (it needs llama.cpp's internal headers).
#include "ffn_hook.h"

#include "activation_stats.h"
#include "llama-context.h"

ggml_tensor * selectinfer_ffn_hook(void * hooks, ggml_context * ctx, ggml_cgraph * gf, ggml_tensor * act, int il) {
    auto * h = static_cast<selectinfer::ContextHooks *>(hooks);
    if (h->stats && il >= 0) {
        h->stats->add_to_graph(ctx, gf, act, il);
    }
    return act;
}

namespace selectinfer {

void set_context_hooks(llama_context * ctx, ContextHooks * hooks) {
    // llama_context exposes its cparams read-only; the object itself is not const, and the
    // field is ours (added by the patch), so writing it here is well-defined.
    const_cast<llama_cparams &>(ctx->get_cparams()).selectinfer = hooks;
}

}  // namespace selectinfer
