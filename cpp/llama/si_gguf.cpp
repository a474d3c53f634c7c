// Compiled into libllama (it needs llama.cpp's internal headers).
#include "si_gguf.h"

#include "gguf.h"
#include "gguf_values.h"
#include "llama-model-loader.h"
#include "llama-model.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <tuple>

namespace selectinfer {

namespace {

// The keys (si_format.h).
constexpr const char * kVersion      = key::format_version.name;
constexpr const char * kOriginalN    = key::original_n.name;
constexpr const char * kLoadRatio    = key::load_ratio.name;
constexpr const char * kStaticRatio  = key::static_ratio.name;
constexpr const char * kComputeRatio = key::compute_ratio.name;
constexpr const char * kTokenRatio   = key::token_ratio.name;
constexpr const char * kStrategy     = key::strategy.name;
constexpr const char * kStaticCount  = key::static_count.name;
constexpr const char * kLayers       = key::layers.name;
constexpr const char * kStaticCounts = key::static_counts.name;
constexpr const char * kNeuronIds    = key::neuron_ids.name;     // + layer
constexpr const char * kNeuronShares = key::neuron_shares.name;  // + layer; optional (profile-ranked files)
constexpr const char * kGateRms      = key::gate_rms.name;       // + layer; optional (profiles with input moments)
constexpr const char * kUpSlope      = key::up_slope.name;       // + layer; with gate_rms
constexpr const char * kGateMean     = key::gate_mean.name;      // + layer; optional, with gate_rms
constexpr const char * kUpMean       = key::up_mean.name;        // + layer; with gate_mean
constexpr const char * kUpRms        = key::up_rms.name;         // + layer; optional, with gate_rms

[[noreturn]] void refuse(const std::string & what) {
    throw std::runtime_error("invalid SelectInfer GGUF: " + what + "; convert the model again with `selectinfer convert`");
}

std::string layer_key(const char * prefix, int il) {
    return prefix + std::to_string(il);
}

class Metadata {
public:
    explicit Metadata(const gguf_context * meta) : meta_(meta) {}

    bool has(const std::string & key) const { return gguf_find_key(meta_, key.c_str()) >= 0; }

