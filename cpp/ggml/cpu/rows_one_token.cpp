// One token (decode): gate and up as rows dotted with x (float rows in the fused loops, 4- and
// 8-bit rows in integers where the CPU has those loops), the down projection as rows added
// (mul_rows_t), and the gathered neurons' whole FFN in one op (ffn_rows).
#include "sparse_ffn_cpu.h"

namespace si_cpu {

// One token (decode), gate and up: rows GROUP at a time, groups dealt out to threads in turn
// (the static rows come first and are contiguous, the dynamic ones scattered and slower to read).
void mul_rows_one_token(const ggml_compute_params * params, ggml_tensor * dst) {
    const ggml_tensor * w = dst->src[0];
    const RowIds row_of(dst);
    const float * x = (const float *) dst->src[1]->data;
    const int64_t n = dst->ne[0], K = w->ne[0];
    const int ith = params->ith, nth = params->nth;
    for (int64_t j = ith * GROUP; j < n; j += nth * GROUP) {
        const int nr = (int) std::min<int64_t>(GROUP, n - j);
        const char * rows[GROUP];
        for (int k = 0; k < nr; ++k) rows[k] = (const char *) w->data + row_of(j + k) * w->nb[1];
        for (int64_t k = j + nth * GROUP; k < std::min(n, j + (nth + 1) * GROUP); ++k) {
            prefetch_row_start((const char *) w->data + row_of(k) * w->nb[1], w->nb[1]);
        }
        with_block_type<DotRows>(w->type, (const char * const *) rows, nr, x, K, (float *) dst->data + j);
    }
}

#if defined(SI_INT_DOTS)
// DotRowsInt<T>::run for a type that has_int_dots (block_loops.h: the one list of those types).
template <ggml_type T> struct IntDots {
    template <typename... A> static void run(A... args) {
        if constexpr (has_int_dots<T>) {
            DotRowsInt<T>::run(args...);
        } else {
            GGML_ABORT("no integer dot products for type %s", ggml_type_name(T));
        }
    }
};

// DotRowsInt<T>::arrange_input for a type that has_int_dots.
template <ggml_type T> struct IntDotsInput {
    static void run(const Int8Vector & x, int64_t K) {
        if constexpr (has_int_dots<T>) DotRowsInt<T>::arrange_input(x, K);
    }
};

static bool has_int_dots_for(ggml_type type) {
    switch (type) {
#define SI_CASE(T) case GGML_TYPE_##T: return has_int_dots<GGML_TYPE_##T>;
        GGML_SI_FUSED_TYPES(SI_CASE)
#undef SI_CASE
        default: return false;
    }
}

// One token (decode), gate and up of 4- and 8-bit rows: x quantized once (thread 0), then rows
// GROUP at a time in integers, groups dealt out in turn, each thread's next group read ahead.
void mul_rows_int_one_token(const ggml_compute_params * params, ggml_tensor * dst) {
    const ggml_tensor * w = dst->src[0];
    const RowIds row_of(dst);
    const int64_t n = dst->ne[0], K = w->ne[0];
    const int ith = params->ith, nth = params->nth;
    const Int8Vector xq = int8_vector_at(params->wdata, K);
    if (ith == 0) {
        quantize_int8((const float *) dst->src[1]->data, K, xq);
        with_block_type<IntDotsInput>(w->type, xq, K);
    }
    ggml_barrier(params->threadpool);
    auto row = [&](int64_t j) { return (const char *) w->data + row_of(j) * w->nb[1]; };
    for (int64_t j = ith * GROUP; j < n; j += nth * GROUP) {
        const int nr = (int) std::min<int64_t>(GROUP, n - j);
        const char * rows[GROUP], * next[GROUP];
        for (int k = 0; k < nr; ++k) rows[k] = row(j + k);
        int n_next = 0;
        for (int64_t k = j + nth * GROUP; k < std::min(n, j + (nth + 1) * GROUP); ++k) next[n_next++] = row(k);
        with_block_type<IntDots>(w->type, (const char * const *) rows, nr, xq, K, (float *) dst->data + j,
                                 (const char * const *) next, n_next);
    }
}
#endif

// After a barrier: out[c] = prev[c] (if given) + the sum over the nth threads' private rows (thread
// t's at y0 + t * stride floats) for this thread's columns of dst.
static void sum_thread_rows(const ggml_compute_params * params, ggml_tensor * dst, const float * y0, size_t stride,
                     const float * prev) {
    int64_t c0, c1;
    column_range(dst, params->ith, params->nth, c0, c1);
    float * out = (float *) dst->data;
    for (int64_t c = c0; c < c1; ++c) {
        float sum = 0.0f;
        for (int t = 0; t < params->nth; ++t) sum += y0[t * stride + c];
        out[c] = prev ? prev[c] + sum : sum;
    }
}

// One token (decode): threads split the neurons; each adds its rows, ADD_GROUP at a time, into a
// private output row, and the private rows are summed at the end.
void mul_rows_t_one_token(const ggml_compute_params * params, ggml_tensor * dst) {
    const ggml_tensor * w = dst->src[0];
    const RowIds row_of(dst);
    const float * h = (const float *) dst->src[1]->data;
    const float * h_offset = dst->src[3] ? (const float *) dst->src[3]->data : nullptr;  // by weight row
    const int64_t n = dst->src[1]->ne[0], E = w->ne[0];
    const int ith = params->ith, nth = params->nth;
    const int64_t stride = E + 64;  // floats per thread buffer, apart by a cache line or more
    float * y = (float *) params->wdata + (int64_t) ith * 2 * stride;
    float * chunk = y + stride;
    std::memset(y, 0, E * sizeof(float));
    const size_t row_size = ggml_row_size(w->type, E);
    // groups dealt out in turn: the static rows come first and are contiguous, the dynamic ones
    // scattered (slower to read), so contiguous halves would leave one thread waiting
    for (int64_t j = ith * ADD_GROUP; j < n; j += nth * ADD_GROUP) {
        const int nr = (int) std::min<int64_t>(ADD_GROUP, n - j);
        const char * rows[ADD_GROUP], * next[ADD_GROUP];
        for (int k = 0; k < nr; ++k) rows[k] = (const char *) w->data + row_of(j + k) * w->nb[1];
        int n_next = 0;  // this thread's next group, read ahead while this one is added
        for (int64_t k = j + nth * ADD_GROUP; k < std::min(n, j + (nth + 1) * ADD_GROUP); ++k) {
            next[n_next++] = (const char *) w->data + row_of(k) * w->nb[1];
        }
        float v[ADD_GROUP];
        for (int k = 0; k < nr; ++k) v[k] = h_offset ? h[j + k] - h_offset[row_of(j + k)] : h[j + k];
        if (add_rows_fused(w->type, rows, v, nr, E, y, next, n_next)) continue;
        for (int k = 0; k < n_next; ++k) prefetch_row_start(next[k], row_size);
        for (int k = 0; k < nr; ++k) {
            if (v[k] == 0.0f) continue;
            rows_to_float(w, row_of, j + k, 1, 0, E, chunk, E);
            ggml_vec_mad_f32((int) E, y, chunk, v[k]);
        }
    }
    ggml_barrier(params->threadpool);
    sum_thread_rows(params, dst, (const float *) params->wdata, 2 * stride, nullptr);
}

// --- one token, the gathered neurons' whole FFN in one op ----------------------------------------
// As ops of their own, the gathered gate, up, activation, down projection and the sum with the
// static block are five graph nodes a layer, each ending at a barrier where both threads wait for
// the slower (ggml_barrier took 16% of a decode step's samples on the default model, 2 threads).
// Here each thread takes groups of ADD_GROUP neurons in turn, as mul_rows_t_one_token deals them,
// and runs the whole FFN of a group: its gate and up rows dotted with x as ggml_si_mul_rows does,
// the activation as upstream's GLU op does, its down rows added into the thread's output row as
// mul_rows_t_one_token does; so the values are those of the five ops. x is quantized (or
// converted) by each thread for itself rather than once behind a barrier: one barrier in all,
// before the threads' rows are summed. A step that chose its neurons by their gate (gate-guided)
// passes the gate's values, so that only the up and down rows are read, and the compensation's
// nu is taken off each activation as mul_rows_t_one_token does.

// The way a weight type's rows are dotted with one token (DotPath: sparse_ffn_cpu.h).
DotPath one_token_dot_path(ggml_type type, int64_t K) {
    const bool float_weights = type == GGML_TYPE_F32 || type == GGML_TYPE_F16 || type == GGML_TYPE_BF16;
    if (K % 32 == 0 && float_weights && has_block_loop(type)) return DotPath::float_rows;
#if defined(SI_INT_DOTS)
    if (K % 32 == 0 && has_int_dots_for(type)) return DotPath::int_rows;
#endif
    return DotPath::vec_dot;
}

// (a thread's scratch: FfnRowsScratch, sparse_ffn_cpu.h)
void ffn_rows_one_token(const ggml_compute_params * params, ggml_tensor * dst) {
    const ggml_tensor * gate = dst->src[0], * up = dst->src[1], * down = dst->src[2], * prev = dst->src[5];
    const float * x = (const float *) dst->src[3]->data;
    // by weight row: the gate's values where a step has them already, the compensation's nu
    const float * gate_values = dst->src[6] ? (const float *) dst->src[6]->data : nullptr;
    const float * h_offset = dst->src[7] ? (const float *) dst->src[7]->data : nullptr;
    const RowIds row_of(dst);
    const ggml_glu_op glu = (ggml_glu_op) ggml_get_op_params_i32(dst, GGML_SI_FFN_ROWS_GLU);
    const int64_t n = row_of.n, K = up->ne[0], E = down->ne[0];
    const int ith = params->ith, nth = params->nth;
    const FfnRowsScratch scratch(params->wdata, ith, up->type, K, E);
    std::memset(scratch.y, 0, E * sizeof(float));

    const DotPath path = one_token_dot_path(up->type, K);  // gate's type too (when given)
    const auto * traits = ggml_get_type_traits_cpu(up->type);
#if defined(SI_INT_DOTS)
    const Int8Vector xq = int8_vector_at(scratch.x, K);
#endif
    if (path == DotPath::int_rows) {
#if defined(SI_INT_DOTS)
        quantize_int8(x, K, xq);
        with_block_type<IntDotsInput>(up->type, xq, K);
#endif
    } else if (path == DotPath::vec_dot && traits->vec_dot_type != GGML_TYPE_F32) {
        ggml_get_type_traits_cpu(traits->vec_dot_type)->from_float(x, scratch.x, K);
    }
    const char * x_vdt = traits->vec_dot_type == GGML_TYPE_F32 ? (const char *) x : scratch.x;
    // gate or up values of rows[0..nr): GROUP rows per call of the fused loops
    auto dot_rows = [&](const ggml_tensor * w, const char * const * rows, int nr, [[maybe_unused]] const char * const * next,
                        [[maybe_unused]] int n_next, float * out) {
        for (int k0 = 0; k0 < nr; k0 += GROUP) {
            const int m = std::min(GROUP, nr - k0);
            if (path == DotPath::float_rows) {
                with_block_type<DotRows>(w->type, rows + k0, m, x, K, out + k0);
#if defined(SI_INT_DOTS)
            } else if (path == DotPath::int_rows) {
                const int m_next = std::max(0, std::min(GROUP, n_next - k0));
                with_block_type<IntDots>(w->type, rows + k0, m, xq, K, out + k0, next + k0, m_next);
#endif
            } else {
                for (int k = k0; k < k0 + m; ++k) traits->vec_dot((int) K, out + k, 0, rows[k], 0, x_vdt, 0, 1);
            }
        }
    };
    const size_t down_row_bytes = ggml_row_size(down->type, E);
    // the gate, up and down rows of neurons j0 .. j0 + count - 1
    auto rows_of = [&](int64_t j0, int count, const char ** g, const char ** u, const char ** d) {
        for (int k = 0; k < count; ++k) {
            const int64_t r = row_of(j0 + k);
            g[k] = gate ? (const char *) gate->data + r * gate->nb[1] : nullptr;
            u[k] = (const char *) up->data + r * up->nb[1];
            d[k] = (const char *) down->data + r * down->nb[1];
        }
    };
    for (int64_t j = ith * ADD_GROUP; j < n; j += nth * ADD_GROUP) {
        const int nr = (int) std::min<int64_t>(ADD_GROUP, n - j);
        const int64_t j_next = j + nth * ADD_GROUP;
        const int n_next = (int) std::clamp<int64_t>(n - j_next, 0, ADD_GROUP);
        const char * g_rows[ADD_GROUP], * u_rows[ADD_GROUP], * d_rows[ADD_GROUP];
        const char * g_next[ADD_GROUP], * u_next[ADD_GROUP], * d_next[ADD_GROUP];
        rows_of(j, nr, g_rows, u_rows, d_rows);
        rows_of(j_next, n_next, g_next, u_next, d_next);
        float g[ADD_GROUP], u[ADD_GROUP], h[ADD_GROUP];
        if (gate_values) {
            for (int k = 0; k < nr; ++k) g[k] = gate_values[row_of(j + k)];
        } else {
            dot_rows(gate, g_rows, nr, g_next, n_next, g);
        }
        dot_rows(up, u_rows, nr, u_next, n_next, u);
        if (glu == GGML_GLU_OP_GEGLU) {
            ggml_vec_geglu_f32(nr, h, g, u);
        } else {
            ggml_vec_swiglu_f32(nr, h, g, u);
        }
        if (h_offset) {
            for (int k = 0; k < nr; ++k) h[k] -= h_offset[row_of(j + k)];
        }
        if (add_rows_fused(down->type, d_rows, h, nr, E, scratch.y, d_next, n_next)) continue;
        for (int k = 0; k < n_next; ++k) prefetch_row_start(d_next[k], down_row_bytes);
        for (int k = 0; k < nr; ++k) {
            if (h[k] == 0.0f) continue;
            rows_to_float(down, row_of, j + k, 1, 0, E, scratch.chunk, E);
            ggml_vec_mad_f32((int) E, scratch.y, scratch.chunk, h[k]);
        }
    }
    ggml_barrier(params->threadpool);
    sum_thread_rows(params, dst, FfnRowsScratch(params->wdata, 0, up->type, K, E).y,
                    FfnRowsScratch::per_thread_bytes(up->type, K, E) / sizeof(float),
                    prev ? (const float *) prev->data : nullptr);
}

}  // namespace si_cpu
