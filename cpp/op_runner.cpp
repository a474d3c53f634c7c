#include "op_runner.h"

#include "ggml-cpu.h"
#include "ggml.h"
#include "sparse_ffn_ops.h"

#include <cstring>
#include <memory>
#include <stdexcept>

namespace selectinfer {

std::string run_sparse_op(const std::string & op, const std::vector<OpInput> & inputs, int n_threads, int n_static,
                          int n_dynamic, float alpha, bool by_magnitude) {
    size_t bytes = 16 * 1024 * 1024;
    for (const auto & in : inputs) bytes += in.data.size() * 2 + 1024;
    ggml_init_params params = {bytes * 4, nullptr, false};
    std::unique_ptr<ggml_context, void (*)(ggml_context *)> ctx(ggml_init(params), ggml_free);
    std::vector<ggml_tensor *> t;
    for (const auto & in : inputs) {
        ggml_tensor * x = ggml_new_tensor(ctx.get(), (ggml_type) in.type, (int) in.ne.size(), in.ne.data());
        if (ggml_nbytes(x) != in.data.size()) throw std::invalid_argument("input size does not match its shape and type");
        std::memcpy(x->data, in.data.data(), in.data.size());
        t.push_back(x);
    }
    ggml_tensor * out;
    if (op == "mul_rows" && t.size() == 3) {
        out = ggml_si_mul_rows(ctx.get(), t[0], t[1], t[2]);
    } else if (op == "mul_rows_t" && (t.size() == 2 || t.size() == 3)) {
        out = ggml_si_mul_rows_t(ctx.get(), t[0], t[1], t.size() == 3 ? t[2] : nullptr);
    } else if (op == "select" && t.size() == 1) {
        out = ggml_si_select(ctx.get(), t[0], n_static, n_dynamic, alpha, by_magnitude);
    } else {
        throw std::invalid_argument("unknown op or wrong number of inputs: " + op);
    }
    ggml_cgraph * gf = ggml_new_graph(ctx.get());
    ggml_build_forward_expand(gf, out);
    if (ggml_graph_compute_with_ctx(ctx.get(), gf, n_threads) != GGML_STATUS_SUCCESS) {
        throw std::runtime_error("graph compute failed");
    }
    return std::string((const char *) out->data, ggml_nbytes(out));
}

}  // namespace selectinfer
