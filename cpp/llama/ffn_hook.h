// The one place where the patched llama.cpp calls into selectinfer (ggml-patches/).
//
// The loader validates a SelectInfer GGUF once its tensors are loaded (0002, si_gguf.h). Every
// llama_context gets a ContextHooks (created and freed with the context, asked before LoRA
// adapters are set, 0002; asked before a graph is reused, 0004), and llm_graph_context::build_ffn
// calls it twice per layer while a graph is built (0001): at the start, where a SelectInfer
// layer's FFN is built by neuron_selection.cpp, and before the down projection of a dense layer,
// where profiling adds its statistics. Nothing here throws while a graph is built: what could
// fail is checked when the model loads and when the context is created.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

struct ggml_cgraph;
struct ggml_context;
struct ggml_tensor;
struct llama_context;
struct llama_model;

// At the start of build_ffn (input x [n_embd, rows]; n_ubatch tokens in the batch, more than the
// rows in the last layer, which sees only the output tokens): the whole FFN output of a
// SelectInfer layer (selective computation, neuron_selection.h), or nullptr to go on. `res` is
// the graph being built, to which the selection adds an input that sees every batch.
class llm_graph_result;
ggml_tensor * selectinfer_ffn_begin(void * hooks, ggml_context * ctx, ggml_cgraph * gf, llm_graph_result * res,
                                    ggml_tensor * x, int il, int64_t n_ubatch);

// Before the down projection of a dense layer (act [n_ff, n_tokens]): adds profiling nodes;
// returns what the down projection consumes.
ggml_tensor * selectinfer_ffn_hook(void * hooks, ggml_context * ctx, ggml_cgraph * gf, ggml_tensor * act, int il);

// Whether llama_context may reuse its previous graph for the next ubatch (0004): not when the
// selection phase changed since it was built (neuron_selection.h).
bool selectinfer_graph_reusable(void * hooks);

// Creates a context's hooks with the caller's selection settings (llama_context_params::selectinfer,
// a SelectionOverrides, or null); throws std::invalid_argument (the context is not created) for
// bad SELECTINFER_* environment knobs or when a SelectInfer model is given more than one sequence.
void * selectinfer_context_create(const llama_model * model, uint32_t n_seq_max, const void * selection);
void   selectinfer_context_free(void * hooks);

// Whether llama_set_adapters_lora may set these adapters: not when one changes a SelectInfer
// layer's FFN, which the sparse ops compute without LoRA (the reason is logged).
struct llama_adapter_lora;
bool selectinfer_adapters_supported(void * hooks, llama_adapter_lora ** adapters, size_t n_adapters,
                                    const float * scales);

// Before llama.cpp reads a file's hyperparameters (0009): the values it would assert on
// (file_checks.h), for every file. Throws std::runtime_error naming the key; the load fails.
struct llama_model_loader;
void selectinfer_check_file(const llama_model_loader & loader);

// Before llama.cpp creates a model's tensors (0002): the static rows of each SelectInfer layer's
// gate and up become tensors of their own, which ggml may repack, and the other rows
// `ffn_gate_dyn` and `ffn_up_dyn` (si_gguf.h). Nothing is read yet: a layer whose tensors do not
// fit is left whole, for the checks after the load to refuse.
struct llama_model_loader;
void selectinfer_split_static_rows(llama_model_loader & loader);

// In the architecture's load_arch_tensors (0002): creates the FFN tensors of layer il and returns
// true when it is a SelectInfer layer; false for a dense layer (llama.cpp creates its tensors).
// `selection`: the caller's settings (llama_model_params::selectinfer, a SelectionOverrides, or
// null), which say how the gathered rows load.
struct llama_model_base;
struct llama_layer;
bool selectinfer_create_ffn_tensors(llama_model_base & model, llama_layer & layer, int il, int64_t n_embd, int64_t n_ff,
                                    const void * selection);

// After llama.cpp has loaded a model's tensors (0002): returns the validated SelectInfer
// description of the model (si_gguf.h), or null for a dense model. Throws std::runtime_error naming the tensor, key or layer when the file is inconsistent;
// the load fails.
std::shared_ptr<const void> selectinfer_model_loaded(const llama_model & model, const llama_model_loader & loader);

// After llama.cpp has read the weights, while the loader still holds the file mappings (0002):
// releases the mapped pages of the weights ggml copied into other buffers (model_tensors.h).
void selectinfer_release_copied_weights(const llama_model & model, llama_model_loader & loader);

namespace selectinfer {

class ActivationStats;
class NeuronSelection;
struct SelectionOverrides;

// What a context's graphs see through llama_cparams::selectinfer.
struct ContextHooks {
    ContextHooks(const llama_model * model, const SelectionOverrides * caller);
    ~ContextHooks();

    const llama_model * model;
    std::unique_ptr<ActivationStats> stats;      // profiling: accumulate sum |a| per neuron when set
    std::unique_ptr<NeuronSelection> selection;  // SelectInfer models: selective computation
};

// The hooks of a context (never null for a context of the patched libllama). Enable features
// before the first decode: graphs already built are reused as they are.
ContextHooks & context_hooks(llama_context * ctx);

}  // namespace selectinfer