    int64_t integer(const std::string & key, int64_t lo, int64_t hi) const {
        const int64_t id = find(key);
        const gguf_type t = gguf_get_kv_type(meta_, id);
        if (!is_integer(t)) refuse(key + " is a " + gguf_type_name(t) + ", not an integer");
        const int64_t v = integer_at(gguf_get_val_data(meta_, id), t, 0);
        if (v < lo || v > hi) {
            refuse(key + " = " + std::to_string(v) + " is outside [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
        }
        return v;
    }

    // A finite number in [lo, hi]; `optional` keys that are absent give -1.
    float ratio(const std::string & key, float lo, float hi, bool optional = false) const {
        if (optional && !has(key)) return -1.0f;
        const int64_t id = find(key);
        const gguf_type t = gguf_get_kv_type(meta_, id);
        double v;
        if (t == GGUF_TYPE_FLOAT32) {
            v = gguf_get_val_f32(meta_, id);
        } else if (t == GGUF_TYPE_FLOAT64) {
            v = gguf_get_val_f64(meta_, id);
        } else {
            refuse(key + " is a " + gguf_type_name(t) + ", not a number");
        }
        if (!std::isfinite(v) || v < lo || v > hi) {
            char buf[160];
            std::snprintf(buf, sizeof buf, " = %g is outside [%g, %g]", v, (double) lo, (double) hi);
            refuse(key + buf);
        }
        return (float) v;
    }

    // A string value; `optional` keys that are absent give "".
    std::string text(const std::string & key, bool optional = false) const {
        if (optional && !has(key)) return "";
        const int64_t id = find(key);
        const gguf_type t = gguf_get_kv_type(meta_, id);
        if (t != GGUF_TYPE_STRING) refuse(key + " is a " + gguf_type_name(t) + ", not a string");
        return gguf_get_val_str(meta_, id);
    }

    std::vector<int64_t> integers(const std::string & key) const {
        const int64_t id = find(key);
        if (gguf_get_kv_type(meta_, id) != GGUF_TYPE_ARRAY) refuse(key + " is not an array");
        const gguf_type t = gguf_get_arr_type(meta_, id);
        if (!is_integer(t)) refuse(key + " is an array of " + gguf_type_name(t) + ", not of integers");
        const size_t n = gguf_get_arr_n(meta_, id);
        const void * data = n ? gguf_get_arr_data(meta_, id) : nullptr;
        std::vector<int64_t> out(n);
        for (size_t i = 0; i < n; ++i) out[i] = integer_at(data, t, i);
        return out;
    }

    std::vector<float> floats(const std::string & key) const {
        const int64_t id = find(key);
        if (gguf_get_kv_type(meta_, id) != GGUF_TYPE_ARRAY) refuse(key + " is not an array");
        const gguf_type t = gguf_get_arr_type(meta_, id);
        if (t != GGUF_TYPE_FLOAT32) refuse(key + " is an array of " + gguf_type_name(t) + ", not of f32");
        const size_t n = gguf_get_arr_n(meta_, id);
        const float * data = n ? (const float *) gguf_get_arr_data(meta_, id) : nullptr;
        return std::vector<float>(data, data + n);
    }

private:
    int64_t find(const std::string & key) const {
        const int64_t id = gguf_find_key(meta_, key.c_str());
        if (id < 0) refuse(key + " is missing");
        return id;
    }

    const gguf_context * meta_;
};

// The weight types the sparse ops are tested with (tests/test_sparse_ops.py).
bool sparse_ops_support(ggml_type t) {
    switch (t) {
        case GGML_TYPE_F32:  case GGML_TYPE_F16:  case GGML_TYPE_BF16:
        case GGML_TYPE_Q8_0: case GGML_TYPE_Q4_0: case GGML_TYPE_Q4_1: case GGML_TYPE_Q5_0: case GGML_TYPE_Q5_1:
        case GGML_TYPE_Q2_K: case GGML_TYPE_Q3_K: case GGML_TYPE_Q4_K: case GGML_TYPE_Q5_K: case GGML_TYPE_Q6_K:
            return true;
        default:
            return false;
    }
}

// The rows a SelectInfer layer holds, read from its tensors: n_static static neurons (0 when it has
// no ffn_down_static) and n_load loaded ones.
void layer_rows(const llama_layer & layer, int64_t & n_static, int64_t & n_load) {
    n_static = layer.ffn_down_static ? layer.ffn_down_static->ne[0] : 0;
    n_load = n_static + (layer.ffn_down_t ? layer.ffn_down_t->ne[1] : 0);
}

// A SelectInfer layer's FFN tensors against the assumptions of the sparse ops (format_version 2):
// gate and up [n_embd, n_static] with the static rows (every loaded row when n_static = 0), then
// ffn_gate_dyn and ffn_up_dyn [n_embd, n_load - n_static]; ffn_down_static [n_static, n_embd] in
// upstream's layout; ffn_down_t [n_embd, n_load - n_static], one row per dynamic neuron.
void check_layer(const llama_layer & layer, int il, int64_t n_embd, int64_t n_static, int64_t n_load,
                 int64_t n_original) {
    const std::string blk = "blk." + std::to_string(il) + ".";
    if (n_load < 1 || n_load > n_original) {
        refuse(blk + "ffn_down_static and ffn_down_t hold " + std::to_string(n_load) + " neurons, outside [1, " +
               kOriginalN + " = " + std::to_string(n_original) + "]");
    }
    const int64_t n_gate = n_static > 0 ? n_static : n_load;
    using Part = std::tuple<const char *, const ggml_tensor *, int64_t, int64_t>;  // name, tensor, ne[0], ne[1]
    for (const auto & [name, t, ne0, ne1] : {Part{"ffn_gate", layer.ffn_gate, n_embd, n_gate},
                                             Part{"ffn_up", layer.ffn_up, n_embd, n_gate},
                                             Part{"ffn_gate_dyn", layer.ffn_gate_dyn, n_embd, n_load - n_gate},
                                             Part{"ffn_up_dyn", layer.ffn_up_dyn, n_embd, n_load - n_gate},
                                             Part{"ffn_down_static", layer.ffn_down_static, n_static, n_embd},
                                             Part{"ffn_down_t", layer.ffn_down_t, n_embd, n_load - n_static}}) {
        if ((ne0 == 0 || ne1 == 0) && !t) continue;  // a part without rows
        if (!t) refuse(blk + name + " is missing");
        if (t->ne[0] != ne0 || t->ne[1] != ne1 || t->ne[2] != 1 || t->ne[3] != 1) {
            refuse(blk + name + " is not [" + std::to_string(ne0) + ", " + std::to_string(ne1) + "]");
        }
        if (!sparse_ops_support(t->type)) {
            std::string type = ggml_type_name(t->type);
            std::transform(type.begin(), type.end(), type.begin(), ::toupper);
            refuse(blk + name + " is " + type +
                   ", a type the sparse kernels do not compute (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K..Q6_K)");
        }
    }
    // the hook replaces build_ffn for this layer: SwiGLU with no bias, scale or dense down projection
    for (const auto & [name, t] : {std::pair<const char *, const ggml_tensor *>{"ffn_gate.bias", layer.ffn_gate_b},
                                   {"ffn_up.bias", layer.ffn_up_b}, {"ffn_down.bias", layer.ffn_down_b},
                                   {"ffn_gate scale", layer.ffn_gate_s}, {"ffn_up scale", layer.ffn_up_s},
                                   {"ffn_down scale", layer.ffn_down_s}, {"ffn_down", layer.ffn_down}}) {
        if (t) refuse(blk + name + " is present: a SelectInfer layer's FFN is computed without it");
    }
}

void check_neuron_ids(const Metadata & m, int il, int64_t n_load, int64_t n_original) {
    const std::string key = layer_key(kNeuronIds, il);
    const std::vector<int64_t> ids = m.integers(key);
    if ((int64_t) ids.size() != n_load) {
        refuse(key + " has " + std::to_string(ids.size()) + " ids for the " + std::to_string(n_load) +
               " neurons of layer " + std::to_string(il));
    }
    std::vector<bool> seen(n_original, false);
    for (int64_t id : ids) {
        if (id < 0 || id >= n_original) {
            refuse(key + " holds neuron " + std::to_string(id) + ", outside [0, " + std::to_string(n_original) + ")");
        }
        if (seen[id]) refuse(key + " holds neuron " + std::to_string(id) + " twice");
        seen[id] = true;
    }
}

// A layer's neuron shares (layer_budgets.h): one per loaded neuron, finite, in [0, 1], largest
// first, summing to at most 1 (shares of the layer's mass, unloaded neurons included).
std::vector<float> read_neuron_shares(const Metadata & m, int il, int64_t n_load) {
    const std::string key = layer_key(kNeuronShares, il);
    std::vector<float> shares = m.floats(key);
    if ((int64_t) shares.size() != n_load) {
        refuse(key + " has " + std::to_string(shares.size()) + " shares for the " + std::to_string(n_load) +
               " neurons of layer " + std::to_string(il));
    }
    double sum = 0;
    for (size_t i = 0; i < shares.size(); ++i) {
        const float v = shares[i];
        if (!std::isfinite(v) || v < 0.0f || v > 1.0f) refuse(key + " holds " + std::to_string(v) + ", not a share in [0, 1]");
        if (i > 0 && v > shares[i - 1]) refuse(key + " is not in decreasing order");
        sum += v;
    }
    if (sum > 1.0 + 1e-3) refuse(key + " sums to " + std::to_string(sum) + ", more than the layer's whole mass");
    return shares;
}

// One finite value per loaded neuron under `key` (and >= 0 where `non_negative`).
std::vector<float> read_per_neuron(const Metadata & m, const std::string & key, int il, int64_t n_load,
                                   bool non_negative, const char * what) {
    std::vector<float> values = m.floats(key);
    if ((int64_t) values.size() != n_load) {
        refuse(key + " has " + std::to_string(values.size()) + " values for the " + std::to_string(n_load) +
               " neurons of layer " + std::to_string(il));
    }
    for (float v : values) {
        if (!std::isfinite(v) || (non_negative && v < 0.0f)) refuse(key + " holds " + std::to_string(v) + ", not a finite " + what);
    }
    return values;
}

// A layer's gate statistics (compensation.h): one root mean square (>= 0) and one slope per loaded
// neuron, and optionally the gate's and up's means (a gate's mean no larger than its root mean
// square) and up's root mean square (>= 0).
GateStats read_gate_stats(const Metadata & m, int il, int64_t n_load) {
    const std::string rms_key = layer_key(kGateRms, il), slope_key = layer_key(kUpSlope, il);
    const std::string gate_mean_key = layer_key(kGateMean, il), up_mean_key = layer_key(kUpMean, il);
    if (!m.has(slope_key)) refuse(rms_key + " is present but " + slope_key + " is not");
    GateStats stats{read_per_neuron(m, rms_key, il, n_load, true, "root mean square >= 0"),
                    read_per_neuron(m, slope_key, il, n_load, false, "slope"), {}, {}, {}};
    if (m.has(gate_mean_key) != m.has(up_mean_key)) {
        refuse(std::string(m.has(gate_mean_key) ? gate_mean_key : up_mean_key) + " is present but " +
               (m.has(gate_mean_key) ? up_mean_key : gate_mean_key) + " is not");
    }
    if (m.has(gate_mean_key)) {
        stats.gate_mean = read_per_neuron(m, gate_mean_key, il, n_load, false, "mean");
        stats.up_mean = read_per_neuron(m, up_mean_key, il, n_load, false, "mean");
        for (int64_t j = 0; j < n_load; ++j) {  // |E[g]| <= sqrt(E[g^2]), with float32 rounding's room
            if (std::fabs(stats.gate_mean[j]) > stats.gate_rms[j] * 1.001f + 1e-30f) {
                refuse(gate_mean_key + " holds " + std::to_string(stats.gate_mean[j]) + ", larger than the gate's root mean square " +
                       std::to_string(stats.gate_rms[j]) + " in " + rms_key);
            }
        }
    }
    const std::string up_rms_key = layer_key(kUpRms, il);
    if (m.has(up_rms_key)) stats.up_rms = read_per_neuron(m, up_rms_key, il, n_load, true, "root mean square >= 0");
    return stats;
}

}  // namespace

GateStats GateStats::from(size_t first) const {
    auto tail = [first](const std::vector<float> & v) {
        return v.empty() ? v : std::vector<float>(v.begin() + std::min(first, v.size()), v.end());
    };
    return {tail(gate_rms), tail(up_slope), tail(gate_mean), tail(up_mean), tail(up_rms)};
}

namespace {

// Optional per-layer keys come for every SelectInfer layer or for none.
template <typename Value>
void require_every_layer(const std::map<int, Value> & present, const std::map<int, int32_t> & n_load,
                         const char * prefix, const char * what) {
    if (present.empty()) return;
    for (const auto & [il, n] : n_load) {
        if (!present.count(il)) refuse(layer_key(prefix, il) + " is missing, but other layers have their " + what);
    }
}

}  // namespace

std::shared_ptr<const SiModelInfo> read_si_model_info(const llama_model & model, const llama_model_loader & loader) {
    const int n_layer = (int) model.layers.size();
    const Metadata m(loader.metadata);
    if (!m.has(kVersion)) {
        for (int il = 0; il < n_layer; ++il) {
            if (model.layers[il].ffn_down_t || model.layers[il].ffn_down_static) {
                refuse("blk." + std::to_string(il) + " is a SelectInfer layer without " + kVersion);
            }
        }
        return nullptr;  // a dense model
    }
    auto info = std::make_shared<SiModelInfo>();
    info->format_version = (uint32_t) m.integer(kVersion, 0, UINT32_MAX);
    if (info->format_version != kFormatVersion) {
        throw std::runtime_error(std::string(kVersion) + " = " + std::to_string(info->format_version) +
                                 ": this build of selectinfer reads version " + std::to_string(kFormatVersion) +
                                 "; convert the model again with this version's `selectinfer convert`");
    }
    switch (model.arch) {  // the architectures whose FFN the sparse ops compute
        case LLM_ARCH_LLAMA:
        case LLM_ARCH_QWEN2:  info->activation = GatedActivation::silu; break;
        case LLM_ARCH_GEMMA3: info->activation = GatedActivation::gelu; break;
        default:
            refuse(std::string("architecture ") + llm_arch_name(model.arch) +
                   " has no SelectInfer layers (llama, qwen2, gemma3)");
    }
    info->n_original   = (int32_t) m.integer(kOriginalN, 1, 1 << 24);
    info->load_ratio   = m.ratio(kLoadRatio, 0.0f, 1.0f);
    info->static_ratio = m.ratio(kStaticRatio, 0.0f, info->load_ratio);
    info->compute_ratio = m.ratio(kComputeRatio, info->static_ratio, info->load_ratio, /*optional=*/true);
    info->token_ratio  = m.ratio(kTokenRatio, 0.0f, 1.0f, /*optional=*/true);
    if (info->load_ratio <= 0.0f) refuse(std::string(kLoadRatio) + " must be > 0");
    if (info->token_ratio == 0.0f) refuse(std::string(kTokenRatio) + " must be > 0");
    const std::string strategy = m.text(kStrategy, /*optional=*/true);
    if (!strategy.empty()) {
        info->strategy = strategy_named(strategy);
        if (!info->strategy) {
            std::string shown;  // the file's bytes, printable ASCII only
            for (char c : strategy.substr(0, 40)) shown += (c >= 32 && c < 127) ? c : '?';
            refuse(std::string(kStrategy) + " = '" + shown + "' is not a strategy (" + kStrategyNames + ")");
        }
    }

    const std::vector<int64_t> layers = m.integers(kLayers);
    const std::vector<int64_t> statics = m.integers(kStaticCounts);
    if (layers.empty()) refuse(std::string(kLayers) + " is empty");
    if (statics.size() != layers.size()) {
        refuse(std::string(kStaticCounts) + " has " + std::to_string(statics.size()) + " entries for the " +
               std::to_string(layers.size()) + " layers of " + kLayers);
    }
    const int64_t static_count = m.has(kStaticCount) ? m.integer(kStaticCount, 0, info->n_original) : -1;
    for (size_t i = 0; i < layers.size(); ++i) {
        const int64_t il = layers[i];
        if (il < 0 || il >= n_layer) {
            refuse(std::string(kLayers) + " lists layer " + std::to_string(il) + " of a model with " +
                   std::to_string(n_layer) + " layers");
        }
        if (i > 0 && il <= layers[i - 1]) refuse(std::string(kLayers) + " is not strictly increasing");
        const llama_layer & layer = model.layers[il];
        if (!layer.ffn_down_t && !layer.ffn_down_static) {
            refuse(std::string(kLayers) + " lists layer " + std::to_string(il) + " but blk." + std::to_string(il) +
                   " has neither ffn_down_static nor ffn_down_t");
        }
        int64_t n_static, n_load;
        layer_rows(layer, n_static, n_load);
        check_layer(layer, (int) il, model.hparams.n_embd, n_static, n_load, info->n_original);
        if (statics[i] != n_static || (static_count >= 0 && statics[i] != static_count)) {
            refuse(std::string(kStaticCounts) + " gives layer " + std::to_string(il) + " " + std::to_string(statics[i]) +
                   " static neurons (blk." + std::to_string(il) + ".ffn_down_static holds " + std::to_string(n_static) +
                   (static_count >= 0 ? ", " + std::string(kStaticCount) + " = " + std::to_string(static_count) : "") + ")");
        }
        check_neuron_ids(m, (int) il, n_load, info->n_original);
        if (m.has(layer_key(kNeuronShares, (int) il))) {
            info->neuron_shares[(int) il] = read_neuron_shares(m, (int) il, n_load);
        }
        if (m.has(layer_key(kGateRms, (int) il))) {
            info->gate_stats[(int) il] = read_gate_stats(m, (int) il, n_load);
        } else {
            for (const char * key : {kUpSlope, kGateMean, kUpMean, kUpRms}) {
                if (m.has(layer_key(key, (int) il))) {
                    refuse(layer_key(key, (int) il) + " is present but " + layer_key(kGateRms, (int) il) + " is not");
                }
            }
        }
        info->n_load[(int) il] = (int32_t) n_load;
        info->n_static[(int) il] = (int32_t) n_static;
    }
    require_every_layer(info->neuron_shares, info->n_load, kNeuronShares, "shares");
    require_every_layer(info->gate_stats, info->n_load, kGateRms, "gate statistics");
    std::map<int, bool> with_means;
    for (const auto & [il, stats] : info->gate_stats) {
        if (!stats.gate_mean.empty()) with_means[il] = true;
    }
    require_every_layer(with_means, info->n_load, kGateMean, "gate means");
    std::map<int, bool> with_up_rms;
    for (const auto & [il, stats] : info->gate_stats) {
        if (!stats.up_rms.empty()) with_up_rms[il] = true;
    }
    require_every_layer(with_up_rms, info->n_load, kUpRms, "up root mean squares");
    for (int il = 0; il < n_layer; ++il) {
        if ((model.layers[il].ffn_down_t || model.layers[il].ffn_down_static) && !info->n_load.count(il)) {
            refuse("blk." + std::to_string(il) + " is a SelectInfer layer (ffn_down_static, ffn_down_t) but layer " +
                   std::to_string(il) + " is not in " + kLayers);
        }
    }
    return info;
}

namespace {

// The loader's view of tensor `name` as two: rows [0, n_first) under its own name, the rest
// (when there are any) as `rest_name`, at the same file bytes.
void split_rows(llama_model_loader & loader, const std::string & name, const std::string & rest_name, int64_t n_first,
                ggml_context * ctx) {
    llama_model_loader::llama_tensor_weight & whole = loader.weights_map.at(name);
    ggml_tensor * t = whole.tensor;
    const int64_t n_rest = t->ne[1] - n_first;
    if (n_rest > 0) {
        ggml_tensor * rest = ggml_new_tensor_2d(ctx, t->type, t->ne[0], n_rest);
        ggml_set_name(rest, rest_name.c_str());
        llama_model_loader::llama_tensor_weight w = whole;
        w.tensor = rest;
        w.offs = whole.offs + (size_t) n_first * t->nb[1];
        loader.weights_map.emplace(rest_name, w);
        loader.n_tensors++;
    }
    t->ne[1] = n_first;
    t->nb[2] = t->nb[1] * t->ne[1];
    t->nb[3] = t->nb[2] * t->ne[2];
}

// n_static of layer il from its ffn_down_static ([n_static, n_embd]), or 0.
int64_t static_rows_in_file(const llama_model_loader & loader, int il) {
    const ggml_tensor * t = loader.get_tensor_meta(("blk." + std::to_string(il) + ".ffn_down_static.weight").c_str());
    return t ? t->ne[0] : 0;
}

}  // namespace

void split_static_rows(llama_model_loader & loader) {
    std::vector<int> layers;
    for (const auto & [name, w] : loader.weights_map) {
        int il = -1, end = 0;
        if (std::sscanf(name.c_str(), "blk.%d.ffn_down_static.weight%n", &il, &end) == 1 && end == (int) name.size() &&
            il >= 0) {
            layers.push_back(il);
        }
    }
    ggml_context * ctx = nullptr;
    for (int il : layers) {
        const int64_t n_static = static_rows_in_file(loader, il);
        const std::string blk = "blk." + std::to_string(il) + ".";
        bool fits = n_static > 0;
        for (const char * kind : {"ffn_gate", "ffn_up"}) {
            const ggml_tensor * t = loader.get_tensor_meta((blk + kind + ".weight").c_str());
            fits = fits && t && ggml_n_dims(t) == 2 && t->ne[1] >= n_static &&
                   !loader.get_tensor_meta((blk + kind + "_dyn.weight").c_str());
        }
        if (!fits) continue;  // created whole, and refused: its shape disagrees
        if (!ctx) {  // the meta tensors of the dynamic rows, freed with the loader's own
            ggml_init_params params = {2 * layers.size() * ggml_tensor_overhead(), nullptr, true};
            ctx = ggml_init(params);
            if (!ctx) throw std::runtime_error("out of memory splitting SelectInfer tensors");
            loader.contexts.emplace_back(ctx);
        }
        for (const char * kind : {"ffn_gate", "ffn_up"}) {
            split_rows(loader, blk + kind + ".weight", blk + kind + "_dyn.weight", n_static, ctx);
        }
        loader.selectinfer_static_rows[il] = n_static;
    }
}

namespace {

// The optional low-rank predictor of the gathered gate rows (the predicted strategy): both tensors
// or neither, the rank taken from the file.
void create_gate_predictor(llama_model_base & model, llama_layer & layer, int il, int64_t n_embd, int64_t n_gathered) {
    const llama_model_loader & loader = *model.ml;
    const std::string blk = "blk." + std::to_string(il) + ".";
    const ggml_tensor * pred_in = loader.get_tensor_meta((blk + "ffn_gate_pred_in.weight").c_str());
    const ggml_tensor * pred_out = loader.get_tensor_meta((blk + "ffn_gate_pred_out.weight").c_str());
    if (!pred_in && !pred_out) return;
    if (!pred_in || !pred_out || ggml_n_dims(pred_in) != 2 || n_gathered == 0) {
        refuse(blk + "ffn_gate_pred_in and ffn_gate_pred_out: a gate predictor needs both, 2-D, over gathered rows");
    }
    const int64_t rank = pred_in->ne[1];
    const auto & tn = model.tn;
    layer.ffn_gate_pred_in = model.create_tensor(tn(LLM_TENSOR_FFN_GATE_PRED_IN, "weight", il), {n_embd, rank}, 0);
    layer.ffn_gate_pred_out = model.create_tensor(tn(LLM_TENSOR_FFN_GATE_PRED_OUT, "weight", il), {rank, n_gathered}, 0);
}

}  // namespace

bool create_ffn_tensors(llama_model_base & model, llama_layer & layer, int il, int64_t n_embd, int64_t n_ff,
                        GatheredLoad load) {
    const llama_model_loader & loader = *model.ml;
    const std::string blk = "blk." + std::to_string(il) + ".";
    const ggml_tensor * down_t = loader.get_tensor_meta((blk + "ffn_down_t.weight").c_str());
    const int64_t n_static = static_rows_in_file(loader, il);
    if (!down_t && n_static == 0) return false;  // a dense layer
    const int64_t n_dynamic = down_t ? down_t->ne[1] : 0;
    if (n_static + n_dynamic != n_ff) {
        refuse(blk + "ffn_down_static and ffn_down_t hold " + std::to_string(n_static) + " + " +
               std::to_string(n_dynamic) + " neurons, but feed_forward_length gives the layer " + std::to_string(n_ff));
    }
    const auto & tn = model.tn;
    const int optional = model.TENSOR_NOT_REQUIRED;
    const bool gate_whole = load != GatheredLoad::rows, up_whole = load == GatheredLoad::dense;
    if (loader.selectinfer_static_rows.count(il)) {  // upstream's matmul kinds: ggml may repack them
        layer.ffn_gate = model.create_tensor(tn(LLM_TENSOR_FFN_GATE, "weight", il), {n_embd, n_static}, 0);
        layer.ffn_up   = model.create_tensor(tn(LLM_TENSOR_FFN_UP, "weight", il), {n_embd, n_static}, 0);
        layer.ffn_down_static = model.create_tensor(tn(LLM_TENSOR_FFN_DOWN_STATIC, "weight", il), {n_static, n_embd}, 0);
        if (n_dynamic > 0) {
            const auto gate_kind = gate_whole ? LLM_TENSOR_FFN_GATE_DYN_DENSE : LLM_TENSOR_FFN_GATE_DYN;
            const auto up_kind = up_whole ? LLM_TENSOR_FFN_UP_DYN_DENSE : LLM_TENSOR_FFN_UP_DYN;
            layer.ffn_gate_dyn = model.create_tensor(tn(gate_kind, "weight", il), {n_embd, n_dynamic}, 0);
            layer.ffn_up_dyn   = model.create_tensor(tn(up_kind, "weight", il), {n_embd, n_dynamic}, 0);
        }
    } else {  // every row gathered, or a file the checks after the load refuse
        const auto gate_kind = gate_whole ? LLM_TENSOR_FFN_GATE : LLM_TENSOR_FFN_GATE_ROWS;
        const auto up_kind = up_whole ? LLM_TENSOR_FFN_UP : LLM_TENSOR_FFN_UP_ROWS;
        layer.ffn_gate = model.create_tensor(tn(gate_kind, "weight", il), {n_embd, n_ff}, 0);
        layer.ffn_up   = model.create_tensor(tn(up_kind, "weight", il), {n_embd, n_ff}, 0);
        if (n_static > 0) {
            layer.ffn_down_static = model.create_tensor(tn(LLM_TENSOR_FFN_DOWN_STATIC, "weight", il), {n_static, n_embd}, 0);
        }
    }
    if (down_t) layer.ffn_down_t = model.create_tensor(tn(LLM_TENSOR_FFN_DOWN_T, "weight", il), {n_embd, n_dynamic}, 0);
    create_gate_predictor(model, layer, il, n_embd, n_dynamic);
    // present only in a broken file: refused after the load
    layer.ffn_down = model.create_tensor(tn(LLM_TENSOR_FFN_DOWN, "weight", il), {n_ff, n_embd}, optional);
    return true;
}

std::optional<Strategy> file_strategy(const llama_model_loader & loader) {
    const int64_t key = gguf_find_key(loader.metadata, kStrategy);
    if (key < 0 || gguf_get_kv_type(loader.metadata, key) != GGUF_TYPE_STRING) return std::nullopt;
    return strategy_named(gguf_get_val_str(loader.metadata, key));
}

const SiModelInfo * si_model_info(const llama_model & model) {
    return static_cast<const SiModelInfo *>(model.selectinfer.get());
}

}  // namespace selectinfer
