// --- several tokens, quantized rows on x86 with AVX-512 VNNI: the same product in integers -----
// The original's down projection runs on upstream's integer kernels (the K-quants' tiled VNNI
// GEMM, the Q4_0/Q8_0 repacked ones), 2.5x faster per row than the F32 GEMM above on a 3B layer
// (Q4_K, Q5_K, Q6_K, 64 tokens, a Xeon without AMX). Here the reduction runs over the neurons in
// int8, as upstream's does over a row: each panel of PANEL_ROWS neurons x panel_width columns is
// dequantized to F32 as above and requantized along the neurons (one scale per column and panel:
// the rounding step is max|w| / 127 over 128 neurons, several times finer than the 4-6-bit
// weights' own), and the activations are quantized once per op, per token and panel of neurons
// (one scale each, as upstream quantizes a matmul's activations to Q8_K). `vpdpbusd` then
// multiplies four neurons of sixteen columns for one token per instruction, four times the
// products of an FP32 FMA. The weight bytes are unsigned (q + 128): each token's sum of its
// activation bytes times 128 comes off after.
#include "sparse_ffn_cpu.h"

#if defined(SI_INT8_PROMPT)  // x86 with AVX-512 VNNI and BW (cpu_features.h)
#include <immintrin.h>

namespace si_cpu {

// Below this many tokens requantizing a panel costs more than its products save.
constexpr int64_t INT8_MIN_TOKENS = 8;
constexpr int64_t INT8_SLICE = 32;  // columns per kernel call: two vectors of 16

// The op's work buffer: Int8Layout (sparse_ffn_cpu.h, where the dispatch sizes it).

bool use_int8_prompt(const ggml_tensor * w, const ggml_tensor * hs) {
    return hs->ne[1] >= INT8_MIN_TOKENS && ggml_is_quantized(w->type) && w->ne[0] % INT8_SLICE == 0;
}

// Token t's n activations: per group of PANEL_ROWS, int8 values round(h * 127 / max|h|), the
// scale max|h| / 127 and the sum of the int8 values; zeros up to n_pad.
static void quantize_activations(const float * h, int64_t n, const Int8Layout & lay, int8_t * hq, float * scale,
                          int32_t * sum) {
    for (int64_t g = 0; g < lay.n_groups; ++g) {
        const int64_t j0 = g * PANEL_ROWS, len = std::min<int64_t>(PANEL_ROWS, n - j0);
        __m512 max_abs = _mm512_setzero_ps();
        for (int64_t j = 0; j < len; j += 16) {
            const __mmask16 m = tail_mask(len - j);
            max_abs = _mm512_max_ps(max_abs, _mm512_abs_ps(_mm512_maskz_loadu_ps(m, h + j0 + j)));
        }
        const float amax = _mm512_reduce_max_ps(max_abs);
        const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
        scale[g] = amax / 127.0f;
        __m512i total = _mm512_setzero_si512();
        for (int64_t j = 0; j < len; j += 16) {
            const __mmask16 m = tail_mask(len - j);
            const __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, h + j0 + j), _mm512_set1_ps(inv)));
            total = _mm512_add_epi32(total, q);
            _mm512_mask_cvtsepi32_storeu_epi8(hq + j0 + j, m, q);
        }
        sum[g] = _mm512_reduce_add_epi32(total);
    }
    std::memset(hq + n, 0, lay.n_pad - n);
}

