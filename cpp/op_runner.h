// Runs one of selectinfer's ggml ops on the CPU backend with given inputs, for the op tests
// (tests/test_sparse_ops.py compares the results with numpy).
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

// op: "mul_rows" (w, x, ids), "mul_rows_t" (w, h, ids or none), "select" (act).
// Returns the output's raw bytes.
std::string run_sparse_op(const std::string & op, const std::vector<OpInput> & inputs, int n_threads,
                          int n_static = 0, int n_dynamic = 0, float alpha = 0.0f, bool by_magnitude = false);

}  // namespace selectinfer
