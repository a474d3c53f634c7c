#include "engine.h"

#include "activation_stats.h"
#include "model_tensors.h"
#include "neuron_selection.h"
#include "si_gguf.h"

#include "ggml-backend.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#if defined(GGML_BACKEND_DL)
#include <dlfcn.h>
#endif
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <mutex>
#include <thread>

namespace selectinfer {

namespace {

// llama.cpp reports load failures through its log; keep this call's error lines so that our
// exceptions can say why, and stay quiet otherwise unless the caller asked for verbosity.
struct LogState {
    std::mutex  mutex;
    std::string errors;  // error lines since the last take_last_error()
    bool        verbose = false;
    ggml_log_level last_level = GGML_LOG_LEVEL_NONE;
};

LogState & log_state() {
    static LogState state;
    return state;
}

void log_callback(ggml_log_level level, const char * text, void * /*user_data*/) {
    LogState & s = log_state();
    std::lock_guard<std::mutex> lock(s.mutex);
    if (level == GGML_LOG_LEVEL_CONT) {
        level = s.last_level;
    }
    s.last_level = level;
    if (level == GGML_LOG_LEVEL_ERROR) {
        s.errors += text;
    }
    if (s.verbose) {
        fputs(text, stderr);
    }
}

// The length of the UTF-8 sequence at s[i], 0 where it is not one: the shortest form only, no
// surrogates, nothing above U+10FFFF.
size_t utf8_sequence_at(const std::string & s, size_t i) {
    const unsigned char c = s[i];
    const size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    bool ok = n > 0 && i + n <= s.size();
    uint32_t cp = n == 1 ? c : n == 2 ? c & 0x1F : n == 3 ? c & 0x0F : c & 0x07;
    for (size_t k = 1; ok && k < n; ++k) {
        ok = ((unsigned char) s[i + k] >> 6) == 0x2;
        cp = (cp << 6) | ((unsigned char) s[i + k] & 0x3F);
    }
    const uint32_t lowest[5] = {0, 0, 0x80, 0x800, 0x10000};
    ok = ok && cp >= lowest[n] && cp <= 0x10FFFF && !(cp >= 0xD800 && cp <= 0xDFFF);
    return ok ? n : 0;
}

// Text from a file (a key or tensor name in an error) may not be UTF-8; Python could not even
// raise the error with it. Invalid bytes become U+FFFD.
std::string valid_utf8(const std::string & s) {
    std::string out;
    for (size_t i = 0; i < s.size();) {
        const size_t n = utf8_sequence_at(s, i);
        if (n > 0) {
            out.append(s, i, n);
            i += n;
        } else {
            out += "\xEF\xBF\xBD";
            i += 1;
        }
    }
    return out;
}

// The informative part of the logged errors: "func: error loading model: why" -> "why", the
// generic "failed to load model" lines dropped, one line per distinct reason.
std::string take_last_error() {
    std::string errors;
    {
        LogState & s = log_state();
        std::lock_guard<std::mutex> lock(s.mutex);
        std::swap(errors, s.errors);
    }
    std::string out;
    size_t start = 0;
    while (start < errors.size()) {
        size_t end = errors.find('\n', start);
        if (end == std::string::npos) end = errors.size();
        std::string line = errors.substr(start, end - start);
        start = end + 1;
        for (const char * prefix : {"error loading model: ", "llama_model_loader: "}) {
            size_t at = line.find(prefix);
            if (at != std::string::npos) line = line.substr(at + std::strlen(prefix));
        }
        size_t colon = line.find(": ");
        if (colon != std::string::npos && line.find(' ') > colon) line = line.substr(colon + 2);  // "func: why"
        if (line.empty() || line.rfind("failed to load model", 0) == 0 || out.find(line) != std::string::npos) continue;
        out += (out.empty() ? "" : "; ") + line;
    }
    return valid_utf8(out);
}

#if defined(GGML_BACKEND_DL)
// The folder of libllama: a build whose backends are loaded at run time installs them beside it
// (SELECTINFER_CPU_ALL_VARIANTS), for the extension module and the programs alike.
std::string own_folder() {
    Dl_info info;
    if (!dladdr((void *) &llama_backend_init, &info) || !info.dli_fname) return ".";
    std::string path = info.dli_fname;
    const size_t slash = path.rfind('/');
    return slash == std::string::npos ? "." : path.substr(0, slash);
}
#endif

void init_backend_once(bool verbose) {
    init_backends();
    std::lock_guard<std::mutex> lock(log_state().mutex);
    log_state().verbose = verbose;
}

// Rejects what is obviously not a GGUF before llama.cpp sees it.
void check_gguf_file(const std::string & path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) {
        throw ModelLoadError("model file not found or not readable: " + path +
                             " (check the path, or fetch the default model with `selectinfer pull smollm2-135m`)");
    }
    char magic[4] = {};
    f.read(magic, sizeof(magic));
    if (f.gcount() != 4 || std::memcmp(magic, "GGUF", 4) != 0) {
        throw ModelLoadError(path + " is not a GGUF file (bad magic); pass a .gguf model");
    }
}

double ms_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

size_t invalid_utf8_at(const std::string & s) {
    for (size_t i = 0, n; i < s.size(); i += n) {
        if ((n = utf8_sequence_at(s, i)) == 0) return i;
    }
    return std::string::npos;
}

void init_backends() {
    static std::once_flag once;
    std::call_once(once, [] {
        llama_log_set(log_callback, nullptr);
        llama_backend_init();
#if defined(GGML_BACKEND_DL)
        ggml_backend_load_all_from_path(own_folder().c_str());  // the CPU variant this machine runs best
#endif
    });
}

std::pair<uint64_t, uint64_t> process_rss_bytes() {
    std::ifstream status("/proc/self/status");
    std::string line;
    uint64_t rss_kib = 0, peak_kib = 0;
    while (std::getline(status, line)) {
        if (line.rfind("VmRSS:", 0) == 0) {
            rss_kib = std::stoull(line.substr(6));
        } else if (line.rfind("VmHWM:", 0) == 0) {
            peak_kib = std::stoull(line.substr(6));
        }
    }
    return {rss_kib * 1024, peak_kib * 1024};
}

std::vector<std::string> cpu_extra_buffer_types() {
    init_backend_once(false);
    std::vector<std::string> names;
    ggml_backend_reg_t cpu = ggml_backend_reg_by_name("CPU");
    auto get = cpu ? (ggml_backend_dev_get_extra_bufts_t) ggml_backend_reg_get_proc_address(
                         cpu, "ggml_backend_dev_get_extra_bufts") : nullptr;
    if (get) {
        for (ggml_backend_buffer_type_t * b = get(ggml_backend_reg_dev_get(cpu, 0)); b && *b; ++b) {
            names.emplace_back(ggml_backend_buft_name(*b));
        }
    }
    return names;
}

std::vector<DeviceInfo> compute_devices() {
    init_backend_once(false);
    std::vector<DeviceInfo> out;
    for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
        ggml_backend_dev_t dev = ggml_backend_dev_get(i);
        DeviceInfo d;
        d.name = ggml_backend_dev_name(dev);
        d.description = ggml_backend_dev_description(dev);
        switch (ggml_backend_dev_type(dev)) {
            case GGML_BACKEND_DEVICE_TYPE_CPU:   d.type = "CPU"; break;
            case GGML_BACKEND_DEVICE_TYPE_GPU:   d.type = "GPU"; break;
            case GGML_BACKEND_DEVICE_TYPE_IGPU:  d.type = "IGPU"; break;
            default:                             d.type = "ACCEL"; break;
        }
        size_t free_bytes = 0, total_bytes = 0;
        ggml_backend_dev_memory(dev, &free_bytes, &total_bytes);
        d.memory_free_bytes = free_bytes;
        d.memory_total_bytes = total_bytes;
        out.push_back(d);
    }
    return out;
}

