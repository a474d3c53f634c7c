// Compiled into libllama (it needs llama.cpp's internal headers).
#include "neuron_selection.h"

#include "compensation.h"

#include "ggml-backend.h"
#include "ggml.h"
#include "llama-batch.h"
#include "llama-graph.h"
#include "llama-model.h"
#include "si_gguf.h"
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

// Whether w lies in one of the CPU backend's repacking buffers (AMX, CPU_REPACK): a layout only
// upstream's matmul reads. (A GPU's buffers are not host memory either, but its kernels gather.)
bool repacked_on_cpu(const ggml_tensor * w) {
    if (!w || !w->buffer || ggml_backend_buffer_is_host(w->buffer)) return false;
    ggml_backend_dev_t device = ggml_backend_buft_get_device(ggml_backend_buffer_get_type(w->buffer));
    return device && ggml_backend_dev_type(device) == GGML_BACKEND_DEVICE_TYPE_CPU;
}

}  // namespace

const char * const kStrategyNames = "frequency, sum-magnitude, fixed, gate-guided or predicted";

const char * strategy_name(Strategy strategy) {
    switch (strategy) {
        case Strategy::frequency:     return "frequency";
        case Strategy::sum_magnitude: return "sum-magnitude";
        case Strategy::fixed:         return "fixed";
        case Strategy::gate_guided:   return "gate-guided";
        case Strategy::predicted:     return "predicted";
    }
    return "?";
}

std::optional<Strategy> strategy_named(const std::string & name) {
    for (Strategy s : kStrategies) {
        if (name == strategy_name(s)) return s;
    }
    return std::nullopt;
}

std::unique_ptr<NeuronSelection> NeuronSelection::for_model(const llama_model * model, const SelectionOverrides * caller) {
    const SiModelInfo * info = si_model_info(*model);
    if (!info) {
        return nullptr;
    }
    std::unique_ptr<NeuronSelection> s(new NeuronSelection(model, *info));
    try {
        s->file_config_ = SelectionOverrides::from_environment().applied_to(s->file_config_);
    } catch (const std::invalid_argument & e) {
        // upstream's tools silence llama.cpp's log, where the failed context would be explained
        std::fprintf(stderr, "selectinfer: %s (from the SELECTINFER_* environment)\n", e.what());
        throw;
    }
    if (caller) {
        s->configure(*caller);  // checked by the caller first (check_settings)
    } else {
        try {
            s->apply(s->file_config_);
        } catch (const std::invalid_argument & e) {
            std::fprintf(stderr, "selectinfer: %s (from the SELECTINFER_* environment)\n", e.what());
            throw;
        }
    }
    return s;
}

NeuronSelection::NeuronSelection(const llama_model * model, const SiModelInfo & info) : model_(model), info_(info) {
    file_config_.compute_ratio = info.compute_ratio >= 0
                                     ? info.compute_ratio
                                     : std::min(info.load_ratio, std::max(info.static_ratio, (float) kDefaultComputeRatio));
    file_config_.token_ratio = info.token_ratio > 0 ? info.token_ratio : (float) kDefaultTokenRatio;
    if (info.strategy) file_config_.strategy = *info.strategy;
    file_config_.compensate = !info.gate_stats.empty();
    layer_index_.assign(model->layers.size(), -1);
    for (const auto & [il, n_load] : info.n_load) {
        Layer l;
        l.il = il;
        l.n_load = n_load;
        l.n_static = info.n_static.at(il);
        const llama_layer & w = model->layers[il];
        ggml_tensor * gate = l.n_static > 0 ? w.ffn_gate_dyn : w.ffn_gate;  // null when every neuron is static
        ggml_tensor * up = l.n_static > 0 ? w.ffn_up_dyn : w.ffn_up;
        const int64_t n_embd = model->hparams.n_embd;
        l.gathered_gate_repacked = repacked_on_cpu(gate);
        l.gathered_up_repacked = repacked_on_cpu(up);
        if (gate && up && w.ffn_down_t) {
            l.gate_row_bytes = (double) ggml_row_size(gate->type, n_embd);
            l.neuron_bytes = l.gate_row_bytes + (double) ggml_row_size(up->type, n_embd) +
                             (double) ggml_row_size(w.ffn_down_t->type, n_embd);
        }
        layer_index_[il] = (int) layers_.size();
        layers_.push_back(l);
    }
}

