// selectinfer._native: a thin binding of engine.h. The Python API (python/selectinfer/runtime/model.py)
// builds the user-facing Model on top of it.
#include "engine.h"
#include "file_checks.h"
#include "gguf_meta.h"
#include "quant_rows.h"

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

namespace py = pybind11;
using namespace selectinfer;

namespace {

py::dict header_dict(const GgufHeader & h) {
    py::dict kv;
    for (const auto & [key, value] : h.kv) kv[py::str(key)] = py::cast(value);
    py::list tensors;
    for (const auto & t : h.tensors) {
        py::dict d;
        d["name"] = t.name;
        d["type"] = t.type;
        d["ne"] = t.ne;
        d["offset"] = t.offset;
        d["nbytes"] = t.nbytes;
        tensors.append(d);
    }
    py::dict out;
    out["kv"] = kv;
    out["tensors"] = tensors;
    out["data_offset"] = h.data_offset;
    out["alignment"] = h.alignment;
    return out;
}

// A selection setting's value in Python: enums by name, numbers and booleans as they are.
template <typename T> py::object setting_to_python(T value) {
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, bool>) {
        return py::cast(value);
    } else {
        return py::str(setting_text(value));
    }
}

// A selection setting from Python (None: unset); ValueError naming the keyword and its values.
template <typename T> std::optional<T> setting_from_python(const py::object & v, const char * keyword) {
    if (v.is_none()) return std::nullopt;
    T value{};
    if constexpr (std::is_same_v<T, float>) {
        value = v.cast<float>();
        if (!std::isfinite(value)) throw py::value_error(std::string(keyword) + " must be a number, got " + py::repr(v).cast<std::string>());
    } else if constexpr (std::is_same_v<T, bool>) {
        value = v.cast<bool>();
    } else {
        if (!py::isinstance<py::str>(v) || !parse_setting(v.cast<std::string>(), value)) {
            throw py::value_error(std::string(keyword) + " must be " + setting_values(T{}) + ", got " +
                                  py::repr(v).cast<std::string>());
        }
    }
    return value;
}

py::array_t<float> to_array(std::vector<float> && values, std::vector<py::ssize_t> shape) {
    auto * heap = new std::vector<float>(std::move(values));
    py::capsule owner(heap, [](void * p) { delete static_cast<std::vector<float> *>(p); });
    return py::array_t<float>(shape, heap->data(), owner);
}

}  // namespace

