// The one place where the patched llama.cpp calls into selectinfer (ggml-patches/0001-ffn-hook.patch).
//
// llm_graph_context::build_ffn hands us the input of the down projection, act(gate) * up
// ([n_ff, n_tokens]), of every layer while a graph is built, when a ContextHooks is attached
// to the context. We may add nodes to the graph (activation statistics) and return the tensor
// the down projection consumes.
#pragma once

struct ggml_cgraph;
struct ggml_context;
struct ggml_tensor;
struct llama_context;

ggml_tensor * selectinfer_ffn_hook(void * hooks, ggml_context * ctx, ggml_cgraph * gf, ggml_tensor * act, int il);

namespace selectinfer {

class ActivationStats;

// What a context's graphs see through llama_cparams::selectinfer.
struct ContextHooks {
    ActivationStats * stats = nullptr;  // profile: accumulate sum |a| per neuron
};

// Attaches `hooks` to every graph `ctx` builds from now on; nullptr detaches. Call before the
// first decode: graphs already built are reused as they are.
void set_context_hooks(llama_context * ctx, ContextHooks * hooks);

}  // namespace selectinfer