void NeuronSelection::configure(const SelectionOverrides & overrides) {
    apply(overrides.applied_to(file_config_));
}

GatheredLoad NeuronSelection::gathered_load(const SelectionOverrides * caller, std::optional<Strategy> file_strategy) {
    // a bad SELECTINFER_* value is taken as absent here: every setting is checked, with its name,
    // as the context is created
    SelectionOverrides settings;
    try {
        settings = SelectionOverrides::from_environment();
    } catch (const std::invalid_argument &) {
    }
    if (caller) settings = caller->over(settings);
    if (settings.dense.value_or(false)) return GatheredLoad::dense;
    const std::optional<Strategy> strategy = settings.strategy ? settings.strategy : file_strategy;
    return strategy == Strategy::gate_guided ? GatheredLoad::gate_whole : GatheredLoad::rows;
}

void NeuronSelection::check_settings(const llama_model * model, const SelectionOverrides & caller) {
    const SiModelInfo * info = si_model_info(*model);
    if (!info) return;
    const NeuronSelection s(model, *info);
    s.validate(caller.applied_to(SelectionOverrides::from_environment().applied_to(s.file_config_)));
}

void NeuronSelection::apply(const SelectionConfig & cfg) {
    validate(cfg);
    config_ = cfg;
    std::vector<LayerBudgetInput> inputs;
    for (const Layer & l : layers_) {
        LayerBudgetInput in;
        in.n_load = l.n_load;
        in.n_min = std::max(1, l.n_static);
        // gate_guided reads every loaded neuron's gate row anyway: a computed neuron adds its up and down
        in.neuron_bytes = cfg.strategy == Strategy::gate_guided ? l.neuron_bytes - l.gate_row_bytes : l.neuron_bytes;
        if (!(in.neuron_bytes > 0)) in.neuron_bytes = 1;  // every neuron static: nothing to share out
        if (cfg.layer_budgets == LayerBudgets::profile) in.shares = info_.neuron_shares.at(l.il);
        inputs.push_back(std::move(in));
    }
    const std::vector<int64_t> sizes = layer_budget_sizes(inputs, cfg.compute_ratio, info_.n_original, cfg.layer_budgets);
    for (size_t i = 0; i < layers_.size(); ++i) layers_[i].n_select = (int) sizes[i];
    allocate();
}

