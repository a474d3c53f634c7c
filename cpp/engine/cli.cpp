// selectinfer-cli: generate text from a GGUF model, with llama-cli's flags.
//
//   selectinfer-cli -m model.gguf -p "The capital of France is" -n 32 --temp 0
//   selectinfer-cli -m model.gguf -cnv -sys "You are terse."      (chat on stdin)
//
// The generation goes to stdout; timings and memory go to stderr.
#include "engine.h"

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

using namespace selectinfer;

namespace {

struct CliArgs {
    ModelParams    model;
    SamplingParams sampling;
    std::string    prompt;
    std::string    system_prompt;
    int32_t        n_predict    = -1;  // -1: until end of generation or a full context
    bool           conversation = false;
    bool           show_help    = false;
};

const char * kUsageHead =
    "usage: selectinfer-cli -m MODEL.gguf [-p PROMPT | -f FILE] [options]\n"
    "\n"
    "  -m,   --model PATH          GGUF model file (required)\n"
    "  -p,   --prompt TEXT         prompt to continue (in chat mode: the first user message)\n"
    "  -f,   --file PATH           read the prompt from a file\n"
    "  -n,   --n-predict N         tokens to generate (default -1: until end of text or full context)\n"
    "  -c,   --ctx-size N          context size in tokens (default 2048)\n"
    "  -b,   --batch-size N        prompt tokens per batch (default 512)\n"
    "  -t,   --threads N           CPU threads (default: all)\n"
    "  -ngl, --gpu-layers N        layers on the GPU (CUDA build), -1 = all (default 0)\n"
    "        --temp T              temperature, 0 = greedy (default 0.8)\n"
    "        --top-k N             top-k sampling, 0 = off (default 40)\n"
    "        --top-p P             top-p sampling, 1 = off (default 0.95)\n"
    "  -s,   --seed N              sampling seed, -1 = random (default -1)\n"
    "  -cnv, --conversation        chat mode: read user turns from stdin, one per line\n"
    "  -sys, --system-prompt TEXT  system message in chat mode\n"
    "  -fa,  --flash-attn on|off|auto  flash attention (default auto)\n"
    ;  // then the selection settings' flags (selection_settings.h), then:
const char * kUsageTail =
    "        --no-mmap             read the weights into memory instead of mapping the file\n"
    "        --repack, --no-repack let ggml repack weights for its faster kernels (AMX, CPU_REPACK), or not\n"
    "  -v,   --verbose             show llama.cpp's log\n"
    "  -h,   --help                show this help\n";

[[noreturn]] void usage_error(const std::string & msg) {
    std::fprintf(stderr, "selectinfer-cli: error: %s (see --help)\n", msg.c_str());
    std::exit(2);
}

// Each selection setting's flag, from the table: a value, or for a switch the flag and --no-<flag>.
template <typename T> std::string selection_flag_usage(const char * flag, const char * help) {
    std::string line = "        " + std::string(flag);
    if constexpr (std::is_same_v<T, bool>) {
        line += ", --no-" + std::string(flag + 2);
    } else {
        line += " " + setting_values(T{});
    }
    return line + "\n                              SelectInfer: " + help + "\n";
}

std::string usage() {
    std::string selection;
#define SI_USAGE(name, type, def, env, flag, help) selection += selection_flag_usage<type>(flag, help);
    SELECTINFER_SELECTION_SETTINGS(SI_USAGE)
#undef SI_USAGE
    return kUsageHead + selection + kUsageTail;
}

// Sets the selection setting whose flag `a` is (its value the next argument, or for a switch
// true, and false for --no-<flag>); false: not a selection flag.
template <typename T, typename Value>
bool parse_selection_flag(const std::string & a, const char * flag, int & i, Value & value, std::optional<T> & out) {
    if constexpr (std::is_same_v<T, bool>) {
        if (a == flag) out = true;
        else if (a == "--no-" + std::string(flag + 2)) out = false;
        else return false;
    } else {
        if (a != flag) return false;
        const std::string v = value(i);
        T parsed{};
        if (!parse_setting(v, parsed)) usage_error("invalid value '" + v + "' for " + a + " (" + setting_values(T{}) + ")");
        out = parsed;
    }
    return true;
}

template <typename Value> bool parse_selection_flag(const std::string & a, int & i, Value & value, SelectionOverrides & o) {
#define SI_FLAG(name, type, def, env, flag, help) if (parse_selection_flag<type>(a, flag, i, value, o.name)) return true;
    SELECTINFER_SELECTION_SETTINGS(SI_FLAG)
#undef SI_FLAG
    return false;
}

std::string read_file(const std::string & path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) usage_error("cannot read prompt file " + path);
    std::stringstream ss;
    ss << f.rdbuf();
    const std::string text = ss.str();
    const size_t bad = invalid_utf8_at(text);
    if (bad != std::string::npos) {
        usage_error("the prompt file " + path + " is not UTF-8 text (byte " + std::to_string(bad) +
                    "): give a text file with -f, or the prompt with -p");
    }
    return text;
}

template <typename T> T parse_number(const std::string & flag, const std::string & value) {
    std::istringstream in(value);
    T out{};
    if (!(in >> out) || !in.eof()) usage_error("invalid value '" + value + "' for " + flag);
    return out;
}

