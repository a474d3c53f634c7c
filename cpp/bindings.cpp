// selectinfer._native: a thin binding of engine.h. The Python API (python/selectinfer/runtime/model.py)
// builds the user-facing Model on top of it.
#include "compensation.h"
#include "engine.h"
#include "gguf_meta.h"
#include "op_runner.h"
#include "quant_rows.h"
#include "sparse_ffn_ops.h"

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cmath>
#include <cstring>

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
    m.def("system_info", [] {
        init_backends();  // a build that loads its CPU backend at run time has none before
        return std::string(llama_print_system_info());
    });
    m.def("process_rss_bytes", &process_rss_bytes);
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
    m.def("sparse_fused_types", [] {
        std::vector<std::string> names;
        for (int t = 0; t < GGML_TYPE_COUNT; ++t) {
            if (ggml_get_type_traits((ggml_type) t)->blck_size > 0 && ggml_si_has_fused_loop((ggml_type) t)) {
                names.emplace_back(ggml_type_name((ggml_type) t));
            }
        }
        return names;
    }, "weight types with a fused loop in the sparse row ops on this build");
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
    m.def("run_sparse_op",
          [](const std::string & op, const std::vector<std::tuple<int, std::vector<int64_t>, py::bytes>> & inputs,
             int n_threads, int n_static, int n_dynamic, float alpha, bool by_magnitude, int first_id, int score,
             const std::string & device, const std::string & activation) {
              std::vector<OpInput> ins;
              for (const auto & [type, ne, data] : inputs) ins.push_back({type, ne, std::string(data)});
              std::string out;
              {
                  py::gil_scoped_release release;
                  out = run_sparse_op(op, ins, n_threads, n_static, n_dynamic, alpha, by_magnitude, first_id, score, device,
                                      activation);
              }
              return py::bytes(out);
          },
          py::arg("op"), py::arg("inputs"), py::arg("n_threads") = 1, py::arg("n_static") = 0,
          py::arg("n_dynamic") = 0, py::arg("alpha") = 0.0f, py::arg("by_magnitude") = false, py::arg("first_id") = 0,
          py::arg("score") = 0, py::arg("device") = "CPU", py::arg("activation") = "silu",
          "runs one sparse FFN op on a device, CPU or e.g. CUDA0 (inputs: (ggml type, ne, raw bytes)); returns raw output");
    m.def("time_ffn_layer", &time_ffn_layer, py::arg("type"), py::arg("n_embd"), py::arg("n_ff"), py::arg("n_load"),
          py::arg("n_static"), py::arg("n_select"), py::arg("n_tokens"), py::arg("n_threads"), py::arg("n_reps"),
          py::call_guard<py::gil_scoped_release>(),
          "times one FFN layer's steps with random weights: [(step, [ms per run])] (op_runner.h)");
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

    m.def(
        "dropped_means",
        [](const std::vector<float> & gate_rms, const std::vector<float> & up_slope, int64_t n_kept,
           const std::string & activation, const std::vector<float> & gate_mean, const std::vector<float> & up_mean,
           const std::vector<float> & up_rms) {
            if (activation != "silu" && activation != "gelu") throw py::value_error("activation must be silu or gelu");
            return dropped_means({gate_rms, up_slope, gate_mean, up_mean, up_rms}, n_kept,
                                 activation == "gelu" ? GatedActivation::gelu : GatedActivation::silu);
        },
        py::arg("gate_rms"), py::arg("up_slope"), py::arg("n_kept"), py::arg("activation"),
        py::arg("gate_mean") = std::vector<float>{}, py::arg("up_mean") = std::vector<float>{},
        py::arg("up_rms") = std::vector<float>{},
        "each neuron's expected activation when a step that keeps n_kept of them drops it (compensation.h)");

    py::class_<SelectionOverrides>(m, "SelectionOverrides")
        .def(py::init<>())
        .def_property(
            "strategy",
            [](const SelectionOverrides & o) -> std::optional<std::string> {
                if (!o.strategy) return std::nullopt;
                return std::string(strategy_name(*o.strategy));
            },
            [](SelectionOverrides & o, const std::optional<std::string> & name) {
                o.strategy = name ? strategy_named(*name) : std::nullopt;
                if (name && !o.strategy) {
                    throw py::value_error("strategy must be " + std::string(kStrategyNames) + ", got '" + *name + "'");
                }
            })
        .def_readwrite("compute_ratio", &SelectionOverrides::compute_ratio)
        .def_property(
            "layer_budgets",
            [](const SelectionOverrides & o) -> std::optional<std::string> {
                if (!o.layer_budgets) return std::nullopt;
                return std::string(layer_budgets_name(*o.layer_budgets));
            },
            [](SelectionOverrides & o, const std::optional<std::string> & name) {
                o.layer_budgets = name ? layer_budgets_named(*name) : std::nullopt;
                if (name && !o.layer_budgets) {
                    throw py::value_error("layer budgets must be " + std::string(kLayerBudgetNames) + ", got '" + *name + "'");
                }
            })
        .def_readwrite("token_ratio", &SelectionOverrides::token_ratio)
        .def_readwrite("by_magnitude", &SelectionOverrides::by_magnitude)
        .def_readwrite("dense", &SelectionOverrides::dense)
        .def_readwrite("coreinfer", &SelectionOverrides::coreinfer)
        .def_readwrite("compensate", &SelectionOverrides::compensate);

    py::class_<SamplingParams>(m, "SamplingParams")
        .def(py::init<>())
        .def_readwrite("temperature", &SamplingParams::temperature)
        .def_readwrite("top_k", &SamplingParams::top_k)
        .def_readwrite("top_p", &SamplingParams::top_p)
        .def_readwrite("seed", &SamplingParams::seed);
    m.def("validate_sampling", &validate);
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
            SelectionConfig c = e.selection_config();
            py::dict d;
            d["strategy"] = strategy_name(c.strategy);
            d["compute_ratio"] = c.compute_ratio;
            d["layer_budgets"] = layer_budgets_name(c.layer_budgets);
            d["token_ratio"] = c.token_ratio;
            d["select_by"] = c.by_magnitude ? "magnitude" : "value";
            d["dense"] = c.dense;
            d["coreinfer"] = c.coreinfer;
            d["compensate"] = c.compensate;
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