void NeuronSelection::validate(const SelectionConfig & cfg) const {
    if (!cfg.dense && std::any_of(layers_.begin(), layers_.end(), [](const Layer & l) { return l.gathered_up_repacked; })) {
        throw std::invalid_argument(
            "the model was loaded for dense use (dense=True, --dense-ffn or SELECTINFER_DENSE=1 at load): its gathered "
            "rows are repacked for upstream's matmul and cannot be selected from; load it again without dense to "
            "compute a subset of its neurons");
    }
    if (!cfg.dense && cfg.strategy != Strategy::gate_guided &&
        std::any_of(layers_.begin(), layers_.end(), [](const Layer & l) { return l.gathered_gate_repacked; })) {
        throw std::invalid_argument(
            std::string("the model was loaded for the gate-guided strategy (the caller's, SELECTINFER_STRATEGY or the "
                        "file's at load): its gathered gate rows are repacked for upstream's matmul, which only "
                        "gate-guided steps read; load it again with the ") +
            strategy_name(cfg.strategy) + " strategy (strategy=, --strategy or SELECTINFER_STRATEGY) to use that one");
    }
    if (cfg.coreinfer && std::any_of(layers_.begin(), layers_.end(), [](const Layer & l) { return l.n_static > 0; })) {
        throw std::invalid_argument(
            "CoreInfer mode chooses every computed neuron from the prompt, but this file keeps static neurons "
            "(computed at every step, in upstream's layout): convert the model with --static-ratio 0 for CoreInfer mode");
    }
    const int n_original = info_.n_original;
    const float eps = 0.5f / std::max(1, n_original);
    const float lowest = cfg.coreinfer ? eps : info_.static_ratio;  // CoreInfer keeps no static neuron
    if (!(cfg.compute_ratio + eps >= lowest && cfg.compute_ratio <= info_.load_ratio + eps)) {
        std::ostringstream msg;
        msg << "compute ratio (phi) " << cfg.compute_ratio << " must lie between "
            << (cfg.coreinfer ? "0 (CoreInfer mode)" : "the file's static ratio (delta) " + std::to_string(info_.static_ratio))
            << " and the load ratio (gamma) " << info_.load_ratio;
        throw std::invalid_argument(msg.str());
    }
    if (cfg.select_by == SelectBy::magnitude && cfg.strategy != Strategy::frequency) {
        throw std::invalid_argument(std::string("selecting by magnitude ranks each token's neurons for the frequency "
                                                "strategy; the ") + strategy_name(cfg.strategy) +
                                    " strategy does not rank tokens: leave select-by at value");
    }
    if (cfg.strategy == Strategy::predicted) {
        for (const Layer & l : layers_) {
            const llama_layer & w = model_->layers[l.il];
            if (l.n_load > l.n_static && !w.ffn_gate_pred_in) {
                throw std::invalid_argument("the predicted strategy needs the file's gate predictor, which layer " +
                                            std::to_string(l.il) + " lacks: convert the model with --predictor-rank "
                                            "(and a profile made with --input-moments)");
            }
        }
    }
    if (cfg.compensate && info_.gate_stats.empty()) {
        throw std::invalid_argument("dropped-neuron compensation needs the gate statistics that files converted "
                                    "from a profile with input moments hold: profile the model with --input-moments "
                                    "and convert it again, or turn compensation off");
    }
    if (cfg.layer_budgets == LayerBudgets::profile && info_.neuron_shares.empty()) {
        throw std::invalid_argument("per-layer budgets from the profile need the neuron shares a profile-ranked file "
                                    "holds: convert the model with --profile (and --ranking profile), or use "
                                    "uniform budgets");
    }
    if (!(cfg.token_ratio > 0 && cfg.token_ratio <= 1)) {
        std::ostringstream msg;
        msg << "token ratio (alpha) must be in (0, 1], got " << cfg.token_ratio;
        throw std::invalid_argument(msg.str());
    }
}

void NeuronSelection::allocate() {
    std::vector<int> layers;
    std::vector<int64_t> n_select, n_load;
    for (const Layer & l : layers_) {
        layers.push_back(l.il);
        n_select.push_back(l.n_select);
        n_load.push_back(l.n_load);
    }
    ids_ = std::make_unique<LayerTensors>(model_, layers, GGML_TYPE_I32, n_select, "si_selected");
    counts_ = std::make_unique<LayerTensors>(model_, layers, GGML_TYPE_F32, n_load, "si_counts");
    counts_->clear();
    // before any prompt: the static neurons and the best-ranked secondary ones (stored in that order)
    for (size_t i = 0; i < layers_.size(); ++i) {
        std::vector<int32_t> first(layers_[i].n_select);
        std::iota(first.begin(), first.end(), 0);
        ggml_backend_tensor_set((*ids_)[i], first.data(), 0, first.size() * sizeof(int32_t));
    }
    allocate_compensation();
    allocate_score_scale();
}

