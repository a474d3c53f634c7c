// selectinfer engine: one model, one context, one sequence.
//
// The single C++ entry point shared by the Python bindings (bindings.cpp) and the CLI
// (cli.cpp): loading with clear errors, tokenization, chat templates, prompt evaluation with
// KV-cache prefix reuse, sampling, log-probabilities and timing statistics.
#pragma once

#include "ffn_hook.h"
#include "model_tensors.h"
#include "neuron_selection.h"
#include "llama.h"

#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace selectinfer {

// A model file that is missing, not a GGUF, truncated or otherwise rejected by the loader.
struct ModelLoadError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// More tokens than the context holds.
struct ContextOverflowError : std::length_error {
    using std::length_error::length_error;
};

constexpr uint32_t kRandomSeed = LLAMA_DEFAULT_SEED;  // 0xFFFFFFFF: draw a fresh seed

struct ModelParams {
    std::string path;
    int32_t  n_ctx     = 2048;
    int32_t  n_batch   = 512;
    int32_t  n_threads = 0;     // 0: all hardware threads
    bool     use_mmap  = true;
    // let ggml repack weights for its faster CPU kernels (AMX on Xeons that have it, CPU_REPACK
    // for Q4_0/Q4_K/Q8_0 on AVX2): faster, but the repacked weights are a second copy in memory
    // beside the mapped file (llama.cpp's --no-repack turns it off)
    bool     repack    = true;
    // layers whose weights go to the GPU (llama.cpp's -ngl): 0 none, -1 all; a build without a
    // GPU backend keeps every layer on the CPU
    int32_t  n_gpu_layers = 0;
    int32_t  flash_attn = -1;   // -1 auto (llama.cpp's default), 0 off, 1 on
    bool     verbose   = false; // pass llama.cpp's log through to stderr
    bool     profile   = false; // accumulate FFN activation statistics (activation_stats.h)
    bool     profile_input_moments = false; // with profile: also each layer's FFN input sum of h h^T
    // selective computation of SelectInfer models (neuron_selection.h): what is set here
    // overrides the SELECTINFER_* environment, which overrides the file's defaults
    SelectionOverrides selection;
};

struct SamplingParams {
    float    temperature = 0.8f;  // <= 0: greedy
    int32_t  top_k       = 40;    // 0: disabled
    float    top_p       = 0.95f; // 1: disabled
    uint32_t seed        = kRandomSeed;
};

struct Stats {
    int64_t  n_prefill_tokens = 0;
    double   prefill_ms       = 0;
    int64_t  n_decode_tokens  = 0;
    double   decode_ms        = 0;
    uint64_t model_bytes      = 0;  // bytes of weights (llama_model_size)
    uint64_t rss_bytes        = 0;  // resident set size of this process now
    uint64_t peak_rss_bytes   = 0;  // and its high-water mark
};

// Profiling results since the last reset: per layer, sum over tokens of |a_n| for each neuron.
struct ActivationSums {
    std::vector<std::vector<float>> sums;  // [n_layer][n_ff(il)] (input moments: [n_layer][n_embd^2 + n_embd])
    int64_t n_tokens = 0;                  // tokens that passed through every layer
};

struct ChatMessage {
    std::string role;
    std::string content;
};

// llama.cpp's backends, initialized once per process (and, in a build whose backends are loaded
// at run time, loaded from the folder of this library); every entry point calls it.
void init_backends();

// The offset of the first byte of s that is not part of valid UTF-8, or npos where s is UTF-8.
size_t invalid_utf8_at(const std::string & s);

// Resident set size of this process (now, peak) in bytes, from /proc.
std::pair<uint64_t, uint64_t> process_rss_bytes();

// The buffer types ggml's CPU backend can repack weights into on this machine ("AMX" when the
// build has AMX kernels and the CPU and kernel allow them, "CPU_REPACK"), best first.
std::vector<std::string> cpu_extra_buffer_types();

// The compute devices of this build (ggml's backend registry), the CPU included.
struct DeviceInfo {
    std::string name, description, type;  // type: "CPU", "GPU", "IGPU" (integrated), "ACCEL"
    uint64_t memory_free_bytes = 0, memory_total_bytes = 0;
};
std::vector<DeviceInfo> compute_devices();

