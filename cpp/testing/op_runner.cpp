#include "op_runner.h"

#include "ggml-backend.h"
#include "ggml.h"
#include "neuron_selection.h"
#include "sparse_ffn_ops.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <stdexcept>

namespace selectinfer {

namespace {

// A backend through ggml's registry, the CPU's by default: a build whose CPU backend is loaded at
// run time (one module per CPU variant, GGML_CPU_ALL_VARIANTS) has no other way to it. Graphs of
// tensors in plain ggml contexts run on the CPU's as they are.
class OpBackend {
public:
    explicit OpBackend(int n_threads) : OpBackend(ggml_backend_init_by_type(GGML_BACKEND_DEVICE_TYPE_CPU, nullptr), n_threads) {}
    // any device's backend; the CPU's gets n_threads
    OpBackend(ggml_backend_t backend, int n_threads) : backend_(backend) {
        if (!backend_) throw std::runtime_error("could not start the backend (no CPU backend in this build?)");
        ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(ggml_backend_get_device(backend_));
        auto set_n_threads = (ggml_backend_set_n_threads_t) ggml_backend_reg_get_proc_address(reg, "ggml_backend_set_n_threads");
        if (set_n_threads) set_n_threads(backend_, n_threads);
    }
    ~OpBackend() { ggml_backend_free(backend_); }
    OpBackend(const OpBackend &) = delete;
    OpBackend & operator=(const OpBackend &) = delete;