// The F32 panel (rows x width, stride `stride`) as bytes q + 128, q = round(w * 127 / max|w| of
// its column): per slice of 32 columns and per four rows, two vectors whose 32-bit lane c holds
// the four rows' bytes of column c (vpdpbusd's operand), slices one after another. Rows past
// `rows` up to a multiple of four hold 128 (zero). col_scale gets each column's max|w| / 127.
static void panel_to_int8(const float * panel, int64_t rows, int64_t width, int64_t stride, uint8_t * panel_q,
                   float * col_scale) {
    const int64_t n_quads = (rows + 3) / 4;
    for (int64_t c = 0; c < width; c += 16) {
        // four independent maxima (a single chain waits out vmaxps's latency at every row)
        __m512 m[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
        int64_t j = 0;
        for (; j + 4 <= rows; j += 4) {
            for (int k = 0; k < 4; ++k) m[k] = _mm512_max_ps(m[k], _mm512_abs_ps(_mm512_loadu_ps(panel + (j + k) * stride + c)));
        }
        for (; j < rows; ++j) m[0] = _mm512_max_ps(m[0], _mm512_abs_ps(_mm512_loadu_ps(panel + j * stride + c)));
        const __m512 max_abs = _mm512_max_ps(_mm512_max_ps(m[0], m[1]), _mm512_max_ps(m[2], m[3]));
        _mm512_storeu_ps(col_scale + c, _mm512_mul_ps(max_abs, _mm512_set1_ps(1.0f / 127.0f)));
        const __m512 inv = _mm512_maskz_div_ps(_mm512_cmp_ps_mask(max_abs, _mm512_setzero_ps(), _CMP_GT_OQ),
                                               _mm512_set1_ps(127.0f), max_abs);
        uint8_t * out = panel_q + (c / INT8_SLICE) * n_quads * 2 * 64 + (c % INT8_SLICE) / 16 * 64;
        for (int64_t q = 0; q < n_quads; ++q) {
            __m512i lanes = _mm512_set1_epi32((int32_t) 0x80808080u);
            for (int k = 0; k < 4; ++k) {
                const int64_t j = 4 * q + k;
                if (j >= rows) break;
                const __m512i v = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(panel + j * stride + c), inv));
                lanes = _mm512_add_epi32(lanes, _mm512_slli_epi32(v, 8 * k));  // exact: each byte stays in 1..255
            }
            _mm512_storeu_si512(out + q * 2 * 64, lanes);
        }
    }
}

// acc += the products of a's unsigned and b's signed bytes, four per 32-bit lane, in place (GCC
// copies every accumulator of the intrinsic's loop to another register and back, twice the uops)
inline __m512i dpbusd(__m512i acc, __m512i a, __m512i b) {
    __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(a), "v"(b));
    return acc;
}

// c[t][0..32) (+)= the panel's slice times token t's activation bytes, scaled back to floats
template <int TT>
void int8_tile(const uint8_t * slice, int64_t n_quads, const int8_t * const * hq, const float * col_scale,
               const float * h_scale, const int32_t * h_sum, float * const * c, bool first) {
    __m512i acc[TT][2];
    for (int t = 0; t < TT; ++t) acc[t][0] = acc[t][1] = _mm512_setzero_si512();
    for (int64_t q = 0; q < n_quads; ++q) {
        const __m512i w0 = _mm512_loadu_si512(slice + q * 128), w1 = _mm512_loadu_si512(slice + q * 128 + 64);
        for (int t = 0; t < TT; ++t) {
            int32_t four;
            std::memcpy(&four, hq[t] + 4 * q, 4);
            const __m512i b = _mm512_set1_epi32(four);
            acc[t][0] = dpbusd(acc[t][0], w0, b);
            acc[t][1] = dpbusd(acc[t][1], w1, b);
        }
    }
    const __m512 s0 = _mm512_loadu_ps(col_scale), s1 = _mm512_loadu_ps(col_scale + 16);
    for (int t = 0; t < TT; ++t) {
        const __m512i offset = _mm512_set1_epi32(128 * h_sum[t]);
        const __m512 hs = _mm512_set1_ps(h_scale[t]);
        const __m512 v0 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(acc[t][0], offset)), _mm512_mul_ps(s0, hs));
        const __m512 v1 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(acc[t][1], offset)), _mm512_mul_ps(s1, hs));
        _mm512_storeu_ps(c[t], first ? v0 : _mm512_add_ps(_mm512_loadu_ps(c[t]), v0));
        _mm512_storeu_ps(c[t] + 16, first ? v1 : _mm512_add_ps(_mm512_loadu_ps(c[t] + 16), v1));
    }
}

