// mul_rows through ggml's own vec_dot for the weight type, row by row (x converted once to the
// type's vec_dot_type), like upstream's mul_mat: the kernel of the types and batches no other
// family takes (sparse_ffn_cpu.cpp).
#include "sparse_ffn_cpu.h"

namespace si_cpu {

void mul_rows_vec_dot(const ggml_compute_params * params, ggml_tensor * dst) {
    const ggml_tensor * w = dst->src[0];
    const ggml_tensor * x = dst->src[1];
    const RowIds row_of(dst);
    const int64_t K = x->ne[0], T = x->ne[1], n = dst->ne[0];
    const auto * traits = ggml_get_type_traits_cpu(w->type);
    const ggml_type vdt = traits->vec_dot_type;
    const size_t x_row = ggml_row_size(vdt, K);
    const int ith = params->ith, nth = params->nth;
    // the activation, converted once to the type the weight's dot product wants
    const char * xq = (const char *) x->data;
    if (x->type != vdt) {
        char * wdata = (char *) params->wdata;
        const auto from_float = ggml_get_type_traits_cpu(vdt)->from_float;
        for (int64_t t = ith; t < T; t += nth) {
            from_float((const float *) ((const char *) x->data + t * x->nb[1]), wdata + t * x_row, K);
        }
        ggml_barrier(params->threadpool);
        xq = wdata;
    }
    // rows in chunks dealt out to threads in turn: the static rows come first and are contiguous,
    // the dynamic ones scattered (slower to read), so contiguous halves would leave a thread waiting
    const int64_t chunk = 16;
    // one vec_dot call reads a row in a burst: a scattered row must already be on its way, a row
    // only one ahead is not (measured on Zen 4: 1.7x the dense layer's time per row, 1.2-1.3x
    // when the row about 5 KiB ahead is read whole into L2)
    const int64_t ahead = std::clamp<int64_t>((5120 + (int64_t) w->nb[1] - 1) / (int64_t) w->nb[1], 2, chunk - 1);
    for (int64_t c0 = ith * chunk; c0 < n; c0 += nth * chunk) {
        const int64_t c1 = std::min(n, c0 + chunk);
        for (int64_t j = c0; j < c1; ++j) {
            const char * row = (const char *) w->data + row_of(j) * w->nb[1];
            // this thread's row `ahead` places on (past the other threads' chunks), read whole
            int64_t later = j + ahead;
            if (later >= c0 + chunk) later += (nth - 1) * chunk;
            if (later < n) prefetch_row_to_l2((const char *) w->data + row_of(later) * w->nb[1], w->nb[1]);
            for (int64_t t = 0; t < T; ++t) {
                float * out = (float *) ((char *) dst->data + t * dst->nb[1]) + j;
                traits->vec_dot((int) K, out, 0, row, 0, xq + t * x_row, 0, 1);
            }
        }
    }
}

}  // namespace si_cpu