void NeuronSelection::allocate_score_scale() {
    score_scale_.reset();
    const bool with_up_rms = !info_.gate_stats.empty() && !info_.gate_stats.begin()->second.up_rms.empty();
    if (!step_chooses(config_.strategy) || config_.dense || !with_up_rms) return;
    std::vector<int> layers;
    std::vector<int64_t> n_gathered;
    for (const Layer & l : layers_) {
        layers.push_back(l.il);
        n_gathered.push_back(std::max(1, l.n_load - l.n_static));  // (a layer of static neurons only: unused)
    }
    score_scale_ = std::make_unique<LayerTensors>(model_, layers, GGML_TYPE_F32, n_gathered, "si_score_scale");
    for (size_t i = 0; i < layers_.size(); ++i) {
        const Layer & l = layers_[i];
        if (l.n_load == l.n_static) continue;
        const std::vector<float> up_rms = info_.gate_stats.at(l.il).from(l.n_static).up_rms;
        ggml_backend_tensor_set((*score_scale_)[i], up_rms.data(), 0, up_rms.size() * sizeof(float));
    }
}

bool NeuronSelection::compensating() const {
    return config_.compensate && step_chooses(config_.strategy) && !config_.dense;
}

void NeuronSelection::allocate_compensation() {
    comp_nu_.reset();
    comp_out_.reset();
    if (!compensating()) return;
    std::vector<int> layers;
    std::vector<int64_t> n_gathered, n_embd;
    for (const Layer & l : layers_) {
        layers.push_back(l.il);
        n_gathered.push_back(std::max(1, l.n_load - l.n_static));  // (a layer of static neurons only: unused)
        n_embd.push_back(model_->hparams.n_embd);
    }
    comp_nu_ = std::make_unique<LayerTensors>(model_, layers, GGML_TYPE_F32, n_gathered, "si_comp_nu");
    comp_out_ = std::make_unique<LayerTensors>(model_, layers, GGML_TYPE_F32, n_embd, "si_comp_out");
    for (size_t i = 0; i < layers_.size(); ++i) {
        const Layer & l = layers_[i];
        if (l.n_load == l.n_static) continue;
        const GateStats gathered = info_.gate_stats.at(l.il).from(l.n_static);
        const std::vector<float> nu = dropped_means(gathered, l.n_select - l.n_static, info_.activation);
        const std::vector<float> out = down_rows_sum(model_->layers[l.il].ffn_down_t, nu);
        for (const std::vector<float> * v : {&nu, &out}) {
            for (float x : *v) {
                if (!std::isfinite(x)) {
                    throw std::runtime_error("the gate statistics of layer " + std::to_string(l.il) +
                                             " give a dropped-neuron compensation that is not finite (values too large "
                                             "for float32); convert the model again, or turn compensation off");
                }
            }
        }
        ggml_backend_tensor_set((*comp_nu_)[i], nu.data(), 0, nu.size() * sizeof(float));
        ggml_backend_tensor_set((*comp_out_)[i], out.data(), 0, out.size() * sizeof(float));
    }
}

void NeuronSelection::set_phase(Phase phase) {
    if (phase == Phase::prompt) {
        counts_->clear();  // a new prompt: its batches count from zero
    }
    phase_ = phase;
}

namespace {

// A graph input that does not fill a tensor: it tells the selection about each batch the graph
// is computed for, which graph building cannot (graphs are reused, and some are only reserved).
class BatchWatcher : public llm_graph_input_i {
public:
    BatchWatcher(NeuronSelection * selection, bool prompt) : selection_(selection), prompt_(prompt) {}
    void set_input(const llama_ubatch * ubatch) override {
        selection_->on_batch(prompt_, ubatch->n_tokens > 0 && ubatch->pos ? ubatch->pos[0] : 0);
    }
    bool can_reuse(const llm_graph_params &) override { return true; }  // the phase decides (graph_reusable)

private:
    NeuronSelection * selection_;
    bool prompt_;
};

}  // namespace

