// Compiled into libllama (it needs llama.cpp's internal headers).
#include "ffn_hook.h"

#include "activation_stats.h"
#include "file_checks.h"
#include "model_tensors.h"
#include "neuron_selection.h"
#include "si_gguf.h"
#include "llama-adapter.h"
#include "llama-context.h"
#include "llama-impl.h"
#include "llama-model-loader.h"
#include "llama-model.h"

using selectinfer::ContextHooks;

ggml_tensor * selectinfer_ffn_begin(void * hooks, ggml_context * ctx, ggml_cgraph * gf, llm_graph_result * res,
                                    ggml_tensor * x, int il, int64_t n_ubatch) {
    auto * h = static_cast<ContextHooks *>(hooks);
    if (h->stats && il >= 0 && il < (int) h->model->layers.size()) {
        h->stats->add_input_to_graph(ctx, gf, x, il);
    }
    return h->selection ? h->selection->build_ffn(ctx, gf, res, x, il, n_ubatch) : nullptr;
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

void * selectinfer_context_create(const llama_model * model, uint32_t n_seq_max, const void * selection) {
    auto hooks = std::make_unique<ContextHooks>(model, static_cast<const selectinfer::SelectionOverrides *>(selection));
    if (hooks->selection && n_seq_max > 1) {
        throw std::invalid_argument(
            "a SelectInfer model keeps one neuron selection per context, so it serves one sequence: got n_seq_max " +
            std::to_string(n_seq_max) + " (llama-server: -np 1; llama-perplexity: --batch-size equal to --ctx-size)");
    }
    if (hooks->selection && model->split_mode() == LLAMA_SPLIT_MODE_TENSOR) {
        // the meta backend splits each op's tensors by rules it knows for upstream's ops only
        throw std::invalid_argument("a SelectInfer model cannot be split by tensor across devices: use --split-mode layer");
    }
    return hooks.release();
}

bool selectinfer_adapters_supported(void * hooks, llama_adapter_lora ** adapters, size_t n_adapters,
                                    const float * scales) {
    auto * h = static_cast<ContextHooks *>(hooks);
    const selectinfer::SiModelInfo * info = h ? selectinfer::si_model_info(*h->model) : nullptr;
    if (!info) return true;
    for (size_t i = 0; i < n_adapters; ++i) {
        if (scales[i] == 0.0f) continue;  // not applied
        for (const auto & [il, n_load] : info->n_load) {
            const llama_layer & layer = h->model->layers[il];
            for (ggml_tensor * w : {layer.ffn_gate, layer.ffn_up, layer.ffn_gate_dyn, layer.ffn_up_dyn,
                                    layer.ffn_down_static, layer.ffn_down_t}) {
                if (w && adapters[i]->get_weight(w)) {
                    LLAMA_LOG_ERROR("%s: the LoRA adapter changes %s, the FFN of a SelectInfer layer, which the sparse "
                                    "ops compute without LoRA; apply the adapter to the original model before "
                                    "converting it\n", __func__, w->name);
                    return false;
                }
            }
        }
    }
    return true;
}

void selectinfer_check_file(const llama_model_loader & loader) {
    std::vector<selectinfer::FileTensor> tensors;
    for (const auto & [name, weight] : loader.weights_map) tensors.push_back({weight.tensor, weight.offs});
    selectinfer::check_file_values(loader.metadata, tensors);
}

void selectinfer_split_static_rows(llama_model_loader & loader) {
    selectinfer::split_static_rows(loader);
}

bool selectinfer_create_ffn_tensors(llama_model_base & model, llama_layer & layer, int il, int64_t n_embd, int64_t n_ff,
                                    const void * selection) {
    const auto * caller = static_cast<const selectinfer::SelectionOverrides *>(selection);
    const selectinfer::GatheredLoad load =
        selectinfer::NeuronSelection::gathered_load(caller, selectinfer::file_strategy(*model.ml));
    return selectinfer::create_ffn_tensors(model, layer, il, n_embd, n_ff, load);
}

std::shared_ptr<const void> selectinfer_model_loaded(const llama_model & model, const llama_model_loader & loader) {
    return selectinfer::read_si_model_info(model, loader);
}

void selectinfer_release_copied_weights(const llama_model & model, llama_model_loader & loader) {
    selectinfer::release_copied_weights(model, loader);
}

void selectinfer_context_free(void * hooks) {
    delete static_cast<ContextHooks *>(hooks);
}

namespace selectinfer {

ContextHooks::ContextHooks(const llama_model * model, const SelectionOverrides * caller)
    : model(model), selection(NeuronSelection::for_model(model, caller)) {}
ContextHooks::~ContextHooks() = default;

ContextHooks & context_hooks(llama_context * ctx) {
    return *static_cast<ContextHooks *>(ctx->get_cparams().selectinfer);
}

}  // namespace selectinfer