void validate(const SamplingParams & p) {
    if (!std::isfinite(p.temperature) || p.temperature < 0) {
        throw std::invalid_argument("temperature must be >= 0 (0 = greedy), got " + std::to_string(p.temperature));
    }
    if (p.top_k < 0) {
        throw std::invalid_argument("top_k must be >= 0 (0 = disabled), got " + std::to_string(p.top_k));
    }
    if (!(p.top_p > 0 && p.top_p <= 1)) {
        throw std::invalid_argument("top_p must be in (0, 1], got " + std::to_string(p.top_p));
    }
}

namespace {

const std::vector<std::pair<std::string, llama_ftype>> & quantize_types() {
    static const std::vector<std::pair<std::string, llama_ftype>> types = {
        {"F32", LLAMA_FTYPE_ALL_F32},        {"F16", LLAMA_FTYPE_MOSTLY_F16},
        {"BF16", LLAMA_FTYPE_MOSTLY_BF16},   {"Q8_0", LLAMA_FTYPE_MOSTLY_Q8_0},
        {"Q4_0", LLAMA_FTYPE_MOSTLY_Q4_0},   {"Q4_1", LLAMA_FTYPE_MOSTLY_Q4_1},
        {"Q5_0", LLAMA_FTYPE_MOSTLY_Q5_0},   {"Q5_1", LLAMA_FTYPE_MOSTLY_Q5_1},
        {"Q2_K", LLAMA_FTYPE_MOSTLY_Q2_K},   {"Q3_K_M", LLAMA_FTYPE_MOSTLY_Q3_K_M},
        {"Q4_K_M", LLAMA_FTYPE_MOSTLY_Q4_K_M}, {"Q5_K_M", LLAMA_FTYPE_MOSTLY_Q5_K_M},
        {"Q6_K", LLAMA_FTYPE_MOSTLY_Q6_K},
    };
    return types;
}

}  // namespace