void NeuronSelection::on_batch(bool prompt, int32_t first_position) {
    // the engine says when a prompt starts (set_phase); other programs: a prompt batch at the
    // start of the sequence or after decode steps
    if (prompt && phase_ == Phase::by_batch_size && (first_position == 0 || !counting_)) {
        counts_->clear();
    }
    counting_ = prompt;
}

ggml_tensor * NeuronSelection::build_ffn(ggml_context * ctx, ggml_cgraph * gf, llm_graph_result * res, ggml_tensor * x,
                                         int il, int64_t n_ubatch) {
    if (il < 0 || il >= (int) layer_index_.size() || layer_index_[il] < 0) {
        return nullptr;
    }
    const Layer & l = layers_[layer_index_[il]];
    ggml_tensor * ids = (*ids_)[layer_index_[il]];
    const llama_layer & w = model_->layers[il];
    // x has fewer rows than the batch in the last layer (only the output tokens reach it): the
    // batch size, not the rows, tells a prompt from a decode step
    const bool prompt = phase_ == Phase::prompt || (phase_ == Phase::by_batch_size && n_ubatch > 1);
    if (&l == &layers_.front()) {
        res->add_input(std::make_unique<BatchWatcher>(this, prompt));
    }
    built_prompt_ = prompt;
    const SiFfnWeights weights = SiFfnWeights::of(w, info_.activation);
    const bool all_loaded = config_.dense || l.n_select == l.n_load;
    if (!prompt && !all_loaded) {
        if (!step_chooses(config_.strategy)) {
            return build_sparse_ffn(ctx, weights, x, ids, l.n_select - l.n_static);
        }
        if (x->ne[1] == 1) {  // (the engine decodes a token at a time; more go dense, below)
            Compensation comp;
            if (comp_nu_) comp = {(*comp_nu_)[layer_index_[il]], (*comp_out_)[layer_index_[il]]};
            ggml_tensor * scale = score_scale_ ? (*score_scale_)[layer_index_[il]] : nullptr;
            return config_.strategy == Strategy::predicted
                       ? build_predicted_ffn(ctx, weights, x, l.n_select - l.n_static, comp, scale)
                       : build_gate_guided_ffn(ctx, weights, x, l.n_select - l.n_static, comp, scale);
        }
    }
    // dense over the loaded neurons; a prompt selects its neurons in the same graph
    const LoadedFfn loaded = build_loaded_ffn(ctx, weights, x);
    if (prompt && !all_loaded && prompt_chooses(config_.strategy)) {
        ggml_tensor * counts = (*counts_)[layer_index_[il]];
        const SelectionNodes chosen = build_selection(ctx, loaded.act, loaded.act_rest, counts, l.n_static,
                                                      l.n_select - l.n_static, config_);
        ggml_build_forward_expand(gf, ggml_cpy(ctx, chosen.counts, counts));
        ggml_build_forward_expand(gf, ggml_cpy(ctx, chosen.ids, ids));
    }
    return loaded.out;
}

SiFfnWeights SiFfnWeights::of(const llama_layer & layer, GatedActivation activation) {
    SiFfnWeights w;
    w.activation = activation;
    w.gate = layer.ffn_gate;
    w.up = layer.ffn_up;
    w.gate_dyn = layer.ffn_gate_dyn;
    w.up_dyn = layer.ffn_up_dyn;
    w.down_static = layer.ffn_down_static;
    w.down_t = layer.ffn_down_t;
    w.gate_pred_in = layer.ffn_gate_pred_in;
    w.gate_pred_out = layer.ffn_gate_pred_out;
    w.n_static = layer.ffn_down_static ? (int) layer.ffn_down_static->ne[0] : 0;
    return w;
}

