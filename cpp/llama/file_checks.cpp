// Compiled into libllama. The sites named in aborts_in are those of the pinned llama.cpp
// (llama-cpp-python 0.3.36): where the value would reach a GGML_ASSERT, a division by zero or a
// kernel without an implementation.
#include "file_checks.h"

#include "ggml.h"
#include "gguf.h"
#include "gguf_values.h"

#include <cmath>
#include <cstdio>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>

namespace selectinfer {

namespace {

// The values of one file, read without trusting their types: a key of an unexpected type reads as
// absent here (llama.cpp refuses it with an error of its own when it reads it).
class FileValues {
public:
    FileValues(const gguf_context * meta, const std::vector<FileTensor> & tensors)
        : meta_(meta), tensors_(tensors), arch_(text("general.architecture").value_or("")) {}

    const std::vector<FileTensor> & tensors() const { return tensors_; }

    const std::string & arch() const { return arch_; }
    bool arch_is(const char * name) const { return arch_ == name; }
    // the architectures whose layers this project computes (si_format.h's kArchitectures)
    bool one_of_ours() const { return arch_is("llama") || arch_is("qwen2") || arch_is("gemma3"); }
    std::string key(const char * suffix) const { return arch_ + "." + suffix; }

    std::optional<int64_t> integer(const std::string & key) const {
        const int64_t id = gguf_find_key(meta_, key.c_str());
        if (id < 0 || !is_integer(gguf_get_kv_type(meta_, id))) return std::nullopt;
        return integer_at(gguf_get_val_data(meta_, id), gguf_get_kv_type(meta_, id), 0);
    }

    // A per-layer value: a scalar as one value, or each element of an integer array; empty: absent.
    std::vector<int64_t> integers(const std::string & key) const {
        const int64_t id = gguf_find_key(meta_, key.c_str());
        if (id < 0) return {};
        const gguf_type t = gguf_get_kv_type(meta_, id);
        if (is_integer(t)) return {integer_at(gguf_get_val_data(meta_, id), t, 0)};
        if (t != GGUF_TYPE_ARRAY || !is_integer(gguf_get_arr_type(meta_, id))) return {};
        std::vector<int64_t> out(gguf_get_arr_n(meta_, id));
        const void * data = out.empty() ? nullptr : gguf_get_arr_data(meta_, id);
        for (size_t i = 0; i < out.size(); ++i) out[i] = integer_at(data, gguf_get_arr_type(meta_, id), i);
        return out;
    }

    std::optional<double> number(const std::string & key) const {
        const int64_t id = gguf_find_key(meta_, key.c_str());
        if (id < 0) return std::nullopt;
        if (gguf_get_kv_type(meta_, id) == GGUF_TYPE_FLOAT32) return gguf_get_val_f32(meta_, id);
        if (gguf_get_kv_type(meta_, id) == GGUF_TYPE_FLOAT64) return gguf_get_val_f64(meta_, id);
        return std::nullopt;
    }

    std::optional<std::string> text(const std::string & key) const {
        const int64_t id = gguf_find_key(meta_, key.c_str());
        if (id < 0 || gguf_get_kv_type(meta_, id) != GGUF_TYPE_STRING) return std::nullopt;
        return std::string(gguf_get_val_str(meta_, id));
    }

    std::optional<bool> flag(const std::string & key) const {
        const int64_t id = gguf_find_key(meta_, key.c_str());
        if (id < 0 || gguf_get_kv_type(meta_, id) != GGUF_TYPE_BOOL) return std::nullopt;
        return gguf_get_val_bool(meta_, id);
    }

    // A bool array's elements; nullopt where the key is absent or not a bool array.
    std::optional<std::vector<bool>> flags(const std::string & key) const {
        const int64_t id = gguf_find_key(meta_, key.c_str());
        if (id < 0 || gguf_get_kv_type(meta_, id) != GGUF_TYPE_ARRAY || gguf_get_arr_type(meta_, id) != GGUF_TYPE_BOOL) {
            return std::nullopt;
        }
        const size_t n = gguf_get_arr_n(meta_, id);
        const int8_t * data = n ? (const int8_t *) gguf_get_arr_data(meta_, id) : nullptr;
        std::vector<bool> out(n);
        for (size_t i = 0; i < n; ++i) out[i] = data[i] != 0;
        return out;
    }

    // The number of tokens of the tokenizer (0 where absent or not a string array).
    int64_t n_tokens() const {
        const int64_t id = gguf_find_key(meta_, "tokenizer.ggml.tokens");
        if (id < 0 || gguf_get_kv_type(meta_, id) != GGUF_TYPE_ARRAY || gguf_get_arr_type(meta_, id) != GGUF_TYPE_STRING) {
            return 0;
        }
        return (int64_t) gguf_get_arr_n(meta_, id);
    }