    ggml_backend_t get() const { return backend_; }
    void compute(ggml_cgraph * gf) {
        if (ggml_backend_graph_compute(backend_, gf) != GGML_STATUS_SUCCESS) {
            throw std::runtime_error("graph compute failed");
        }
    }

private:
    ggml_backend_t backend_ = nullptr;
};

// The backend of the device named `device` ("CPU", "CUDA0", ... as ggml names them).
// (A build whose backends are modules loaded at run time has them once selectinfer._native has
// loaded them, which importing this module does: testing_bindings.cpp.)
std::unique_ptr<OpBackend> device_backend(const std::string & device, int n_threads) {
    ggml_backend_dev_t dev = ggml_backend_dev_by_name(device.c_str());
    if (!dev) {
        std::string names;
        for (size_t i = 0; i < ggml_backend_dev_count(); ++i) names += std::string(names.empty() ? "" : ", ") + ggml_backend_dev_name(ggml_backend_dev_get(i));
        throw std::invalid_argument("no device " + device + " in this build (devices: " + names + ")");
    }
    return std::make_unique<OpBackend>(ggml_backend_dev_init(dev, nullptr), n_threads);
}

void require(bool ok, const std::string & what) {
    if (!ok) throw std::invalid_argument(what);
}

// A tensor of the given type and shape (its data set once allocated); the shape and size are
// checked first, so that a bad argument is an exception rather than an assertion inside ggml.
ggml_tensor * input_tensor(ggml_context * ctx, const OpInput & in) {
    require(in.type >= 0 && in.type < GGML_TYPE_COUNT && ggml_get_type_traits((ggml_type) in.type)->blck_size > 0,
            "unknown ggml type " + std::to_string(in.type));
    require(!in.ne.empty() && in.ne.size() <= 2, "inputs are 1-D or 2-D");
    for (int64_t n : in.ne) require(n > 0 && n < (int64_t(1) << 32), "every dimension must be in [1, 2^32)");
    require(in.ne[0] % ggml_blck_size((ggml_type) in.type) == 0, "rows must hold whole blocks of the type");
    ggml_tensor * x = ggml_new_tensor(ctx, (ggml_type) in.type, (int) in.ne.size(), in.ne.data());
    require(ggml_nbytes(x) == in.data.size(), "input size does not match its shape and type");
    return x;
}

void require_f32(const ggml_tensor * t, const char * name) {
    require(t->type == GGML_TYPE_F32, std::string(name) + " must be F32");
}

void require_row_ids(const ggml_tensor * ids, const OpInput & in, int64_t first_id, int64_t n_rows) {
    require(ids->type == GGML_TYPE_I32 && ggml_n_dims(ids) == 1, "ids must be a 1-D I32 array");
    const int32_t * id = (const int32_t *) in.data.data();
    for (int64_t j = 0; j < ids->ne[0]; ++j) {
        require(id[j] >= first_id && id[j] - first_id < n_rows,
                "row id " + std::to_string(id[j]) + " outside [" + std::to_string(first_id) + ", " +
                    std::to_string(first_id + n_rows) + ")");
    }
}

}  // namespace

std::string run_sparse_op(const std::string & op, const std::vector<OpInput> & inputs, int n_threads, int n_static,
                          int n_dynamic, float alpha, bool by_magnitude, int first_id, int score,
                          const std::string & device, const std::string & activation) {
    require(n_threads >= 1 && n_threads <= 512, "n_threads must be in [1, 512]");
    ggml_init_params params = {64 * ggml_tensor_overhead() + ggml_graph_overhead(), nullptr, /*no_alloc=*/true};
    std::unique_ptr<ggml_context, void (*)(ggml_context *)> ctx(ggml_init(params), ggml_free);
    std::vector<ggml_tensor *> t;
    for (size_t i = 0; i < inputs.size(); ++i) {
        // an input without a shape: an optional one left out (ffn_rows's gate, and those after ids)
        const bool absent = inputs[i].ne.empty() && inputs[i].data.empty();
        require(!absent || (op == "ffn_rows" && (i == 0 || i >= 5)),
                "only ffn_rows's gate, prev, gate_values and h_offset may be left out");
        t.push_back(absent ? nullptr : input_tensor(ctx.get(), inputs[i]));
    }
    auto given = [&](size_t i) { return i < t.size() ? t[i] : nullptr; };
    ggml_tensor * out;
    if (op == "mul_rows" && (t.size() == 2 || t.size() == 3)) {
        require_f32(t[1], "x");
        require(t[1]->ne[0] == t[0]->ne[0], "x must have the weight's row length");
        require(first_id >= 0 && (first_id == 0 || t.size() == 3), "first_id must be >= 0, and 0 without ids");
        if (t.size() == 3) require_row_ids(t[2], inputs[2], first_id, t[0]->ne[1]);
        out = ggml_si_mul_rows(ctx.get(), t[0], t[1], t.size() == 3 ? t[2] : nullptr, first_id);
    } else if (op == "mul_rows_t" && t.size() >= 2 && t.size() <= 4) {
        require_f32(t[1], "h");
        require(first_id >= 0 && (first_id == 0 || t.size() >= 3), "first_id must be >= 0, and 0 without ids");
        if (t.size() == 4) {
            require_f32(t[3], "h_offset");
            require(ggml_n_dims(t[3]) == 1 && t[3]->ne[0] == t[0]->ne[1], "h_offset must be [weight rows]");
            require(t[1]->ne[1] == 1, "h_offset takes one token");
        }
        if (t.size() >= 3) {
            require_row_ids(t[2], inputs[2], first_id, t[0]->ne[1]);
            require(t[2]->ne[0] == t[1]->ne[0], "h must have one value per id");
        } else {
            require(t[1]->ne[0] <= t[0]->ne[1], "h has more values than the weight has rows");
        }
        out = ggml_si_mul_rows_t(ctx.get(), t[0], t[1], t.size() >= 3 ? t[2] : nullptr, first_id,
                                 t.size() == 4 ? t[3] : nullptr);
    } else if (op == "ffn_rows" && t.size() >= 5 && t.size() <= 8) {
        // gate (or none, with gate_values), up, down_t, x, ids [, prev [, gate_values [, h_offset]]]
        require(t[0] || given(6), "ffn_rows needs the gate or its values");
        require(!t[0] || (t[0]->type == t[1]->type && ggml_are_same_shape(t[0], t[1])), "gate and up must have one type and shape");
        require(t[2]->ne[1] == t[1]->ne[1], "down_t must have the gate's rows");
        require_f32(t[3], "x");
        require(ggml_n_dims(t[3]) == 1 && t[3]->ne[0] == t[1]->ne[0], "x must be one token of the gate's row length");
        require(first_id >= 0, "first_id must be >= 0");
        require_row_ids(t[4], inputs[4], first_id, t[1]->ne[1]);
        if (ggml_tensor * prev = given(5)) {
            require_f32(prev, "prev");
            require(ggml_n_dims(prev) == 1 && prev->ne[0] == t[2]->ne[0], "prev must be [the down rows' length]");
        }
        for (size_t i : {6, 7}) {
            if (ggml_tensor * by_row = given(i)) {
                const char * name = i == 6 ? "gate_values" : "h_offset";
                require_f32(by_row, name);
                require(ggml_n_dims(by_row) == 1 && by_row->ne[0] == t[1]->ne[1], std::string(name) + " must be [gate rows]");
            }
        }
        require(activation == "silu" || activation == "gelu", "activation must be silu or gelu");
        out = ggml_si_ffn_rows(ctx.get(), t[0], t[1], t[2], t[3], t[4], first_id,
                               activation == "gelu" ? GGML_GLU_OP_GEGLU : GGML_GLU_OP_SWIGLU, given(5), given(6), given(7));
    } else if ((op == "count" && (t.size() == 1 || t.size() == 2)) || (op == "count_parts" && (t.size() == 2 || t.size() == 3))) {
        // count: act [, prev]; count_parts: act, act_rest [, prev]
        const bool parts = op == "count_parts";
        ggml_tensor * act_rest = parts ? t[1] : nullptr;
        ggml_tensor * prev = t.size() == (parts ? 3u : 2u) ? t.back() : nullptr;
        require_f32(t[0], "act");
        require(alpha >= 0 && alpha <= 1, "alpha must be in [0, 1]");
        if (act_rest) {
            require_f32(act_rest, "act_rest");
            require(act_rest->ne[1] == t[0]->ne[1], "act_rest must have act's tokens");
        }
        if (prev) {
            require_f32(prev, "prev");
            require(ggml_n_dims(prev) == 1 && prev->ne[0] == t[0]->ne[0] + (act_rest ? act_rest->ne[0] : 0),
                    "prev must be [n_load]");
        }
        out = ggml_si_count(ctx.get(), t[0], act_rest, prev, alpha, by_magnitude);
    } else if (op == "select" && (t.size() == 1 || t.size() == 2)) {
        require_f32(t[0], "counts");
        require(ggml_n_dims(t[0]) == 1, "counts must be 1-D");
        require(n_static >= 0 && n_dynamic >= 0 && n_static + n_dynamic > 0 &&
                    n_static + n_dynamic <= t[0]->ne[0],
                "need 0 < n_static + n_dynamic <= n_load");
        require(score == GGML_SI_SCORE_VALUE || score == GGML_SI_SCORE_ABS_SILU || score == GGML_SI_SCORE_ABS_GELU,
                "score must be 0 (value), 1 (|silu|) or 2 (|gelu|)");
        if (t.size() == 2) {
            require_f32(t[1], "scale");
            require(ggml_n_dims(t[1]) == 1 && t[1]->ne[0] == t[0]->ne[0] - n_static, "scale must be [n_load - n_static]");
        }
        out = ggml_si_select(ctx.get(), t[0], n_static, n_dynamic, (ggml_si_score) score, t.size() == 2 ? t[1] : nullptr);
    } else {
        throw std::invalid_argument("unknown op or wrong number of inputs: " + op);
    }
    ggml_cgraph * gf = ggml_new_graph(ctx.get());
    ggml_build_forward_expand(gf, out);
    // every tensor in the device's memory, the inputs copied in, the output copied back
    const std::unique_ptr<OpBackend> backend = device_backend(device, n_threads);
    std::unique_ptr<ggml_backend_buffer, void (*)(ggml_backend_buffer_t)> buffer(
        ggml_backend_alloc_ctx_tensors(ctx.get(), backend->get()), ggml_backend_buffer_free);
    if (!buffer) throw std::runtime_error("could not allocate the op's tensors on " + device);
    for (size_t i = 0; i < t.size(); ++i) {
        if (t[i]) ggml_backend_tensor_set(t[i], inputs[i].data.data(), 0, inputs[i].data.size());
    }
    backend->compute(gf);
    std::string result(ggml_nbytes(out), '\0');
    ggml_backend_tensor_get(out, result.data(), 0, result.size());
    return result;
}

}  // namespace selectinfer