std::vector<std::string> quantize_type_names() {
    std::vector<std::string> names;
    for (const auto & t : quantize_types()) names.push_back(t.first);
    return names;
}

void quantize_model(const std::string & input_path, const std::string & output_path, const std::string & type_name,
                    int32_t n_threads) {
    std::string upper = type_name;
    std::transform(upper.begin(), upper.end(), upper.begin(), ::toupper);
    const auto & types = quantize_types();
    auto it = std::find_if(types.begin(), types.end(), [&](const auto & t) { return t.first == upper; });
    if (it == types.end()) {
        std::string known;
        for (const auto & t : types) known += (known.empty() ? "" : ", ") + t.first;
        throw std::invalid_argument("unknown weight type '" + type_name + "'; choose one of " + known);
    }
    init_backend_once(false);
    check_gguf_file(input_path);
    llama_model_quantize_params qp = llama_model_quantize_default_params();
    qp.ftype            = it->second;
    qp.nthread          = n_threads;
    qp.allow_requantize = true;  // e.g. the default Q4_1 model to F16 or Q8_0
    std::string tmp = output_path + ".tmp";
    take_last_error();
    uint32_t rc = llama_model_quantize(input_path.c_str(), tmp.c_str(), &qp);
    if (rc != 0) {
        std::remove(tmp.c_str());
        std::string why = take_last_error();
        throw ModelLoadError("could not convert " + input_path + " to " + upper + (why.empty() ? "" : ": " + why));
    }
    if (std::rename(tmp.c_str(), output_path.c_str()) != 0) {
        std::remove(tmp.c_str());
        throw std::runtime_error("could not write " + output_path + ": " + std::strerror(errno));
    }
}