// Writes `output_path` with the weights of `input_path` converted to `type_name` (F32, F16,
// BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K_M, Q4_K_M, Q5_K_M, Q6_K) with llama.cpp's
// quantizer; the output appears only when complete.
void quantize_model(const std::string & input_path, const std::string & output_path, const std::string & type_name,
                    int32_t n_threads = 0);

// The type names quantize_model accepts.
std::vector<std::string> quantize_type_names();

// Checks a sampling configuration; throws std::invalid_argument naming the bad value.
void validate(const SamplingParams & params);

class Engine {
public:
    explicit Engine(const ModelParams & params);
    ~Engine();
    Engine(const Engine &) = delete;
    Engine & operator=(const Engine &) = delete;

    // --- vocabulary ---
    std::vector<llama_token> tokenize(const std::string & text, bool add_special, bool parse_special) const;
    std::string detokenize(const std::vector<llama_token> & tokens, bool render_special = false) const;
    std::string token_piece(llama_token token, bool render_special = false) const;
    bool is_eog(llama_token token) const;
    int32_t n_vocab() const;

    // Formats messages with the model's own chat template (or `tmpl` when given).
    std::string apply_chat_template(const std::vector<ChatMessage> & messages, bool add_assistant,
                                    const std::string & tmpl = "") const;

    // --- evaluation (one sequence; the KV cache holds `history()`) ---
    // Evaluates `tokens` as the new prompt, reusing the longest prefix already in the cache
    // (not in a model that selects neurons: its selection counts every prompt token).
    // With all_logits the returned matrix holds one row of n_vocab logits per token, else
    // only the last row. Counts as prefill in the statistics.
    std::vector<float> eval_prompt(const std::vector<llama_token> & tokens, bool all_logits);
    // Appends one token (decode step); counts as decode in the statistics.
    void eval_token(llama_token token);
    // The logits after the last evaluated token.
    std::vector<float> last_logits() const;
    // Samples the next token from the last evaluated logits.
    llama_token sample();
    void set_sampling(const SamplingParams & params);
    void clear();  // empties the KV cache

    // log p(tokens[i] | tokens[:i]) for i >= 1; tokens[0] is the conditioning start (e.g. BOS).
    std::vector<float> token_logprobs(const std::vector<llama_token> & tokens);

    const std::vector<llama_token> & history() const { return history_; }
    int32_t n_ctx() const;
    Stats stats() const;
    void reset_stats();
    std::string describe() const;  // one line: arch, size, type
    std::map<std::string, uint64_t> weight_buffers() const;  // bytes of weights per buffer type
    std::map<std::string, WeightPlacement> weight_placement() const;  // per weight: shape, buffer type
    std::string meta(const std::string & key) const;  // metadata value, "" when absent

    // --- selective computation (SelectInfer models) ---
    bool selective() const;
    // per SelectInfer layer: (layer index, rows computed at decode)
    std::vector<std::pair<int, std::vector<int32_t>>> selected_neurons() const;
    // per SelectInfer layer: (layer index, neurons computed at a decode step)
    std::vector<std::pair<int, int>> computed_counts() const;
    SelectionConfig selection_config() const;

    // --- profiling (ModelParams::profile) ---
    bool profiling() const { return act_stats_ != nullptr; }
    ActivationSums activation_sums(bool reset);  // reset: the input moments too
    // Per layer, the sum of h h^T over the prompt batches' tokens (row-major n_embd x n_embd), and
    // their number; needs ModelParams::profile_input_moments.
    ActivationSums input_moments();

private:
    void check_selection() const;
    void configure_hooks();
    void release();  // frees sampler, context and model (destructor, failed construction)
    void decode_batch(const llama_token * tokens, int32_t n, int32_t pos0, bool all_logits);

    ModelParams     params_;
    llama_model   * model_   = nullptr;
    llama_context * ctx_     = nullptr;
    llama_sampler * sampler_ = nullptr;
    const llama_vocab * vocab_ = nullptr;
    std::vector<llama_token> history_;
    Stats stats_;
    ActivationStats * act_stats_ = nullptr;  // owned by the context's hooks when profiling
    int64_t profiled_tokens_ = 0;
    int64_t moment_tokens_ = 0;  // of them, in batches of more than one token (activation_stats.h)
    bool all_outputs_ = false;  // every prompt token must reach the last layer (a sparsified one)
};

}  // namespace selectinfer