    // The tokenizer's token list (empty where absent or not a string array).
    std::vector<std::string> tokens() const {
        const int64_t id = gguf_find_key(meta_, "tokenizer.ggml.tokens");
        if (id < 0 || gguf_get_kv_type(meta_, id) != GGUF_TYPE_ARRAY || gguf_get_arr_type(meta_, id) != GGUF_TYPE_STRING) {
            return {};
        }
        std::vector<std::string> out(gguf_get_arr_n(meta_, id));
        for (size_t i = 0; i < out.size(); ++i) out[i] = gguf_get_arr_str(meta_, id, i);
        return out;
    }

    // The key/value head width: attention.key_length, else embedding_length / head_count (0: unknown).
    int64_t head_dim() const {
        if (auto k = integer(key("attention.key_length"))) return *k;
        const auto heads = integers(key("attention.head_count"));
        const auto n_embd = integer(key("embedding_length"));
        return n_embd && !heads.empty() && heads[0] > 0 ? *n_embd / heads[0] : 0;
    }

    const gguf_context * meta() const { return meta_; }

private:
    const gguf_context * meta_;
    const std::vector<FileTensor> & tensors_;
    std::string arch_;
};

using Broken = std::optional<std::string>;  // "key = value" where the file breaks a rule

std::string show(const std::string & key, int64_t v) { return key + " = " + std::to_string(v); }
std::string show(const std::string & key, double v) {
    char buf[64];
    std::snprintf(buf, sizeof buf, " = %g", v);
    return key + buf;
}
std::string show(const std::string & key, const std::string & v) { return key + " = \"" + v.substr(0, 64) + "\""; }

// The first element of a per-layer value outside [lo, hi].
Broken outside(const FileValues & f, const char * suffix, int64_t lo, int64_t hi) {
    for (int64_t v : f.integers(f.key(suffix))) {
        if (v < lo || v > hi) return show(f.key(suffix), v);
    }
    return std::nullopt;
}

// A type a weight matrix can have: float, or a quantization with a conversion to float and a dot
// product (Q8_1 and Q8_K only quantize activations: ggml's CPU backend has no dot product for them
// as weights). Told from the type alone, so that libllama needs no CPU backend symbol (a build
// may load its CPU backend at run time).
bool is_weight_type(ggml_type type) {
    if (type == GGML_TYPE_F32 || type == GGML_TYPE_F16 || type == GGML_TYPE_BF16) return true;
    return ggml_is_quantized(type) && ggml_get_type_traits(type)->to_float && type != GGML_TYPE_Q8_1 &&
           type != GGML_TYPE_Q8_K;
}

struct Rule {
    FileCheck check;
    std::function<Broken(const FileValues &)> broken;
};

const std::vector<Rule> & rules() {
    static const std::vector<Rule> table = {
        {{"{arch}.block_count", "1 to 512", "llama-model.cpp load_hparams: GGML_ASSERT(n_layer_all > 0 && <= LLAMA_MAX_LAYERS)"},
         [](const FileValues & f) { return outside(f, "block_count", 1, 512); }},
        {{"{arch}.nextn_predict_layers", "absent, or below block_count (0 for llama, qwen2, gemma3)",
          "llama-model.cpp load_hparams: GGML_ASSERT(n_layer_nextn <= n_layer_all); gemma3's memory: no layer left"},
         [](const FileValues & f) -> Broken {
             const auto n = f.integer(f.key("nextn_predict_layers"));
             const int64_t hi = f.one_of_ours() ? 0 : f.integer(f.key("block_count")).value_or(1) - 1;
             return n && (*n < 0 || *n > hi) ? Broken(show(f.key("nextn_predict_layers"), *n)) : std::nullopt;
         }},
        {{"{arch}.expert_count", "0 to 1024 (0 for llama, qwen2, gemma3 files without experts)",
          "llama-model.cpp load_hparams: GGML_ASSERT(n_expert <= LLAMA_MAX_EXPERTS)"},
         [](const FileValues & f) { return outside(f, "expert_count", 0, 1024); }},
        {{"{arch}.expert_used_count", "0 without experts, else 1 to expert_count",
          "llama-model.cpp load_hparams: GGML_ASSERT(n_expert_used <= n_expert), (n_expert_used > 0) with experts"},
         [](const FileValues & f) -> Broken {
             const int64_t n_expert = f.integer(f.key("expert_count")).value_or(0);
             if (n_expert > 0 && f.integers(f.key("expert_used_count")).empty()) {
                 return f.key("expert_used_count") + " is missing for " + std::to_string(n_expert) + " experts";
             }
             return n_expert > 0 ? outside(f, "expert_used_count", 1, n_expert) : outside(f, "expert_used_count", 0, 0);
         }},
        {{"{arch}.expert_group_count {arch}.expert_group_used_count",
          "0 without experts; else below expert_count and dividing it, with 1 to groups - 1 used groups",
          "llama-model.cpp load_hparams: the GGML_ASSERTs on n_expert_groups and n_group_used"},
         [](const FileValues & f) -> Broken {
             const int64_t n_expert = f.integer(f.key("expert_count")).value_or(0);
             const int64_t groups = f.integer(f.key("expert_group_count")).value_or(0);
             const int64_t used = f.integer(f.key("expert_group_used_count")).value_or(0);
             if (groups < 0 || (n_expert == 0 && groups != 0) || (n_expert > 0 && groups >= n_expert) ||
                 (groups > 1 && n_expert % groups != 0)) {
                 return show(f.key("expert_group_count"), groups);
             }
             if (groups > 1 && (used < 1 || used >= groups)) return show(f.key("expert_group_used_count"), used);
             return std::nullopt;
         }},
        {{"{arch}.rope.scaling.type", "absent, none, linear, yarn or longrope",
          "llama-model.cpp load_hparams: GGML_ASSERT(rope_scaling_type_train != UNSPECIFIED)"},
         [](const FileValues & f) -> Broken {
             const auto t = f.text(f.key("rope.scaling.type"));
             return t && *t != "none" && *t != "linear" && *t != "yarn" && *t != "longrope"
                        ? Broken(show(f.key("rope.scaling.type"), *t)) : std::nullopt;
         }},
        {{"{arch}.attention.head_count {arch}.attention.head_count_kv",
          "1 to 1024 heads, the same in every layer of llama, qwen2 and gemma3, a whole number of query heads per "
          "key/value head",
          "ggml.c ggml_mul_mat / flash attention: division by head_count_kv, GGML_ASSERT on the head ratio"},
         [](const FileValues & f) -> Broken {
             const auto heads = f.integers(f.key("attention.head_count"));
             const auto kv = f.integers(f.key("attention.head_count_kv"));
             if (f.one_of_ours() && heads.empty()) return f.key("attention.head_count") + " is missing";
             if (auto b = outside(f, "attention.head_count", 1, 1024)) return b;
             if (auto b = outside(f, "attention.head_count_kv", 1, 1024)) return b;
             for (const auto * values : {&heads, &kv}) {
                 for (int64_t v : *values) {
                     if (f.one_of_ours() && v != values->front()) {
                         return show(f.key(values == &heads ? "attention.head_count" : "attention.head_count_kv"), v) +
                                " in one layer, " + std::to_string(values->front()) + " in the first";
                     }
                 }
             }
             if (!heads.empty() && !kv.empty() && heads[0] % kv[0] != 0) {
                 return show(f.key("attention.head_count_kv"), kv[0]) + " for " + std::to_string(heads[0]) + " heads";
             }
             return std::nullopt;
         }},
        {{"{arch}.embedding_length {arch}.attention.key_length {arch}.attention.value_length "
          "{arch}.attention.key_length_swa {arch}.attention.value_length_swa",
          "embedding_length 1 or more; a head width (key_length, else embedding_length / head_count, a whole "
          "number) even and 2 to 1024; value widths equal to it (llama, qwen2, gemma3)",
          "models/llama.cpp, qwen2.cpp: GGML_ASSERT(n_embd_head_v == n_embd_head_k); ggml.c reshape and set_rows"},
         [](const FileValues & f) -> Broken {
             if (auto b = outside(f, "embedding_length", 1, INT32_MAX)) return b;
             if (!f.one_of_ours()) return std::nullopt;
             const auto heads = f.integers(f.key("attention.head_count"));
             const auto n_embd = f.integer(f.key("embedding_length"));
             if (!f.integer(f.key("attention.key_length")) && n_embd && !heads.empty() && heads[0] > 0 &&
                 *n_embd % heads[0] != 0) {
                 return show(f.key("embedding_length"), *n_embd) + " for " + std::to_string(heads[0]) + " heads";
             }
             const int64_t head = f.head_dim();
             if (head != 0 && (head < 2 || head > 1024 || head % 2 != 0)) return show(f.key("attention.key_length"), head);
             for (const char * other : {"attention.value_length", "attention.key_length_swa", "attention.value_length_swa"}) {
                 const auto v = f.integer(f.key(other));
                 if (v && *v != head) return show(f.key(other), *v) + " for a head width of " + std::to_string(head);
             }
             return std::nullopt;
         }},
        {{"{arch}.rope.dimension_count {arch}.rope.dimension_count_swa",
          "the head width (llama, qwen2); even and at most the head width (gemma3)",
          "models/qwen2.cpp: GGML_ASSERT(n_embd_head == n_rot); ggml-cpu rope: GGML_ASSERT(n_dims <= ne0, even)"},
         [](const FileValues & f) -> Broken {
             if (!f.one_of_ours()) return std::nullopt;
             const int64_t head = f.head_dim();
             for (const char * suffix : {"rope.dimension_count", "rope.dimension_count_swa"}) {
                 const auto n = f.integer(f.key(suffix));
                 if (!n || head == 0) continue;
                 const bool ok = f.arch_is("gemma3") ? *n >= 0 && *n <= head && *n % 2 == 0 : *n == head;
                 if (!ok) return show(f.key(suffix), *n) + " for a head width of " + std::to_string(head);
             }
             return std::nullopt;
         }},
        {{"{arch}.embedding_length (qwen2)", "head_count times the head width",
          "ggml.c ggml_reshape_3d of Q in models/qwen2.cpp"},
         [](const FileValues & f) -> Broken {
             const auto n_embd = f.integer(f.key("embedding_length"));
             const auto heads = f.integers(f.key("attention.head_count"));
             if (!f.arch_is("qwen2") || !n_embd || heads.empty() || *n_embd == heads[0] * f.head_dim()) return std::nullopt;
             return show(f.key("embedding_length"), *n_embd) + " for " + std::to_string(heads[0]) + " heads of " +
                    std::to_string(f.head_dim());
         }},
        {{"{arch}.attention.layer_norm_rms_epsilon {arch}.attention.layer_norm_epsilon", "a finite number in [0, 1]",
          "ggml-cpu ops.cpp, ggml-cuda norm.cu: GGML_ASSERT(eps >= 0) at the first decode"},
         [](const FileValues & f) -> Broken {
             for (const char * suffix : {"attention.layer_norm_rms_epsilon", "attention.layer_norm_epsilon"}) {
                 const auto eps = f.number(f.key(suffix));
                 if (eps && !(std::isfinite(*eps) && *eps >= 0 && *eps <= 1)) return show(f.key(suffix), *eps);
             }
             return std::nullopt;
         }},
        {{"{arch}.attention.sliding_window {arch}.attention.sliding_window_pattern",
          "with a sliding window (gemma3), a pattern that gives at least one sliding-window layer: 0, 2 or more, "
          "or an array with a true value among the layers",
          "llama-model.cpp create_memory: GGML_ASSERT(swa_type == NONE || is_swa_any())"},
         [](const FileValues & f) -> Broken {
             const auto window = f.integer(f.key("attention.sliding_window"));
             if (!f.arch_is("gemma3") || !window || *window <= 0) return std::nullopt;
             const std::string key = f.key("attention.sliding_window_pattern");
             if (const auto pattern = f.flags(key)) {
                 const int64_t n_layer = f.integer(f.key("block_count")).value_or(0);
                 for (int64_t il = 0; il < n_layer && il < (int64_t) pattern->size(); ++il) {
                     if ((*pattern)[il]) return std::nullopt;
                 }
                 return key + " marks no layer";
             }
             const auto every = f.integer(key);
             return every && *every == 1 ? Broken(show(key, *every)) : std::nullopt;
         }},
        {{"{arch}.attention.causal", "absent or true", "llama-context.cpp decode: GGML_ASSERT on non-causal batches"},
         [](const FileValues & f) -> Broken {
             const auto causal = f.flag(f.key("attention.causal"));
             return causal && !*causal ? Broken(f.key("attention.causal") + " = false") : std::nullopt;
         }},
        {{"{arch}.pooling_type", "absent or 0 to 4", "llama-graph.cpp: GGML_ABORT on an unknown pooling type"},
         [](const FileValues & f) { return outside(f, "pooling_type", 0, 4); }},
        {{"tokenizer.ggml.tokens {arch}.vocab_size", "at least one token",
          "llama-model-loader.cpp: GGML_ASSERT(buf_mmap || cur->data) for an empty embedding"},
         [](const FileValues & f) -> Broken {
             if (gguf_find_key(f.meta(), "tokenizer.ggml.tokens") >= 0 && f.n_tokens() == 0) {
                 return std::string("tokenizer.ggml.tokens is empty");
             }
             return outside(f, "vocab_size", 1, INT32_MAX);
         }},
        {{"tokenizer.ggml.bos_token_id tokenizer.ggml.eos_token_id",
          "below the number of tokens where tokenizer.ggml.add_bos_token / add_eos_token is true",
          "llama-vocab.cpp tokenize: GGML_ASSERT(special_bos_id != LLAMA_TOKEN_NULL)"},
         [](const FileValues & f) -> Broken {
             const int64_t n_tokens = f.n_tokens();
             for (const char * which : {"bos", "eos"}) {
                 const std::string id_key = std::string("tokenizer.ggml.") + which + "_token_id";
                 if (!f.flag(std::string("tokenizer.ggml.add_") + which + "_token").value_or(false)) continue;
                 const auto id = f.integer(id_key);
                 if (!id) return id_key + " is missing while tokenizer.ggml.add_" + which + "_token is true";
                 if (*id < 0 || *id >= n_tokens) return show(id_key, *id) + " of " + std::to_string(n_tokens) + " tokens";
             }
             return std::nullopt;
         }},
        {{"tokenizer.ggml.model tokenizer.ggml.token_type tokenizer.ggml.tokens",
          "no byte tokens in a bert vocabulary; tokens of at most 4096 bytes in t5 and rwkv vocabularies",
          "llama-vocab.cpp: GGML_ABORT in token_to_byte; a trie recursion per byte of a token (stack)"},
         [](const FileValues & f) -> Broken {
             const auto model = f.text("tokenizer.ggml.model").value_or("");
             if (model == "bert") {
                 const auto types = f.integers("tokenizer.ggml.token_type");
                 for (size_t i = 0; i < types.size(); ++i) {
                     if (types[i] == 6) return "tokenizer.ggml.token_type[" + std::to_string(i) + "] = 6 (a byte) in a bert vocabulary";
                 }
             }
             if (model == "t5" || model == "rwkv") {
                 const auto tokens = f.tokens();
                 for (size_t i = 0; i < tokens.size(); ++i) {
                     if (tokens[i].size() > 4096) {
                         return "tokenizer.ggml.tokens[" + std::to_string(i) + "] of " + std::to_string(tokens[i].size()) + " bytes";
                     }
                 }
             }
             return std::nullopt;
         }},
        {{"tensor data offsets", "every tensor's data at a multiple of 32 bytes in the file (general.alignment 32 or more)",
          "ggml-backend.cpp: GGML_ASSERT on the alignment of a mapped buffer"},
         [](const FileValues & f) -> Broken {
             for (const FileTensor & t : f.tensors()) {
                 if (t.file_offset % 32 != 0) return std::string(ggml_get_name(t.tensor)) + " at byte " + std::to_string(t.file_offset);
             }
             return std::nullopt;
         }},
        {{"tensor sizes and types",
          "at least one element; vectors (norms, biases, scales) in F32; matrices in F32, F16, BF16 or a quantized "
          "type with a dot product (not Q8_1, Q8_K, nor an integer type)",
          "llama-model-loader.cpp: GGML_ASSERT(buf_mmap || data); ggml-cpu: binary ops on F32, a null vec_dot"},
         [](const FileValues & f) -> Broken {
             for (const FileTensor & t : f.tensors()) {
                 const std::string name = ggml_get_name(t.tensor);
                 if (ggml_nelements(t.tensor) == 0) return name + " has no elements";
                 const bool matrix = ggml_n_dims(t.tensor) >= 2;
                 if (matrix ? !is_weight_type(t.tensor->type) : t.tensor->type != GGML_TYPE_F32) {
                     return name + (matrix ? " (a matrix)" : " (a vector)") + " of type " + ggml_type_name(t.tensor->type);
                 }
             }
             return std::nullopt;
         }},
    };
    return table;
}

}  // namespace

const std::vector<FileCheck> & file_checks() {
    static const std::vector<FileCheck> checks = [] {
        std::vector<FileCheck> out;
        for (const Rule & r : rules()) out.push_back(r.check);
        return out;
    }();
    return checks;
}

void check_file_values(const gguf_context * meta, const std::vector<FileTensor> & tensors) {
    const FileValues file(meta, tensors);
    for (const Rule & rule : rules()) {
        if (const Broken broken = rule.broken(file)) {
            throw std::runtime_error(*broken + " (allowed: " + rule.check.allowed +
                                     "): the file is corrupted or not a model this build supports");
        }
    }
}

}  // namespace selectinfer