template <int TT>
void int8_tile_dispatch(int tt, const uint8_t * slice, int64_t n_quads, const int8_t * const * hq, const float * cs,
                        const float * h_scale, const int32_t * h_sum, float * const * c, bool first) {
    if constexpr (TT > 0) {
        if (tt == TT) return int8_tile<TT>(slice, n_quads, hq, cs, h_scale, h_sum, c, first);
        int8_tile_dispatch<TT - 1>(tt, slice, n_quads, hq, cs, h_scale, h_sum, c, first);
    }
}

void mul_rows_t_tokens_int8(const ggml_compute_params * params, ggml_tensor * dst) {
    const ggml_tensor * w = dst->src[0];
    const ggml_tensor * hs = dst->src[1];
    const RowIds row_of(dst);
    const int64_t n = hs->ne[0], T = hs->ne[1], E = w->ne[0];
    const Int8Layout lay(w, hs);
    const int ith = params->ith, nth = params->nth;
    char * base = (char *) (((uintptr_t) params->wdata + 63) & ~(uintptr_t) 63);
    auto * hq = (int8_t *) base;
    auto * h_scale = (float *) (base + lay.hq_bytes);
    auto * h_sum = (int32_t *) (h_scale + T * lay.n_groups);
    for (int64_t t = ith; t < T; t += nth) {
        const float * h = (const float *) ((const char *) hs->data + t * hs->nb[1]);
        quantize_activations(h, n, lay, hq + t * lay.n_pad, h_scale + t * lay.n_groups, h_sum + t * lay.n_groups);
    }
    ggml_barrier(params->threadpool);

    char * mine = (char *) (((uintptr_t) (base + lay.hq_bytes + lay.scales_bytes) + 63) & ~(uintptr_t) 63) +
                  ith * lay.per_thread();
    float * panel = (float *) mine;
    auto * panel_q = (uint8_t *) (mine + lay.panel_bytes);
    auto * col_scale = (float *) (mine + lay.panel_bytes + lay.panel_q_bytes);
    const int64_t pw = lay.panel_width;
    auto c_row = [&](int64_t t) { return (float *) ((char *) dst->data + t * dst->nb[1]); };

    const PromptItems items(E, pw, T, nth);
    for (int64_t i = ith; i < items.count; i += nth) {
        const auto [e0, width, t0, t1] = items[i];
        if (n == 0) {
            for (int64_t t = t0; t < t1; ++t) std::memset(c_row(t) + e0, 0, width * sizeof(float));
        }
        for (int64_t j0 = 0, g = 0; j0 < n; j0 += PANEL_ROWS, ++g) {
            const int64_t rows = std::min(PANEL_ROWS, n - j0), n_quads = (rows + 3) / 4;
            rows_to_float(w, row_of, j0, rows, e0, width, panel, pw);
            panel_to_int8(panel, rows, width, pw, panel_q, col_scale);
            for (int64_t ts = t0; ts < t1; ts += TILE_T) {
                const int tt = (int) std::min<int64_t>(TILE_T, t1 - ts);
                const int8_t * h[TILE_T];
                float scales[TILE_T];
                int32_t sums[TILE_T];
                float * c[TILE_T];
                for (int t = 0; t < tt; ++t) {
                    h[t] = hq + (ts + t) * lay.n_pad + j0;
                    scales[t] = h_scale[(ts + t) * lay.n_groups + g];
                    sums[t] = h_sum[(ts + t) * lay.n_groups + g];
                }
                for (int64_t e = 0; e < width; e += INT8_SLICE) {
                    for (int t = 0; t < tt; ++t) c[t] = c_row(ts + t) + e0 + e;
                    int8_tile_dispatch<TILE_T>(tt, panel_q + (e / INT8_SLICE) * n_quads * 128, n_quads, h,
                                               col_scale + e, scales, sums, c, j0 == 0);
                }
            }
        }
    }
}

}  // namespace si_cpu
#endif  // SI_INT8_PROMPT
