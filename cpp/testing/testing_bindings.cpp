// selectinfer._testing: what the tests and benchmarks need beyond the runtime API (one op run
// alone, one FFN layer timed, the compensation's means, the fused-loop types); a separate module,
// so that neither the runtime extension nor selectinfer-cli carries it.
#include "compensation.h"
#include "op_runner.h"
#include "sparse_ffn_ops.h"

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

namespace py = pybind11;
using namespace selectinfer;

PYBIND11_MODULE(_testing, m) {
    m.doc() = "selectinfer test and benchmark helpers (not part of the runtime API)";
    // The engine's process-wide state (the backends it loads at run time, llama.cpp's log, whose
    // errors it reports) is _native's: this module only uses it. (A second copy of the engine here
    // would take llama.cpp's log over where libllama is a shared library.)
    py::module_::import("selectinfer._native").attr("system_info")();

    m.def("sparse_fused_types", [] {
        std::vector<std::string> names;
        for (int t = 0; t < GGML_TYPE_COUNT; ++t) {
            if (ggml_get_type_traits((ggml_type) t)->blck_size > 0 && ggml_si_has_fused_loop((ggml_type) t)) {
                names.emplace_back(ggml_type_name((ggml_type) t));
            }
        }
        return names;
    }, "weight types with a fused loop in the sparse row ops on this build");
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
}