ggml_glu_op SiFfnWeights::glu_op() const {
    // as upstream's build_ffn (LLM_FFN_SILU / LLM_FFN_GELU with a parallel gate)
    return activation == GatedActivation::gelu ? GGML_GLU_OP_GEGLU : GGML_GLU_OP_SWIGLU;
}

ggml_tensor * SiFfnWeights::gated(ggml_context * ctx, ggml_tensor * gate_out, ggml_tensor * up_out) const {
    return ggml_glu_split(ctx, gate_out, up_out, glu_op());
}

namespace {

// Whether the CPU backend's own kernel of ggml_si_mul_rows beats upstream's plain-buffer mul_mat
// over every row of w (the backend's answer: its dispatch decides).
bool mul_rows_beats_mul_mat(const ggml_tensor * w, const ggml_tensor * x) {
    static const auto beats = [] {
        ggml_backend_reg_t cpu = ggml_backend_reg_by_name("CPU");
        return cpu ? (ggml_si_mul_rows_beats_mul_mat_t) ggml_backend_reg_get_proc_address(cpu, GGML_SI_MUL_ROWS_BEATS_MUL_MAT)
                   : nullptr;
    }();
    return beats && beats(w, x);
}

// No GPU: every node of a graph runs on the CPU (with one, llama.cpp's scheduler may place a
// node on it).
bool no_gpu_device() {
    return !ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_GPU) && !ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_IGPU);
}

// Whether a weight lives in host memory and no GPU is there to take a node that reads it (a tensor
// without a buffer lives in its context's CPU memory).
bool on_cpu_only(const ggml_tensor * w) {
    const bool in_host_memory = w->buffer ? ggml_backend_buffer_is_host(w->buffer) : w->data != nullptr;
    return in_host_memory && no_gpu_device();
}

}  // namespace

ggml_tensor * gathered_product(ggml_context * ctx, ggml_tensor * w, ggml_tensor * x) {
    // every gathered row on the CPU by our kernel where it is the faster; with a GPU present
    // upstream may offload a big batch's mul_mat, so it stays
    return on_cpu_only(w) && mul_rows_beats_mul_mat(w, x) ? ggml_si_mul_rows(ctx, w, x, nullptr, 0) : ggml_mul_mat(ctx, w, x);
}

LoadedFfn build_loaded_ffn(ggml_context * ctx, const SiFfnWeights & w, ggml_tensor * x) {
    auto gated = [&](ggml_tensor * gate, ggml_tensor * up) {
        return w.gated(ctx, ggml_mul_mat(ctx, gate, x), ggml_mul_mat(ctx, up, x));
    };
    ggml_tensor * act_static = w.n_static > 0 ? gated(w.gate, w.up) : nullptr;
    ggml_tensor * act_dynamic = w.down_t ? w.gated(ctx, gathered_product(ctx, w.gathered_gate(), x),
                                                   gathered_product(ctx, w.gathered_up(), x))
                                         : nullptr;
    ggml_tensor * out_static = act_static ? ggml_mul_mat(ctx, w.down_static, act_static) : nullptr;
    ggml_tensor * out_dynamic = act_dynamic ? ggml_si_mul_rows_t(ctx, w.down_t, act_dynamic, nullptr, 0, nullptr) : nullptr;
    if (!act_static) return {act_dynamic, nullptr, out_dynamic};
    if (!act_dynamic) return {act_static, nullptr, out_static};
    return {act_static, act_dynamic, ggml_add(ctx, out_static, out_dynamic)};
}

