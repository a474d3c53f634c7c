// Runs one of selectinfer's ggml ops on a device (the CPU, or a GPU of a CUDA build) with given
// inputs, for the op tests (tests/test_sparse_ops.py compares the CPU's results with numpy,
// tests/test_cuda.py the GPU's with the CPU's).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace selectinfer {

struct OpInput {
    int                  type;  // ggml_type
    std::vector<int64_t> ne;    // ggml order
    std::string          data;  // raw bytes in `type`
};

// op: "mul_rows" (w, x, ids or none; first_id), "mul_rows_t" (w, h, ids or none, h_offset with ids;
// first_id), "ffn_rows" (gate, up, down_t, x, ids, then prev, gate_values and h_offset, each
// optional, as is the gate given its values: an input without shape or data is left out;
// first_id, activation "silu" or "gelu"), "count" (act, prev or none; alpha, by_magnitude),
// "select" (counts; n_static, n_dynamic, score: enum ggml_si_score). device: a ggml device name ("CPU", "CUDA0"). Returns the output's raw
// bytes; inputs that do not fit the op are std::invalid_argument.
std::string run_sparse_op(const std::string & op, const std::vector<OpInput> & inputs, int n_threads,
                          int n_static = 0, int n_dynamic = 0, float alpha = 0.0f, bool by_magnitude = false,
                          int first_id = 0, int score = 0, const std::string & device = "CPU",
                          const std::string & activation = "silu");


// One SwiGLU FFN layer with random weights in `type` (n_embd, n_ff original neurons, n_load
// loaded of which the first n_static are static, n_select computed at decode) on n_tokens tokens with the real kernels, each step run
// n_reps times (interleaved); milliseconds per run of each step, in order:
//   "dense gate+up", "dense down"    upstream mul_mat over all n_ff neurons (the original model),
//   "loaded gate+up", "loaded down"  the SI layer computing every loaded neuron,
//   one token: "selected FFN"        the engine's decode graph over n_select rows (build_sparse_ffn),
//              "selected gate+up", "selected down"  its gathered dynamic rows alone (when any);
//   more:      "selection"           the prompt's neuron selection (the prompt computes "loaded").
std::vector<std::pair<std::string, std::vector<double>>> time_ffn_layer(int type, int64_t n_embd, int64_t n_ff,
                                                                        int64_t n_load, int64_t n_static,
                                                                        int64_t n_select,
                                                                        int64_t n_tokens, int n_threads, int n_reps);

}  // namespace selectinfer