Engine::Engine(const ModelParams & params) : params_(params) {
    if (params_.n_ctx <= 0) {
        throw std::invalid_argument("n_ctx must be > 0, got " + std::to_string(params_.n_ctx));
    }
    if (params_.n_batch <= 0) {
        throw std::invalid_argument("n_batch must be > 0, got " + std::to_string(params_.n_batch));
    }
    if (params_.n_threads < 0) {
        throw std::invalid_argument("n_threads must be >= 0 (0 = all cores), got " + std::to_string(params_.n_threads));
    }
    if (params_.n_gpu_layers < -1) {
        throw std::invalid_argument("n_gpu_layers must be >= -1 (-1 = all layers), got " +
                                    std::to_string(params_.n_gpu_layers));
    }
    if (params_.n_threads == 0) {
        params_.n_threads = std::max(1u, std::thread::hardware_concurrency());
    }
    init_backend_once(params_.verbose);
    check_gguf_file(params_.path);

    llama_model_params mp = llama_model_default_params();
    mp.load_mode = params_.use_mmap ? LLAMA_LOAD_MODE_MMAP : LLAMA_LOAD_MODE_NONE;
    mp.use_extra_bufts = params_.repack;
    mp.n_gpu_layers = params_.n_gpu_layers;
    mp.selectinfer = &params_.selection;  // over the environment's as the model loads (dense use)
    take_last_error();
    model_ = llama_model_load_from_file(params_.path.c_str(), mp);
    if (!model_) {
        std::string why = take_last_error();
        // a SelectInfer refusal names its own fix; other failures get the usual suspects
        const bool explained = why.find("selectinfer") != std::string::npos;
        throw ModelLoadError("failed to load model " + params_.path + (why.empty() ? "" : ": " + why) +
                             (explained ? "" : " (is the file complete and a supported architecture?)"));
    }
    vocab_ = llama_model_get_vocab(model_);

    llama_context_params cp = llama_context_default_params();
    cp.n_ctx           = params_.n_ctx;
    cp.n_batch         = params_.n_batch;
    cp.n_ubatch        = params_.n_batch;
    cp.n_threads       = params_.n_threads;
    cp.n_threads_batch = params_.n_threads;
    cp.no_perf         = true;
    cp.flash_attn_type = params_.flash_attn < 0 ? LLAMA_FLASH_ATTN_TYPE_AUTO
                       : params_.flash_attn == 0 ? LLAMA_FLASH_ATTN_TYPE_DISABLED : LLAMA_FLASH_ATTN_TYPE_ENABLED;
    cp.selectinfer     = &params_.selection;  // over the environment's as the context's hooks are created
    try {
        check_selection();
    } catch (...) {
        release();
        throw;
    }
    ctx_ = llama_init_from_model(model_, cp);
    if (!ctx_) {
        std::string why = take_last_error();
        llama_model_free(model_);
        throw ModelLoadError("failed to create a context for " + params_.path + (why.empty() ? "" : ": " + why));
    }
    stats_.model_bytes = llama_model_size(model_);
    try {
        configure_hooks();
    } catch (...) {
        release();
        throw;
    }
    set_sampling(SamplingParams{});
}

// The caller's selective computation settings, checked before the context applies them: a bad
// one is a ValueError naming it, not a failed context.
void Engine::check_selection() const {
    if (params_.selection.ask_for_selection() && !si_model_info(*model_)) {
        throw std::invalid_argument("selective computation options need a SelectInfer GGUF (selectinfer convert); " +
                                    params_.path + " is a dense model");
    }
    NeuronSelection::check_settings(model_, params_.selection);
}

// Profiling is set on the context's hooks before the first decode.
void Engine::configure_hooks() {
    ContextHooks & hooks = context_hooks(ctx_);
    if (hooks.selection) all_outputs_ = hooks.selection->sparsifies_last_layer();
    if (params_.profile) {
        hooks.stats = std::make_unique<ActivationStats>(model_, params_.profile_input_moments);
        act_stats_ = hooks.stats.get();
    }
}

void Engine::release() {
    if (sampler_) llama_sampler_free(sampler_);
    if (ctx_) llama_free(ctx_);
    if (model_) llama_model_free(model_);
    sampler_ = nullptr;
    ctx_ = nullptr;
    model_ = nullptr;
}

Engine::~Engine() {
    release();
}

std::vector<llama_token> Engine::tokenize(const std::string & text, bool add_special, bool parse_special) const {
    std::vector<llama_token> tokens(text.size() + 4);
    int32_t n = llama_tokenize(vocab_, text.data(), (int32_t) text.size(), tokens.data(), (int32_t) tokens.size(),
                               add_special, parse_special);
    if (n < 0) {
        if (n == INT32_MIN) throw std::length_error("text too long to tokenize");
        tokens.resize(-n);
        n = llama_tokenize(vocab_, text.data(), (int32_t) text.size(), tokens.data(), (int32_t) tokens.size(),
                           add_special, parse_special);
    }
    tokens.resize(std::max(n, 0));
    return tokens;
}

std::string Engine::detokenize(const std::vector<llama_token> & tokens, bool render_special) const {
    std::string text(tokens.size() * 8 + 16, '\0');
    int32_t n = llama_detokenize(vocab_, tokens.data(), (int32_t) tokens.size(), text.data(), (int32_t) text.size(),
                                 false, render_special);
    if (n < 0) {
        text.resize(-n);
        n = llama_detokenize(vocab_, tokens.data(), (int32_t) tokens.size(), text.data(), (int32_t) text.size(),
                             false, render_special);
    }
    text.resize(std::max(n, 0));
    return text;
}