namespace {

// The static neurons' FFN output (nullptr without any): upstream's matmul over whole tensors (on
// repacked weights where ggml repacks them), which reads a contiguous block faster than any gather.
ggml_tensor * static_block(ggml_context * ctx, const SiFfnWeights & w, ggml_tensor * x) {
    if (w.n_static == 0) return nullptr;
    ggml_tensor * act = w.gated(ctx, ggml_mul_mat(ctx, w.gate, x), ggml_mul_mat(ctx, w.up, x));
    return ggml_mul_mat(ctx, w.down_static, act);
}

// The score a step ranks gathered neurons by, |act(gate)|, applied inside the selection op.
ggml_si_score abs_activation(const SiFfnWeights & w) {
    return w.activation == GatedActivation::gelu ? GGML_SI_SCORE_ABS_GELU : GGML_SI_SCORE_ABS_SILU;
}

ggml_tensor * with_dropped(ggml_context * ctx, ggml_tensor * out, const Compensation & comp) {
    if (!comp.out) return out;
    return out ? ggml_add(ctx, out, comp.out) : ggml_reshape_2d(ctx, comp.out, comp.out->ne[0], 1);
}

// out (the static block's, or nullptr) plus the FFN of the gathered neurons `chosen` (ids from
// first_id) for one token: on the CPU alone one ggml_si_ffn_rows node, else gate and up by
// ggml_si_mul_rows, the GLU and down by ggml_si_mul_rows_t, added to out. gate_values [n_gathered]
// or nullptr: the gate already computed over every gathered row (the chosen ones' are taken);
// nu or nullptr: the compensation's share taken off each chosen activation.
ggml_tensor * with_chosen_rows(ggml_context * ctx, const SiFfnWeights & w, ggml_tensor * x, ggml_tensor * chosen,
                               int first_id, ggml_tensor * out, ggml_tensor * gate_values, ggml_tensor * nu) {
    ggml_tensor * gate = w.gathered_gate(), * up = w.gathered_up();
    // with the gate's values the op reads no gate row (a gate-guided load may have repacked them),
    // so only a gate it reads must be in host memory and of up's type
    const bool gate_read = !gate_values;
    const bool gate_fits = !gate_read || (gate->type == up->type && on_cpu_only(gate));
    if (x->ne[1] == 1 && gate_fits && on_cpu_only(up) && on_cpu_only(w.down_t)) {
        return ggml_si_ffn_rows(ctx, gate_read ? gate : nullptr, up, w.down_t, x, chosen, first_id, w.glu_op(), out,
                                gate_values, nu);
    }
    ggml_tensor * gate_out = nullptr;
    if (gate_values) {  // [1, n] rows of the values, back to [n, 1]
        ggml_tensor * rows = ggml_get_rows(ctx, ggml_reshape_2d(ctx, gate_values, 1, ggml_nelements(gate_values)), chosen);
        gate_out = ggml_reshape_2d(ctx, rows, chosen->ne[0], 1);
    } else {
        gate_out = ggml_si_mul_rows(ctx, gate, x, chosen, first_id);
    }
    ggml_tensor * act = w.gated(ctx, gate_out, ggml_si_mul_rows(ctx, up, x, chosen, first_id));
    ggml_tensor * part = ggml_si_mul_rows_t(ctx, w.down_t, act, chosen, first_id, nu);
    return out ? ggml_add(ctx, out, part) : part;
}

}  // namespace

ggml_tensor * build_sparse_ffn(ggml_context * ctx, const SiFfnWeights & w, ggml_tensor * x, ggml_tensor * ids,
                               int n_dynamic) {
    ggml_tensor * out = static_block(ctx, w, x);
    if (n_dynamic == 0) return out;
    ggml_tensor * dynamic = ggml_view_1d(ctx, ids, n_dynamic, w.n_static * sizeof(int32_t));
    return with_chosen_rows(ctx, w, x, dynamic, w.n_static, out, nullptr, nullptr);
}

