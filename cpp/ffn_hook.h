// The one place where the patched llama.cpp calls into selectinfer (ggml-patches/).
//
// Every llama_context gets a ContextHooks (created and freed with the context, 0002), and
// llm_graph_context::build_ffn hands it the input of the down projection, act(gate) * up
// ([n_ff, n_tokens]), of every layer while a graph is built (0001). There we add profiling
// nodes and, for SelectInfer layers, compute the down projection from its transposed,
// row-per-neuron form. Because this lives inside libllama, the upstream tools built from the
// same tree (llama-cli, llama-server, llama-bench, ...) run SelectInfer GGUFs too.
#pragma once

#include <memory>

struct ggml_cgraph;
struct ggml_context;
struct ggml_tensor;
struct llama_context;
struct llama_model;

// Returns what build_ffn continues with: `act` for dense layers (build_ffn applies ffn_down),
// or, for a layer stored with ffn_down_t (it has no ffn_down), the finished FFN output.
ggml_tensor * selectinfer_ffn_hook(void * hooks, ggml_context * ctx, ggml_cgraph * gf, ggml_tensor * act, int il);

void * selectinfer_context_create(const llama_model * model);
void   selectinfer_context_free(void * hooks);

namespace selectinfer {

class ActivationStats;

// What a context's graphs see through llama_cparams::selectinfer.
struct ContextHooks {
    explicit ContextHooks(const llama_model * model);
    ~ContextHooks();

    const llama_model * model;
    std::unique_ptr<ActivationStats> stats;  // profiling: accumulate sum |a| per neuron when set
};

// The hooks of a context (never null for a context of the patched libllama). Enable features
// before the first decode: graphs already built are reused as they are.
ContextHooks & context_hooks(llama_context * ctx);

}  // namespace selectinfer