std::string Engine::token_piece(llama_token token, bool render_special) const {
    if (token < 0 || token >= n_vocab()) {
        throw std::out_of_range("token id " + std::to_string(token) + " outside the vocabulary [0, " +
                                std::to_string(n_vocab()) + ")");
    }
    char buf[256];
    int32_t n = llama_token_to_piece(vocab_, token, buf, sizeof(buf), 0, render_special);
    if (n < 0) {
        std::string big(-n, '\0');
        llama_token_to_piece(vocab_, token, big.data(), (int32_t) big.size(), 0, render_special);
        return big;
    }
    return std::string(buf, n);
}

bool Engine::is_eog(llama_token token) const { return llama_vocab_is_eog(vocab_, token); }

int32_t Engine::n_vocab() const { return llama_vocab_n_tokens(vocab_); }

// The context the caller asked for; llama.cpp may round its KV cache up (to a multiple of 256).
int32_t Engine::n_ctx() const { return std::min(params_.n_ctx, (int32_t) llama_n_ctx(ctx_)); }

std::string Engine::apply_chat_template(const std::vector<ChatMessage> & messages, bool add_assistant,
                                        const std::string & tmpl) const {
    const char * t = tmpl.empty() ? llama_model_chat_template(model_, nullptr) : tmpl.c_str();
    if (!t) {
        throw std::invalid_argument("the model has no chat template; pass one explicitly or use plain completion");
    }
    std::vector<llama_chat_message> msgs;
    size_t total = 0;
    for (const auto & m : messages) {
        msgs.push_back({m.role.c_str(), m.content.c_str()});
        total += m.role.size() + m.content.size();
    }
    std::string out(2 * total + 256, '\0');
    int32_t n = llama_chat_apply_template(t, msgs.data(), msgs.size(), add_assistant, out.data(), (int32_t) out.size());
    if (n > (int32_t) out.size()) {
        out.resize(n);
        n = llama_chat_apply_template(t, msgs.data(), msgs.size(), add_assistant, out.data(), (int32_t) out.size());
    }
    if (n < 0) {
        throw std::invalid_argument("the model's chat template is not one llama.cpp supports without jinja");
    }
    out.resize(n);
    return out;
}

void Engine::decode_batch(const llama_token * tokens, int32_t n, int32_t pos0, bool all_logits) {
    llama_batch batch = llama_batch_init(n, 0, 1);
    for (int32_t i = 0; i < n; ++i) {
        batch.token[i]     = tokens[i];
        batch.pos[i]       = pos0 + i;
        batch.n_seq_id[i]  = 1;
        batch.seq_id[i][0] = 0;
        // profiling, and selection in a sparsified last layer: every token must reach the last
        // layer's FFN, which llama.cpp otherwise computes only for the tokens whose logits are requested
        batch.logits[i]    = all_logits || profiling() || all_outputs_ || i == n - 1;
    }
    batch.n_tokens = n;
    int32_t rc = llama_decode(ctx_, batch);
    llama_batch_free(batch);
    if (rc == 1) {
        throw ContextOverflowError("no room in the KV cache for " + std::to_string(n) + " more tokens (n_ctx " +
                                   std::to_string(n_ctx()) + "); pass a larger n_ctx (-c)");
    }
    if (rc != 0) {
        std::string why = take_last_error();
        throw std::runtime_error("llama_decode failed with code " + std::to_string(rc) + (why.empty() ? "" : ": " + why));
    }
    history_.insert(history_.end(), tokens, tokens + n);
    profiled_tokens_ += n;
    if (n > 1) moment_tokens_ += n;
}

static void check_tokens(const std::vector<llama_token> & tokens, int32_t n_vocab, int32_t n_ctx, const char * what) {
    if (tokens.empty()) {
        throw std::invalid_argument(std::string(what) + " is empty: nothing to evaluate");
    }
    if ((int64_t) tokens.size() > n_ctx) {
        throw ContextOverflowError(std::string(what) + " has " + std::to_string(tokens.size()) +
                                   " tokens but the context holds " + std::to_string(n_ctx) +
                                   "; pass a larger n_ctx (-c) or a shorter " + what);
    }
    for (llama_token t : tokens) {
        if (t < 0 || t >= n_vocab) {
            throw std::out_of_range("token id " + std::to_string(t) + " outside the vocabulary [0, " +
                                    std::to_string(n_vocab) + ")");
        }
    }
}