namespace selectinfer {

namespace {

// Random values in [-1, 1) stored in `type`, row by row.
void fill_random(ggml_tensor * t, std::mt19937 & rng) {
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::vector<float> row(t->ne[0]);
    for (int64_t r = 0; r < ggml_nrows(t); ++r) {
        for (float & v : row) v = u(rng) * 0.05f;
        if (t->type == GGML_TYPE_F32) {
            std::memcpy((char *) t->data + r * t->nb[1], row.data(), row.size() * sizeof(float));
        } else {
            ggml_quantize_chunk(t->type, row.data(), (char *) t->data + r * t->nb[1], 0, 1, t->ne[0], nullptr);
        }
    }
}

// One run of a built graph (the backend keeps its work buffer between runs).
double time_graph_ms(OpBackend & cpu, ggml_cgraph * gf) {
    const auto t0 = std::chrono::steady_clock::now();
    cpu.compute(gf);
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

std::vector<std::pair<std::string, std::vector<double>>> time_ffn_layer(int type, int64_t n_embd, int64_t n_ff,
                                                                        int64_t n_load, int64_t n_static,
                                                                        int64_t n_select,
                                                                        int64_t n_tokens, int n_threads, int n_reps) {
    if (!(0 <= n_static && n_static <= n_select && 0 < n_select && n_select <= n_load && n_load <= n_ff) ||
        n_tokens < 1 || n_reps < 1) {
        throw std::invalid_argument("time_ffn_layer needs 0 <= n_static <= n_select <= n_load <= n_ff, 0 < n_select, "
                                    "n_tokens >= 1, n_reps >= 1");
    }
    const auto wt = (ggml_type) type;
    if (n_static % ggml_blck_size(wt) != 0) {
        throw std::invalid_argument("n_static must be a multiple of the type's block size (the static down projection's row)");
    }
    const size_t weights = ggml_row_size(wt, n_embd) * (3 * n_ff + 3 * n_load);
    // inputs, leaves and every step's outputs, with room to spare (graphs: 64 MiB below)
    const size_t acts = (size_t) n_tokens * (8 * n_embd + 4 * (n_ff + n_load + n_select)) * sizeof(float) * 2;
    ggml_init_params params = {weights + acts + 64 * 1024 * 1024, nullptr, false};
    std::unique_ptr<ggml_context, void (*)(ggml_context *)> ctx(ggml_init(params), ggml_free);
    ggml_context * c = ctx.get();
    std::mt19937 rng(1234);

    ggml_tensor * x = ggml_new_tensor_2d(c, GGML_TYPE_F32, n_embd, n_tokens);
    fill_random(x, rng);
    // the original layer: gate/up [n_embd, n_ff], down [n_ff, n_embd]
    ggml_tensor * gate = ggml_new_tensor_2d(c, wt, n_embd, n_ff);
    ggml_tensor * up   = ggml_new_tensor_2d(c, wt, n_embd, n_ff);
    ggml_tensor * down = ggml_new_tensor_2d(c, wt, n_ff, n_embd);
    // the SI layer as the engine loads it (si_gguf.h): gate and up in two parts, the static
    // neurons' down projection in upstream's layout, the others' transposed
    const int64_t n_dynamic = n_load - n_static;
    SiFfnWeights si;
    si.n_static = (int) n_static;
    si.gate = ggml_new_tensor_2d(c, wt, n_embd, n_static > 0 ? n_static : n_load);
    si.up = ggml_new_tensor_2d(c, wt, n_embd, n_static > 0 ? n_static : n_load);
    if (n_static > 0) {
        si.down_static = ggml_new_tensor_2d(c, wt, n_static, n_embd);
        if (n_dynamic > 0) {
            si.gate_dyn = ggml_new_tensor_2d(c, wt, n_embd, n_dynamic);
            si.up_dyn = ggml_new_tensor_2d(c, wt, n_embd, n_dynamic);
        }
    }
    if (n_dynamic > 0) si.down_t = ggml_new_tensor_2d(c, wt, n_embd, n_dynamic);
    for (ggml_tensor * t : {gate, up, down, si.gate, si.up, si.gate_dyn, si.up_dyn, si.down_static, si.down_t}) {
        if (t) fill_random(t, rng);
    }
    // a selection like the engine's: the first rows (static), then a sorted random subset
    ggml_tensor * ids = ggml_new_tensor_1d(c, GGML_TYPE_I32, n_select);
    {
        std::vector<int32_t> rows(n_load);
        std::iota(rows.begin(), rows.end(), 0);
        std::shuffle(rows.begin() + n_static, rows.end(), rng);
        std::sort(rows.begin() + n_static, rows.begin() + n_select);
        std::memcpy(ids->data, rows.data(), n_select * sizeof(int32_t));
    }

    // each step is its own graph, so that the time splits into gate+up, down and selection; the
    // down projections and the selection read random activations (leaves, not recomputed)
    auto act_of = [&](ggml_tensor * g, ggml_tensor * u) { return ggml_swiglu_split(c, g, u); };
    auto leaf = [&](int64_t rows) {
        ggml_tensor * t = ggml_new_tensor_2d(c, GGML_TYPE_F32, rows, n_tokens);
        fill_random(t, rng);
        return t;
    };
    // what a prompt computes: every loaded neuron, the static and the gathered part
    std::vector<ggml_tensor *> loaded_gate_up, loaded_down;
    if (n_static > 0) {
        loaded_gate_up.push_back(act_of(ggml_mul_mat(c, si.gate, x), ggml_mul_mat(c, si.up, x)));
        loaded_down.push_back(ggml_mul_mat(c, si.down_static, leaf(n_static)));
    }
    if (n_dynamic > 0) {
        loaded_gate_up.push_back(act_of(gathered_product(c, si.gathered_gate(), x), gathered_product(c, si.gathered_up(), x)));
        loaded_down.push_back(ggml_si_mul_rows_t(c, si.down_t, leaf(n_dynamic), nullptr, 0, nullptr));
    }
    std::vector<std::pair<std::string, std::vector<ggml_tensor *>>> steps = {
        {"dense gate+up", {act_of(ggml_mul_mat(c, gate, x), ggml_mul_mat(c, up, x))}},
        {"dense down", {ggml_mul_mat(c, down, leaf(n_ff))}},
        {"loaded gate+up", loaded_gate_up},
        {"loaded down", loaded_down},
    };
    if (n_tokens == 1) {  // the engine's decode graph: static block by mul_mat, dynamic rows by the sparse ops
        steps.push_back({"selected FFN", {build_sparse_ffn(c, si, x, ids, (int) (n_select - n_static))}});
        // the same graph op by op: the gathered gate+up and down of the chosen dynamic rows
        const int64_t n_chosen = n_select - n_static;
        if (n_chosen > 0) {
            ggml_tensor * chosen = ggml_view_1d(c, ids, n_chosen, n_static * sizeof(int32_t));
            steps.push_back({"selected gate+up", {act_of(ggml_si_mul_rows(c, si.gathered_gate(), x, chosen, n_static),
                                                         ggml_si_mul_rows(c, si.gathered_up(), x, chosen, n_static))}});
            steps.push_back({"selected down", {ggml_si_mul_rows_t(c, si.down_t, leaf(n_chosen), chosen, n_static, nullptr)}});
        }
    } else {  // a prompt computes the loaded layer and selects
        SelectionConfig frequency;  // the method's, alpha 0.2
        frequency.token_ratio = 0.2f;
        // the activations as the engine's prompt has them: the static part, then the gathered one
        const bool two_parts = n_static > 0 && n_dynamic > 0;
        ggml_tensor * act = leaf(two_parts ? n_static : n_load);
        steps.push_back({"selection", {build_selection(c, act, two_parts ? leaf(n_dynamic) : nullptr, nullptr, (int) n_static,
                                                       (int) (n_select - n_static), frequency).ids}});
    }
    std::vector<std::pair<std::string, std::vector<double>>> times;
    std::vector<ggml_cgraph *> graphs;
    for (const auto & step : steps) {
        ggml_cgraph * gf = ggml_new_graph(c);
        for (ggml_tensor * out : step.second) ggml_build_forward_expand(gf, out);
        graphs.push_back(gf);
        times.push_back({step.first, {}});
    }
    OpBackend cpu(n_threads);
    for (int r = 0; r < n_reps; ++r) {  // interleaved, so that machine noise hits every step alike
        for (size_t v = 0; v < steps.size(); ++v) times[v].second.push_back(time_graph_ms(cpu, graphs[v]));
    }
    return times;
}

}  // namespace selectinfer