ggml_tensor * build_gate_guided_ffn(ggml_context * ctx, const SiFfnWeights & w, ggml_tensor * x, int n_dynamic,
                                    const Compensation & comp, ggml_tensor * score_scale) {
    ggml_tensor * out = static_block(ctx, w, x);
    if (n_dynamic > 0) {
        // gate over every gathered neuron (gathered_product: upstream's matmul, or eight rows at a
        // time in integers), the score |act(gate)| (times up's rms), and the
        // n_dynamic best rows of the gathered tensors (ids from 0: row 0 is neuron n_static)
        ggml_tensor * gate = gathered_product(ctx, w.gathered_gate(), x);  // [n_gathered, 1]
        ggml_tensor * chosen = ggml_si_select(ctx, gate, 0, n_dynamic, abs_activation(w), score_scale);
        // up and down of the chosen, each activation less its nu (its share of comp.out, added whole)
        out = with_chosen_rows(ctx, w, x, chosen, 0, out, gate, comp.nu);
    }
    return with_dropped(ctx, out, comp);
}

ggml_tensor * build_predicted_ffn(ggml_context * ctx, const SiFfnWeights & w, ggml_tensor * x, int n_dynamic,
                                  const Compensation & comp, ggml_tensor * score_scale) {
    ggml_tensor * out = static_block(ctx, w, x);
    if (n_dynamic > 0) {
        // the predicted gate of every gathered neuron (two small upstream matmuls), the score
        // |act(predicted)| (times up's rms), and gate, up and down of the n_dynamic best (ids from 0)
        ggml_tensor * predicted = ggml_mul_mat(ctx, w.gate_pred_out, ggml_mul_mat(ctx, w.gate_pred_in, x));
        ggml_tensor * chosen = ggml_si_select(ctx, predicted, 0, n_dynamic, abs_activation(w), score_scale);
        out = with_chosen_rows(ctx, w, x, chosen, 0, out, nullptr, comp.nu);
    }
    return with_dropped(ctx, out, comp);
}

SelectionNodes build_selection(ggml_context * ctx, ggml_tensor * act, ggml_tensor * act_rest, ggml_tensor * counts,
                               int n_static, int n_dynamic, const SelectionConfig & config) {
    // the CPU's count reads the two parts where they are (a copy into one tensor, ggml's concat,
    // runs on one thread: 4% of a 64-token prompt of the default model, the other thread waiting)
    const bool count_parts = config.strategy != Strategy::sum_magnitude && no_gpu_device();
    if (act_rest && !count_parts) {
        act = ggml_concat(ctx, act, act_rest, 0);
        act_rest = nullptr;
    }
    ggml_tensor * scores = nullptr;
    if (config.strategy == Strategy::sum_magnitude) {
        // the sum over the batch's tokens of |a|, by upstream's ops (so on any backend)
        ggml_tensor * by_neuron = ggml_cont(ctx, ggml_transpose(ctx, ggml_abs(ctx, act)));  // [T, n_load]
        scores = ggml_reshape_1d(ctx, ggml_sum_rows(ctx, by_neuron), act->ne[0]);
        if (counts) scores = ggml_add(ctx, scores, counts);
    } else {
        scores = ggml_si_count(ctx, act, act_rest, counts, config.token_ratio,
                               config.select_by == SelectBy::magnitude);
    }
    return {scores, ggml_si_select(ctx, scores, n_static, n_dynamic, GGML_SI_SCORE_VALUE, nullptr)};
}

bool NeuronSelection::graph_reusable() const {
    return phase_ == Phase::by_batch_size || built_prompt_ == (phase_ == Phase::prompt);
}

std::vector<std::vector<int32_t>> NeuronSelection::selected() const {
    std::vector<std::vector<int32_t>> out;
    if (step_chooses(config_.strategy)) {  // each decode step chooses its own
        return std::vector<std::vector<int32_t>>(layers_.size());
    }
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

std::vector<int> NeuronSelection::computed_counts() const {
    std::vector<int> out;
    for (const Layer & l : layers_) out.push_back(config_.dense ? l.n_load : l.n_select);
    return out;
}

std::vector<int> NeuronSelection::layers() const {
    std::vector<int> out;
    for (const Layer & l : layers_) out.push_back(l.il);
    return out;
}

}  // namespace selectinfer
