// The SelectInfer GGUF's `selectinfer.*` metadata keys, its version and the defaults it writes: one
// table. The loader reads it (si_gguf.cpp); the converter, bench, eval and the tests take it from
// Python as selectinfer._native.FORMAT (bindings.cpp). docs/format.md describes each key.
#pragma once

#include <cstdint>

namespace selectinfer {

constexpr uint32_t kFormatVersion = 2;  // selectinfer.format_version this build reads and writes

// phi and alpha where neither the file nor anyone else says, and what the converter writes into a
// file (phi within [delta, gamma]): the method's reference values.
constexpr double kDefaultComputeRatio = 0.4;  // phi: neurons a decode step computes, of the original N
constexpr double kDefaultTokenRatio   = 0.2;  // alpha: a prompt token's top share of neurons that vote

// The architectures whose FFN the sparse ops compute (a gated FFN without biases): the loader's
// switch on llama.cpp's architecture enum (si_gguf.cpp) takes the same three.
constexpr const char * kArchitectures[] = {"llama", "qwen2", "gemma3"};

enum class KeyType { u32, f32, str, i32_array, f32_array };

// A key of the format. A per-layer key's name is a prefix: `name` + the layer's index.
struct FormatKey {
    const char * id;         // the short name code uses (FORMAT["keys"][id] in Python)
    const char * name;       // the GGUF key
    KeyType      type;       // as the converter writes it (the loader takes any integer type for integers)
    bool         per_layer;
    bool         required;   // in every SelectInfer file (optional keys: see `meaning`)
    const char * meaning;
};

namespace key {
constexpr FormatKey format_version{"format_version", "selectinfer.format_version", KeyType::u32, false, true,
                                   "the format's version; a file of another version is refused"};
constexpr FormatKey original_n{"original_n", "selectinfer.original_feed_forward_length", KeyType::u32, false, true,
                               "N, the source model's FFN width; every ratio is a fraction of it"};
constexpr FormatKey load_ratio{"load_ratio", "selectinfer.load_ratio", KeyType::f32, false, true,
                               "gamma, the share of N each SelectInfer layer holds"};
constexpr FormatKey static_ratio{"static_ratio", "selectinfer.static_ratio", KeyType::f32, false, true,
                                 "delta, the share of N computed at every step (the static block)"};
constexpr FormatKey compute_ratio{"compute_ratio", "selectinfer.compute_ratio", KeyType::f32, false, false,
                                  "phi the file suggests, in [delta, gamma]; absent: the engine's default"};
constexpr FormatKey token_ratio{"token_ratio", "selectinfer.token_ratio", KeyType::f32, false, false,
                                "alpha the file suggests, in (0, 1]; absent: the engine's default"};
constexpr FormatKey strategy{"strategy", "selectinfer.strategy", KeyType::str, false, false,
                             "the selection strategy the file suggests; absent or empty: frequency"};
constexpr FormatKey static_count{"static_count", "selectinfer.static_count", KeyType::u32, false, false,
                                 "static neurons per layer when every layer has the same count"};
constexpr FormatKey layers{"layers", "selectinfer.layers", KeyType::i32_array, false, true,
                           "the SelectInfer layers, strictly increasing"};
constexpr FormatKey static_counts{"static_counts", "selectinfer.static_counts", KeyType::i32_array, false, true,
                                  "each SelectInfer layer's static neurons (rows 0..n-1 of its gate and up)"};
constexpr FormatKey neuron_ids{"neuron_ids", "selectinfer.neuron_ids.", KeyType::i32_array, true, true,
                               "each loaded neuron's index in the source layer, static neurons first"};
constexpr FormatKey neuron_shares{"neuron_shares", "selectinfer.neuron_shares.", KeyType::f32_array, true, false,
                                  "each loaded neuron's share of the profile's mass (profile-ranked files; "
                                  "profile layer budgets)"};
constexpr FormatKey gate_rms{"gate_rms", "selectinfer.gate_rms.", KeyType::f32_array, true, false,
                             "sqrt(E[g^2]) per loaded neuron (profiles with input moments; compensation)"};
constexpr FormatKey up_slope{"up_slope", "selectinfer.up_slope.", KeyType::f32_array, true, false,
                             "E[g u] / E[g^2] per loaded neuron, with gate_rms"};
constexpr FormatKey gate_mean{"gate_mean", "selectinfer.gate_mean.", KeyType::f32_array, true, false,
                              "E[g] per loaded neuron (profiles with input means), with gate_rms"};
constexpr FormatKey up_mean{"up_mean", "selectinfer.up_mean.", KeyType::f32_array, true, false,
                            "E[u] per loaded neuron, with gate_mean"};
constexpr FormatKey up_rms{"up_rms", "selectinfer.up_rms.", KeyType::f32_array, true, false,
                           "sqrt(E[u^2]) per loaded neuron, with gate_rms: per-step strategies weigh |act(g)| by it"};
constexpr FormatKey predictor_rank{"predictor_rank", "selectinfer.predictor_rank", KeyType::u32, false, false,
                                   "R, the gate predictor's rank (files with a predictor)"};
// Provenance, written by the converter and shown by `selectinfer inspect`; the loader ignores them.
constexpr FormatKey task{"task", "selectinfer.task", KeyType::str, false, false, "the profile's task"};
constexpr FormatKey ranking{"ranking", "selectinfer.ranking", KeyType::str, false, false,
                            "how neurons were ranked (profile or random)"};
constexpr FormatKey seed{"seed", "selectinfer.seed", KeyType::u32, false, false, "the random ranking's seed"};
constexpr FormatKey source_digest{"source_digest", "selectinfer.source_digest", KeyType::str, false, false,
                                  "sha256 of the source GGUF"};
constexpr FormatKey profile_digest{"profile_digest", "selectinfer.profile_digest", KeyType::str, false, false,
                                   "sha256 of the profile; empty for a random ranking"};
}  // namespace key

constexpr FormatKey kFormatKeys[] = {
    key::format_version, key::original_n, key::load_ratio, key::static_ratio, key::compute_ratio,
    key::token_ratio,    key::strategy,   key::static_count, key::layers,     key::static_counts,
    key::neuron_ids,     key::neuron_shares, key::gate_rms, key::up_slope,    key::gate_mean,
    key::up_mean,        key::up_rms,     key::predictor_rank, key::task,     key::ranking,
    key::seed,           key::source_digest, key::profile_digest,
};

constexpr const char * key_type_name(KeyType t) {
    switch (t) {
        case KeyType::u32:       return "u32";
        case KeyType::f32:       return "f32";
        case KeyType::str:       return "str";
        case KeyType::i32_array: return "arr_i32";
        case KeyType::f32_array: return "arr_f32";
    }
    return "?";
}

}  // namespace selectinfer