PYBIND11_MODULE(_native, m) {
    m.doc() = "selectinfer native engine (llama.cpp inside)";

    py::register_exception<ModelLoadError>(m, "ModelLoadError", PyExc_ValueError);
    py::register_exception<ContextOverflowError>(m, "ContextOverflowError", PyExc_ValueError);

    m.def("llama_version", [] { return std::string(llama_version()); });
    m.attr("BUILD_COMMIT") = SELECTINFER_COMMIT;  // empty where the source was not a git checkout
    m.def("system_info", [] {
        init_backends();  // a build that loads its CPU backend at run time has none before
        return std::string(llama_print_system_info());
    });
    m.def("extra_buffer_types", &cpu_extra_buffer_types);
    m.def("compute_devices", [] {
        py::list out;
        for (const DeviceInfo & d : compute_devices()) {
            out.append(py::dict(py::arg("name") = d.name, py::arg("description") = d.description,
                                py::arg("type") = d.type, py::arg("memory_free_bytes") = d.memory_free_bytes,
                                py::arg("memory_total_bytes") = d.memory_total_bytes));
        }
        return out;
    }, "The compute devices of this build (ggml's backends), CPU included: name, description, type, memory.");
    m.def("quantize_type_names", &quantize_type_names);
    m.def("quantize_model", &quantize_model, py::arg("input_path"), py::arg("output_path"), py::arg("type_name"),
          py::arg("n_threads") = 0, py::call_guard<py::gil_scoped_release>());

    m.def("read_gguf_header", [](const std::string & path) { return header_dict(read_gguf_header(path)); },
          py::arg("path"), "GGUF metadata and tensor infos (offsets from the data section), without tensor data");
    m.def("write_gguf_header",
          [](const std::string & src, const std::string & out, const std::vector<std::string> & remove,
             const std::vector<std::tuple<std::string, std::string, GgufValue>> & set,
             const std::vector<std::tuple<std::string, int, std::vector<int64_t>>> & tensors) {
              std::vector<NewKey> keys;
              for (const auto & [k, type, value] : set) keys.push_back({k, type, value});
              std::vector<GgufTensor> infos;
              for (const auto & [name, type, ne] : tensors) infos.push_back({name, type, ne, 0, 0});
              return header_dict(write_gguf_header(src, out, remove, keys, infos));
          },
          py::arg("src"), py::arg("out"), py::arg("remove"), py::arg("set"), py::arg("tensors"),
          "writes a GGUF header: the keys of src (minus remove, plus set) and the tensor infos; returns offsets");
    m.def("row_bytes", &row_bytes, py::arg("type"), py::arg("n_per_row"));
    m.def("block_size", &block_size, py::arg("type"));
    m.def("quantize_rows",
          [](int type, py::array_t<float, py::array::c_style | py::array::forcecast> rows) {
              if (rows.ndim() != 2) throw std::invalid_argument("quantize_rows takes a 2-D float array");
              std::string bytes;
              {
                  py::gil_scoped_release release;
                  bytes = quantize_rows(type, rows.data(), rows.shape(0), rows.shape(1));
              }
              const py::ssize_t n_rows = rows.shape(0), stride = (py::ssize_t) (bytes.size() / std::max<py::ssize_t>(n_rows, 1));
              py::array_t<uint8_t> out({n_rows, stride});
              std::memcpy(out.mutable_data(), bytes.data(), bytes.size());
              return out;
          },
          py::arg("type"), py::arg("rows"), "float rows [n_rows, n_per_row] -> uint8 [n_rows, row_bytes] in a ggml type");
    m.def("dequantize_rows",
          [](int type, py::array_t<uint8_t, py::array::c_style> rows, int64_t n_per_row) {
              if (rows.ndim() != 2 || (size_t) rows.shape(1) != row_bytes(type, n_per_row)) {
                  throw std::invalid_argument("dequantize_rows takes uint8 [n_rows, row_bytes(type, n_per_row)]");
              }
              std::vector<float> values;
              {
                  py::gil_scoped_release release;
                  values = dequantize_rows(type, rows.data(), rows.shape(0), n_per_row);
              }
              return to_array(std::move(values), {rows.shape(0), (py::ssize_t) n_per_row});
          },
          py::arg("type"), py::arg("rows"), py::arg("n_per_row"));

    // The SelectInfer GGUF's keys, version, defaults and architectures (si_format.h): the
    // converter, bench, eval and the tests take them from here.
    py::dict keys;
    for (const FormatKey & k : kFormatKeys) {
        keys[py::str(k.id)] = py::dict(py::arg("name") = k.name, py::arg("type") = key_type_name(k.type),
                                       py::arg("per_layer") = k.per_layer, py::arg("required") = k.required,
                                       py::arg("meaning") = k.meaning);
    }
    py::list architectures;
    for (const char * a : kArchitectures) architectures.append(a);
    // the values llama.cpp would assert on, checked before it reads them (file_checks.h)
    py::list file_checks;
    for (const FileCheck & c : selectinfer::file_checks()) {
        file_checks.append(py::dict(py::arg("keys") = c.keys, py::arg("allowed") = c.allowed,
                                    py::arg("aborts_in") = c.aborts_in));
    }
    m.attr("FILE_CHECKS") = py::tuple(file_checks);
    m.attr("FORMAT") = py::dict(py::arg("version") = kFormatVersion, py::arg("keys") = keys,
                                py::arg("compute_ratio") = kDefaultComputeRatio,
                                py::arg("token_ratio") = kDefaultTokenRatio,
                                py::arg("architectures") = py::tuple(architectures));

    py::class_<ModelParams>(m, "ModelParams")
        .def(py::init<>())
        .def_readwrite("path", &ModelParams::path)
        .def_readwrite("n_ctx", &ModelParams::n_ctx)
        .def_readwrite("n_batch", &ModelParams::n_batch)
        .def_readwrite("n_threads", &ModelParams::n_threads)
        .def_readwrite("use_mmap", &ModelParams::use_mmap)
        .def_readwrite("repack", &ModelParams::repack)
        .def_readwrite("n_gpu_layers", &ModelParams::n_gpu_layers)
        .def_readwrite("flash_attn", &ModelParams::flash_attn)
        .def_readwrite("profile", &ModelParams::profile)
        .def_readwrite("profile_input_moments", &ModelParams::profile_input_moments)
        .def_readwrite("selection", &ModelParams::selection)
        .def_readwrite("verbose", &ModelParams::verbose);

    py::list strategies, step_strategies;  // the names SelectionOverrides.strategy takes; those choosing per step
    for (Strategy s : kStrategies) {
        strategies.append(strategy_name(s));
        if (step_chooses(s)) step_strategies.append(strategy_name(s));
    }
    m.attr("STRATEGIES") = py::tuple(strategies);
    m.attr("STEP_STRATEGIES") = py::tuple(step_strategies);
    m.attr("LAYER_BUDGETS") = py::make_tuple(layer_budgets_name(LayerBudgets::uniform),
                                             layer_budgets_name(LayerBudgets::profile));
    m.def(
        "layer_budget_sizes",
        [](const std::vector<std::tuple<int64_t, int64_t, double, std::vector<float>>> & layers, float compute_ratio,
           int64_t n_original, const std::string & budgets) {
            const std::optional<LayerBudgets> b = layer_budgets_named(budgets);
            if (!b) throw py::value_error("layer budgets must be " + std::string(kLayerBudgetNames) + ", got '" + budgets + "'");
            std::vector<LayerBudgetInput> inputs;
            for (const auto & [n_load, n_min, neuron_bytes, shares] : layers) {
                inputs.push_back({n_load, n_min, neuron_bytes, shares});
            }
            return layer_budget_sizes(inputs, compute_ratio, n_original, *b);
        },
        py::arg("layers"), py::arg("compute_ratio"), py::arg("n_original"), py::arg("budgets"),
        "the neurons each SelectInfer layer computes at decode (layer_budgets.h): layers are (n_load, n_min, "
        "neuron_bytes, shares) tuples");


    // Model's keywords for selective computation, one per setting of the table (selection_settings.h):
    // enums by name, ratios as numbers, switches as booleans; None leaves a setting unset.
    auto overrides = py::class_<SelectionOverrides>(m, "SelectionOverrides").def(py::init<>());
    py::list settings;
#define SI_PROPERTY(name, type, def, env, flag, help)                                                     \
    overrides.def_property(                                                                             \
        #name, [](const SelectionOverrides & o) { return o.name ? setting_to_python(*o.name) : py::none(); }, \
        [](SelectionOverrides & o, const py::object & v) { o.name = setting_from_python<type>(v, #name); });  \
    settings.append(py::dict(py::arg("name") = #name, py::arg("environment") = env, py::arg("flag") = flag, \
                             py::arg("help") = help, py::arg("values") = setting_values(type{})));
    SELECTINFER_SELECTION_SETTINGS(SI_PROPERTY)
#undef SI_PROPERTY
    m.attr("SELECTION_SETTINGS") = py::tuple(settings);

    py::class_<SamplingParams>(m, "SamplingParams")
        .def(py::init<>())
        .def_readwrite("temperature", &SamplingParams::temperature)
        .def_readwrite("top_k", &SamplingParams::top_k)
        .def_readwrite("top_p", &SamplingParams::top_p)
        .def_readwrite("seed", &SamplingParams::seed);
    m.attr("RANDOM_SEED") = kRandomSeed;

    py::class_<Stats>(m, "Stats")
        .def_readonly("n_prefill_tokens", &Stats::n_prefill_tokens)
        .def_readonly("prefill_ms", &Stats::prefill_ms)
        .def_readonly("n_decode_tokens", &Stats::n_decode_tokens)
        .def_readonly("decode_ms", &Stats::decode_ms)
        .def_readonly("model_bytes", &Stats::model_bytes)
        .def_readonly("rss_bytes", &Stats::rss_bytes)
        .def_readonly("peak_rss_bytes", &Stats::peak_rss_bytes);

    py::class_<Engine>(m, "Engine")
        .def(py::init<const ModelParams &>(), py::call_guard<py::gil_scoped_release>())
        .def("tokenize", &Engine::tokenize, py::arg("text"), py::arg("add_special"), py::arg("parse_special"))
        .def("detokenize", &Engine::detokenize, py::arg("tokens"), py::arg("render_special") = false)
        .def("token_piece",
             [](const Engine & e, llama_token t, bool special) { return py::bytes(e.token_piece(t, special)); },
             py::arg("token"), py::arg("render_special") = false)
        .def("is_eog", &Engine::is_eog)
        .def_property_readonly("n_vocab", &Engine::n_vocab)
        .def_property_readonly("n_ctx", &Engine::n_ctx)
        .def("apply_chat_template",
             [](const Engine & e, const std::vector<std::pair<std::string, std::string>> & messages, bool add_assistant,
                const std::string & tmpl) {
                 std::vector<ChatMessage> msgs;
                 for (const auto & [role, content] : messages) msgs.push_back({role, content});
                 return e.apply_chat_template(msgs, add_assistant, tmpl);
             },
             py::arg("messages"), py::arg("add_assistant") = true, py::arg("template") = "")
        .def("eval_prompt",
             [](Engine & e, const std::vector<llama_token> & tokens, bool all_logits) {
                 std::vector<float> logits;
                 {
                     py::gil_scoped_release release;
                     logits = e.eval_prompt(tokens, all_logits);
                 }
                 py::ssize_t nv = e.n_vocab();
                 if (all_logits) return to_array(std::move(logits), {(py::ssize_t) tokens.size(), nv});
                 return to_array(std::move(logits), {nv});
             },
             py::arg("tokens"), py::arg("all_logits") = false)
        .def("eval_token", &Engine::eval_token, py::call_guard<py::gil_scoped_release>())
        .def("sample", &Engine::sample, py::call_guard<py::gil_scoped_release>())
        .def("last_logits", [](const Engine & e) {
            std::vector<float> v = e.last_logits();
            py::ssize_t n = (py::ssize_t) v.size();
            return to_array(std::move(v), {n});
        })
        .def("set_sampling", &Engine::set_sampling)
        .def("clear", &Engine::clear)
        .def("token_logprobs",
             [](Engine & e, const std::vector<llama_token> & tokens) {
                 std::vector<float> lp;
                 {
                     py::gil_scoped_release release;
                     lp = e.token_logprobs(tokens);
                 }
                 py::ssize_t n = (py::ssize_t) lp.size();
                 return to_array(std::move(lp), {n});
             })
        .def_property_readonly("history", &Engine::history)
        .def("stats", &Engine::stats)
        .def("reset_stats", &Engine::reset_stats)
        .def_property_readonly("profiling", &Engine::profiling)
        .def_property_readonly("selective", &Engine::selective)
        .def("selected_neurons", &Engine::selected_neurons)
        .def("computed_counts", &Engine::computed_counts)
        .def("selection_config", [](const Engine & e) {
            const SelectionConfig c = e.selection_config();
            py::dict d;
#define SI_ITEM(name, type, def, env, flag, help) d[#name] = setting_to_python(c.name);
            SELECTINFER_SELECTION_SETTINGS(SI_ITEM)
#undef SI_ITEM
            return d;
        })
        .def("activation_sums",
             [](Engine & e, bool reset) {
                 ActivationSums a = e.activation_sums(reset);
                 py::list layers;
                 for (auto & v : a.sums) {
                     py::ssize_t n = (py::ssize_t) v.size();
                     layers.append(to_array(std::move(v), {n}));
                 }
                 return py::make_tuple(layers, a.n_tokens);
             },
             py::arg("reset") = true)
        .def("input_moments",
             [](Engine & e) {
                 ActivationSums a = e.input_moments();
                 py::list moments, sums;
                 for (auto & v : a.sums) {  // n * n + n floats: sum of h h^T, then of h
                     const auto n = (py::ssize_t) std::lround((std::sqrt(1.0 + 4.0 * (double) v.size()) - 1.0) / 2.0);
                     std::vector<float> h_sum(v.end() - n, v.end());
                     v.resize(n * n);
                     moments.append(to_array(std::move(v), {n, n}));
                     sums.append(to_array(std::move(h_sum), {n}));
                 }
                 return py::make_tuple(moments, sums, a.n_tokens);
             })
        .def("describe", &Engine::describe)
        .def("weight_buffers", &Engine::weight_buffers)
        .def("weight_placement",
             [](const Engine & e) {
                 py::dict d;
                 for (const auto & [name, p] : e.weight_placement()) d[py::str(name)] = py::make_tuple(p.ne, p.buffer);
                 return d;
             })
        .def("meta", &Engine::meta);
}