CliArgs parse_args(int argc, char ** argv) {
    CliArgs args;
    auto value = [&](int & i) -> std::string {
        if (i + 1 >= argc) usage_error(std::string("missing value for ") + argv[i]);
        return argv[++i];
    };
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "-m" || a == "--model") args.model.path = value(i);
        else if (a == "-p" || a == "--prompt") args.prompt = value(i);
        else if (a == "-f" || a == "--file") args.prompt = read_file(value(i));
        else if (a == "-n" || a == "--n-predict") args.n_predict = parse_number<int32_t>(a, value(i));
        else if (a == "-c" || a == "--ctx-size") args.model.n_ctx = parse_number<int32_t>(a, value(i));
        else if (a == "-b" || a == "--batch-size") args.model.n_batch = parse_number<int32_t>(a, value(i));
        else if (a == "-t" || a == "--threads") args.model.n_threads = parse_number<int32_t>(a, value(i));
        else if (a == "-ngl" || a == "--gpu-layers" || a == "--n-gpu-layers") {
            args.model.n_gpu_layers = parse_number<int32_t>(a, value(i));
        }
        else if (a == "--temp") args.sampling.temperature = parse_number<float>(a, value(i));
        else if (a == "--top-k") args.sampling.top_k = parse_number<int32_t>(a, value(i));
        else if (a == "--top-p") args.sampling.top_p = parse_number<float>(a, value(i));
        else if (a == "-s" || a == "--seed") {
            long long seed = parse_number<long long>(a, value(i));
            args.sampling.seed = seed < 0 ? kRandomSeed : (uint32_t) seed;
        }
        else if (a == "-cnv" || a == "--conversation") args.conversation = true;
        else if (a == "-sys" || a == "--system-prompt") args.system_prompt = value(i);
        else if (a == "-fa" || a == "--flash-attn") {
            const std::string v = value(i);
            if (v == "on") args.model.flash_attn = 1;
            else if (v == "off") args.model.flash_attn = 0;
            else if (v == "auto") args.model.flash_attn = -1;
            else usage_error("invalid value '" + v + "' for " + a + " (on, off or auto)");
        }
        else if (parse_selection_flag(a, i, value, args.model.selection)) {}
        else if (a == "--no-mmap") args.model.use_mmap = false;
        else if (a == "--repack") args.model.repack = true;
        else if (a == "-nr" || a == "--no-repack") args.model.repack = false;
        else if (a == "-v" || a == "--verbose") args.model.verbose = true;
        else if (a == "-h" || a == "--help") args.show_help = true;
        else usage_error("unknown argument " + a);
    }
    if (args.show_help) return args;
    if (args.model.path.empty()) usage_error("no model given: pass -m MODEL.gguf");
    if (!args.conversation && args.prompt.empty()) usage_error("no prompt given: pass -p TEXT or -f FILE");
    if (args.n_predict < -1) usage_error("--n-predict must be >= -1");
    return args;
}

// Generates after the current history until end of generation, n_predict tokens or a full
// context; streams pieces to stdout and returns the generated text.
std::string generate(Engine & engine, int32_t n_predict) {
    std::string text;
    for (int32_t n = 0; n_predict < 0 || n < n_predict; ++n) {
        llama_token tok = engine.sample();
        if (engine.is_eog(tok)) break;
        std::string piece = engine.token_piece(tok);
        text += piece;
        std::fwrite(piece.data(), 1, piece.size(), stdout);
        std::fflush(stdout);
        if (n + 1 == n_predict) break;                                    // no decode for a token nobody reads
        if ((int32_t) engine.history().size() >= engine.n_ctx()) break;  // context full
        engine.eval_token(tok);
    }
    return text;
}

void print_summary(const Engine & engine) {
    Stats s = engine.stats();
    auto rate = [](int64_t n, double ms) { return ms > 0 ? 1000.0 * n / ms : 0.0; };
    const double mib = 1024.0 * 1024.0;
    std::fprintf(stderr,
                 "\nselectinfer-cli: prefill %lld tokens in %.1f ms (%.1f tok/s) | decode %lld tokens in %.1f ms "
                 "(%.1f tok/s) | model %.1f MiB | RSS %.1f MiB (peak %.1f MiB)\n",
                 (long long) s.n_prefill_tokens, s.prefill_ms, rate(s.n_prefill_tokens, s.prefill_ms),
                 (long long) s.n_decode_tokens, s.decode_ms, rate(s.n_decode_tokens, s.decode_ms),
                 s.model_bytes / mib, s.rss_bytes / mib, s.peak_rss_bytes / mib);
}

void run_completion(Engine & engine, const CliArgs & args) {
    engine.eval_prompt(engine.tokenize(args.prompt, true, false), false);
    generate(engine, args.n_predict);
    std::fputc('\n', stdout);
}

void run_chat(Engine & engine, const CliArgs & args) {
    std::vector<ChatMessage> messages;
    if (!args.system_prompt.empty()) messages.push_back({"system", args.system_prompt});
    auto turn = [&](const std::string & user) {
        messages.push_back({"user", user});
        std::string prompt = engine.apply_chat_template(messages, true);
        engine.eval_prompt(engine.tokenize(prompt, true, true), false);
        messages.push_back({"assistant", generate(engine, args.n_predict)});
        std::fputc('\n', stdout);
        std::fflush(stdout);
    };
    if (!args.prompt.empty()) turn(args.prompt);
    std::string line;
    while (true) {
        std::fputs("> ", stderr);
        if (!std::getline(std::cin, line)) break;
        if (!line.empty()) turn(line);
    }
}

}  // namespace

int main(int argc, char ** argv) {
    CliArgs args = parse_args(argc, argv);
    if (args.show_help) {
        std::fputs(usage().c_str(), stdout);
        return 0;
    }
    try {
        validate(args.sampling);
        Engine engine(args.model);
        engine.set_sampling(args.sampling);
        if (args.conversation) run_chat(engine, args);
        else run_completion(engine, args);
        print_summary(engine);
    } catch (const std::exception & e) {
        std::fflush(stdout);
        std::fprintf(stderr, "selectinfer-cli: error: %s\n", e.what());
        return 1;
    }
    return 0;
}
