// Helpers of the row ops' kernel families over gathered rows (sparse_ffn_cpu.h): row ids checked,
// columns split among threads, rows added or converted with the fused block loops (block_loops.h).
#include "sparse_ffn_cpu.h"

namespace si_cpu {

// Every row within the weight's rows (upstream's get_rows checks its indices the same way).
void check_row_ids(const ggml_tensor * dst, const char * op) {
    const ggml_tensor * w = dst->src[dst->op == GGML_OP_SI_FFN_ROWS ? 1 : 0];  // ffn_rows: up (its gate may be absent)
    const RowIds row(dst);
    for (int64_t j = 0; j < row.n; ++j) {
        if (row(j) < 0 || row(j) >= w->ne[1]) {
            GGML_ABORT("%s: row id %d (first id %lld) outside the %lld rows of %s", op, row.ids[j],
                       (long long) row.first_id, (long long) w->ne[1], w->name);
        }
    }
}

// Columns [c0, c1) of t handled by thread ith: whole blocks of t's type.
void column_range(const ggml_tensor * t, int ith, int nth, int64_t & c0, int64_t & c1) {
    const int64_t blck = ggml_blck_size(t->type);
    const int64_t n_blocks = t->ne[0] / blck;
    const int64_t per = ceil_div(n_blocks, nth);
    c0 = std::min(n_blocks, per * ith) * blck;
    c1 = std::min(n_blocks, per * (ith + 1)) * blck;
}

// y[0..E) += sum_k v[k] * rows[k][0..E) for nr <= ADD_GROUP rows; false when this type (or this E,
// or this CPU) has no fused loop and the caller converts row by row instead.
bool add_rows_fused(ggml_type type, const char * const * rows, const float * v, int nr, int64_t E, float * y,
                    const char * const * next, int n_next) {
    if (E % 32 != 0 || !has_block_loop(type)) return false;
    with_block_type<AddRows>(type, rows, v, nr, E, y, next, n_next);
    return true;
}

// Weight rows r[0..n) of w, columns [c0, c0 + width) (whole blocks), as F32 rows of `stride` floats.
void rows_to_float(const ggml_tensor * w, const RowIds & row_of, int64_t j0, int64_t n, int64_t c0, int64_t width,
                   float * out, int64_t stride) {
    if (w->type != GGML_TYPE_F32 && has_block_loop(w->type) && c0 % 32 == 0 && width % 32 == 0) {
        for (int64_t j = 0; j < n; ++j) {
            with_block_type<BlocksToFloat>(w->type, (const char *) w->data + row_of(j0 + j) * w->nb[1], c0 / 32,
                                           width / 32, out + j * stride);
        }
        return;
    }
    const size_t offset = ggml_row_size(w->type, c0);
    const auto to_float = ggml_get_type_traits(w->type)->to_float;
    for (int64_t j = 0; j < n; ++j) {
        const char * row = (const char *) w->data + row_of(j0 + j) * w->nb[1] + offset;
        float * o = out + j * stride;
        switch (w->type) {
            case GGML_TYPE_F32:  std::memcpy(o, row, width * sizeof(float)); break;
            case GGML_TYPE_F16:  ggml_cpu_fp16_to_fp32((const ggml_fp16_t *) row, o, width); break;  // SIMD
            case GGML_TYPE_BF16: ggml_cpu_bf16_to_fp32((const ggml_bf16_t *) row, o, width); break;
            default:             to_float(row, o, width); break;
        }
    }
}

}  // namespace si_cpu