namespace {

// The batches evaluated while this lives are a prompt's (they select); decode steps after.
class PromptPhase {
public:
    explicit PromptPhase(NeuronSelection * selection) : selection_(selection) {
        if (selection_) selection_->set_phase(NeuronSelection::Phase::prompt);
    }
    ~PromptPhase() {
        if (selection_) selection_->set_phase(NeuronSelection::Phase::decode);
    }
    PromptPhase(const PromptPhase &) = delete;
    PromptPhase & operator=(const PromptPhase &) = delete;

private:
    NeuronSelection * selection_;
};

}  // namespace

std::vector<float> Engine::eval_prompt(const std::vector<llama_token> & tokens, bool all_logits) {
    check_tokens(tokens, n_vocab(), n_ctx(), "prompt");
    // Reuse the cached prefix; at least the last token is evaluated again to get its logits.
    // A model that selects neurons evaluates the whole prompt: the selection counts every token.
    NeuronSelection * selection = context_hooks(ctx_).selection.get();
    const bool selects = selection && !selection->config().dense;
    size_t keep = 0;
    if (!all_logits && !selects) {
        while (keep < history_.size() && keep < tokens.size() && history_[keep] == tokens[keep]) ++keep;
        keep = std::min(keep, tokens.size() - 1);
    }
    if (!llama_memory_seq_rm(llama_get_memory(ctx_), 0, (llama_pos) keep, -1)) {
        llama_memory_clear(llama_get_memory(ctx_), true);
        keep = 0;
    }
    history_.resize(keep);

    const int32_t n_vocab_ = n_vocab();
    std::vector<float> logits;
    auto t0 = std::chrono::steady_clock::now();
    {
        PromptPhase phase(selection);  // a one-token prompt selects too
        for (size_t start = keep; start < tokens.size(); start += params_.n_batch) {
            int32_t n = (int32_t) std::min<size_t>(params_.n_batch, tokens.size() - start);
            decode_batch(tokens.data() + start, n, (int32_t) start, all_logits);
            if (all_logits) {
                for (int32_t i = 0; i < n; ++i) {
                    const float * row = llama_get_logits_ith(ctx_, i);
                    logits.insert(logits.end(), row, row + n_vocab_);
                }
            }
        }
    }
    if (!all_logits) {
        const float * row = llama_get_logits_ith(ctx_, -1);  // the last output row
        logits.assign(row, row + n_vocab_);
    }
    stats_.prefill_ms += ms_since(t0);
    stats_.n_prefill_tokens += (int64_t) (tokens.size() - keep);
    return logits;
}

void Engine::eval_token(llama_token token) {
    if ((int64_t) history_.size() + 1 > n_ctx()) {
        throw ContextOverflowError("the context is full (" + std::to_string(n_ctx()) +
                                   " tokens); pass a larger n_ctx (-c) or generate fewer tokens");
    }
    check_tokens({token}, n_vocab(), n_ctx(), "token");
    auto t0 = std::chrono::steady_clock::now();
    decode_batch(&token, 1, (int32_t) history_.size(), true);
    stats_.decode_ms += ms_since(t0);
    stats_.n_decode_tokens += 1;
}

std::vector<float> Engine::last_logits() const {
    if (history_.empty()) {
        throw std::logic_error("nothing evaluated yet");
    }
    const float * row = llama_get_logits_ith(ctx_, -1);
    return std::vector<float>(row, row + n_vocab());
}

llama_token Engine::sample() {
    if (history_.empty()) {
        throw std::logic_error("nothing evaluated yet: evaluate a prompt before sampling");
    }
    return llama_sampler_sample(sampler_, ctx_, -1);
}

void Engine::set_sampling(const SamplingParams & p) {
    validate(p);
    llama_sampler * chain = llama_sampler_chain_init(llama_sampler_chain_default_params());
    if (p.temperature <= 0) {
        llama_sampler_chain_add(chain, llama_sampler_init_greedy());
    } else {
        if (p.top_k > 0) llama_sampler_chain_add(chain, llama_sampler_init_top_k(p.top_k));
        if (p.top_p < 1) llama_sampler_chain_add(chain, llama_sampler_init_top_p(p.top_p, 1));
        llama_sampler_chain_add(chain, llama_sampler_init_temp(p.temperature));
        llama_sampler_chain_add(chain, llama_sampler_init_dist(p.seed));
    }
    if (sampler_) llama_sampler_free(sampler_);
    sampler_ = chain;
}

void Engine::clear() {
    llama_memory_clear(llama_get_memory(ctx_), true);
    history_.clear();
}

