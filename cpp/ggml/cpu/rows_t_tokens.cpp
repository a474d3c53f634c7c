// Several tokens (prefill), the down projection over F32 panels: a blocked outer-product GEMM
// (the tile sizes and work items: sparse_ffn_cpu.h).
#include "sparse_ffn_cpu.h"

namespace si_cpu {

// Tokens per work item of a prompt's down projection (the reasons: MAX_TOKEN_CHUNK, sparse_ffn_cpu.h).
int64_t prompt_token_chunk(int64_t T, int64_t n_panels, int nth) {
    const int64_t chunks = ceil_div(2 * nth, n_panels);
    return std::clamp<int64_t>(round_up(ceil_div(T, chunks), 32), TOKEN_CHUNK, MAX_TOKEN_CHUNK);
}

inline void store(float * p, vfloat v) { std::memcpy(p, &v, sizeof v); }

// c[t][0..TILE_E) (+)= sum over rows j < n_rows of h[t][j] * panel[j][0..TILE_E)
template <int TT>
void tile_kernel(const float * panel, int64_t panel_stride, int64_t n_rows, const float * const * h, float * const * c,
                 bool first) {
    vfloat acc[TT][2];
    for (int t = 0; t < TT; ++t) {
        acc[t][0] = first ? vfloat{} : load_as<vfloat>(c[t]);
        acc[t][1] = first ? vfloat{} : load_as<vfloat>(c[t] + VEC);
    }
    for (int64_t j = 0; j < n_rows; ++j) {
        const vfloat w0 = load_as<vfloat>(panel + j * panel_stride), w1 = load_as<vfloat>(panel + j * panel_stride + VEC);
        for (int t = 0; t < TT; ++t) {
            const vfloat b = vfloat{} + h[t][j];
            acc[t][0] += b * w0;
            acc[t][1] += b * w1;
        }
    }
    for (int t = 0; t < TT; ++t) {
        store(c[t], acc[t][0]);
        store(c[t] + VEC, acc[t][1]);
    }
}

template <int TT>
void tile_dispatch(int tt, const float * panel, int64_t stride, int64_t n_rows, const float * const * h,
                   float * const * c, bool first) {
    if constexpr (TT > 0) {
        if (tt == TT) return tile_kernel<TT>(panel, stride, n_rows, h, c, first);
        tile_dispatch<TT - 1>(tt, panel, stride, n_rows, h, c, first);
    }
}

void mul_rows_t_tokens(const ggml_compute_params * params, ggml_tensor * dst) {
    const ggml_tensor * w = dst->src[0];
    const ggml_tensor * hs = dst->src[1];
    const RowIds row_of(dst);
    const int64_t n = hs->ne[0], T = hs->ne[1], E = w->ne[0];
    const int64_t panel_width = std::max<int64_t>(64, ggml_blck_size(w->type));  // whole blocks
    float * panel = (float *) params->wdata + params->ith * (PANEL_ROWS * panel_width + 64);
    auto h_row = [&](int64_t t) { return (const float *) ((const char *) hs->data + t * hs->nb[1]); };
    auto c_row = [&](int64_t t) { return (float *) ((char *) dst->data + t * dst->nb[1]); };

    const PromptItems items(E, panel_width, T, params->nth);
    for (int64_t i = params->ith; i < items.count; i += params->nth) {
        const auto [e0, width, t0, t1] = items[i];
        if (n == 0) {
            for (int64_t t = t0; t < t1; ++t) std::memset(c_row(t) + e0, 0, width * sizeof(float));
        }
        for (int64_t j0 = 0; j0 < n; j0 += PANEL_ROWS) {
            const int64_t rows = std::min(PANEL_ROWS, n - j0);
            rows_to_float(w, row_of, j0, rows, e0, width, panel, panel_width);
            for (int64_t ts = t0; ts < t1; ts += TILE_T) {
                const int tt = (int) std::min<int64_t>(TILE_T, t1 - ts);
                const float * h[TILE_T];
                float * c[TILE_T];
                for (int t = 0; t < tt; ++t) h[t] = h_row(ts + t) + j0;
                int64_t e = 0;
                for (; e + TILE_E <= width; e += TILE_E) {
                    for (int t = 0; t < tt; ++t) c[t] = c_row(ts + t) + e0 + e;
                    tile_dispatch<TILE_T>(tt, panel + e, panel_width, rows, h, c, j0 == 0);
                }
                for (; e < width; ++e) {  // columns left over when E is not a multiple of TILE_E
                    for (int t = 0; t < tt; ++t) {
                        float sum = j0 == 0 ? 0.0f : c_row(ts + t)[e0 + e];
                        for (int64_t j = 0; j < rows; ++j) sum += h[t][j] * panel[j * panel_width + e];
                        c_row(ts + t)[e0 + e] = sum;
                    }
                }
            }
        }
    }
}

}  // namespace si_cpu