std::vector<float> Engine::token_logprobs(const std::vector<llama_token> & tokens) {
    check_tokens(tokens, n_vocab(), n_ctx(), "text");
    clear();
    const int32_t nv = n_vocab();
    std::vector<float> out;
    out.reserve(tokens.size() - 1);
    PromptPhase phase(context_hooks(ctx_).selection.get());  // one pass: the text is a prompt
    for (size_t start = 0; start + 1 < tokens.size(); start += params_.n_batch) {
        // The last token needs no logits of its own: nothing follows it.
        int32_t n = (int32_t) std::min<size_t>(params_.n_batch, tokens.size() - 1 - start);
        decode_batch(tokens.data() + start, n, (int32_t) start, true);
        for (int32_t i = 0; i < n; ++i) {
            const float * row = llama_get_logits_ith(ctx_, i);
            float max_logit = *std::max_element(row, row + nv);
            double sum = 0;
            for (int32_t v = 0; v < nv; ++v) sum += std::exp((double) row[v] - max_logit);
            out.push_back((float) (row[tokens[start + i + 1]] - max_logit - std::log(sum)));
        }
    }
    return out;
}

Stats Engine::stats() const {
    Stats s = stats_;
    std::tie(s.rss_bytes, s.peak_rss_bytes) = process_rss_bytes();
    return s;
}

void Engine::reset_stats() {
    uint64_t bytes = stats_.model_bytes;
    stats_ = Stats{};
    stats_.model_bytes = bytes;
}

bool Engine::selective() const {
    return context_hooks(ctx_).selection != nullptr;
}

std::vector<std::pair<int, std::vector<int32_t>>> Engine::selected_neurons() const {
    const auto & sel = context_hooks(ctx_).selection;
    if (!sel) throw std::logic_error("not a SelectInfer model: nothing is selected");
    llama_synchronize(ctx_);
    std::vector<std::pair<int, std::vector<int32_t>>> out;
    auto layers = sel->layers();
    auto ids = sel->selected();
    for (size_t i = 0; i < layers.size(); ++i) out.emplace_back(layers[i], std::move(ids[i]));
    return out;
}

std::vector<std::pair<int, int>> Engine::computed_counts() const {
    const auto & sel = context_hooks(ctx_).selection;
    if (!sel) throw std::logic_error("not a SelectInfer model: nothing is selected");
    std::vector<std::pair<int, int>> out;
    const auto layers = sel->layers();
    const auto counts = sel->computed_counts();
    for (size_t i = 0; i < layers.size(); ++i) out.emplace_back(layers[i], counts[i]);
    return out;
}

SelectionConfig Engine::selection_config() const {
    const auto & sel = context_hooks(ctx_).selection;
    if (!sel) throw std::logic_error("not a SelectInfer model");
    return sel->config();
}

ActivationSums Engine::activation_sums(bool reset) {
    if (!act_stats_) {
        throw std::logic_error("activation statistics need a model opened with profile=True");
    }
    llama_synchronize(ctx_);
    ActivationSums out{act_stats_->read(), profiled_tokens_};
    if (reset) {
        act_stats_->reset();
        profiled_tokens_ = 0;
        moment_tokens_ = 0;
    }
    return out;
}

ActivationSums Engine::input_moments() {
    if (!act_stats_ || !params_.profile_input_moments) {
        throw std::logic_error("FFN input moments need a model opened with profile=True, profile_input_moments=True");
    }
    llama_synchronize(ctx_);
    return {act_stats_->read_input_moments(), moment_tokens_};
}

std::map<std::string, uint64_t> Engine::weight_buffers() const {
    return weight_bytes_by_buffer(*model_);
}

std::map<std::string, WeightPlacement> Engine::weight_placement() const {
    return selectinfer::weight_placement(*model_);
}

std::string Engine::describe() const {
    char buf[256];
    llama_model_desc(model_, buf, sizeof(buf));
    return buf;
}

std::string Engine::meta(const std::string & key) const {
    char buf[1024];
    int32_t n = llama_model_meta_val_str(model_, key.c_str(), buf, sizeof(buf));
    if (n < 0) return "";
    if (n >= (int32_t) sizeof(buf)) {
        std::string big(n + 1, '\0');
        llama_model_meta_val_str(model_, key.c_str(), big.data(), big.size());
        big.resize(n);
        return big;
    }
    return std::string(buf, n);
}

}  // namespace selectinfer
