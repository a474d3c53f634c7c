// CPU kernels of selectinfer's ops (compiled into ggml-cpu).
//   mul_rows    one token, float weights: eight rows at a time with loops converting in
//               registers; otherwise ggml's own vec_dot for the weight type, row by row (the
//               activation converted once to the type's vec_dot_type), like upstream's mul_mat.
//   mul_rows_t  one token: adds rows eight at a time with per-type loops that convert in
//               registers (GCC vector extensions; F16 through F16C), other types row by row;
//               several tokens: a blocked GEMM over F32 panels of the weight.
//   count       a prompt batch's votes: threads rank tokens in turn, then merge the counts by rows.
//   select      the most counted neurons (one thread: a partial sort of n_load counts).
#include "sparse_ffn_ops.h"

#include "ggml-cpu-impl.h"
#include "ggml-cpu.h"
#include "ggml-impl.h"
#include "vec.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <numeric>
#include <vector>

namespace {

// The weight row of an op's j-th neuron: ids[j] - first_id (the id of the weight's row 0; the
// dynamic rows of a layer whose static rows live apart start at n_static), or j without ids.
struct RowIds {
    const int32_t * ids = nullptr;
    int64_t first_id = 0;
    int64_t n = 0;

    explicit RowIds(const ggml_tensor * dst) {
        if (const ggml_tensor * t = dst->src[2]) {
            ids = (const int32_t *) t->data;
            n = t->ne[0];
        }
        first_id = ggml_get_op_params_i32(dst, GGML_SI_MUL_ROWS_FIRST_ID);
    }
    int64_t operator()(int64_t j) const { return ids ? (int64_t) ids[j] - first_id : j; }
};

// Every row within the weight's rows (upstream's get_rows checks its indices the same way).
void check_row_ids(const ggml_tensor * dst, const char * op) {
    const ggml_tensor * w = dst->src[0];
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
    const int64_t per = (n_blocks + nth - 1) / nth;
    c0 = std::min(n_blocks, per * ith) * blck;
    c1 = std::min(n_blocks, per * (ith + 1)) * blck;
}

// --- one token: y += sum over a group of rows of v[k] * row k ------------------------------------
// Rows are added GROUP at a time, block by block, converting in registers: eight weight streams
// keep the memory bus busy where one row at a time (convert, then add) reaches half the bandwidth.
constexpr int GROUP = 8;

// The loops work in vectors of the CPU's own width: GCC lowers a wider generic vector on AVX2 to
// stack spills and per-lane extracts (measured 3-10x slower). 16 floats with AVX-512, 8 on other
// x86, 16 elsewhere (NEON keeps them in four registers).
#if defined(__AVX512F__) || !(defined(__x86_64__) || defined(__i386__))
#define SI_LANES 16
#else
#define SI_LANES 8
#endif
constexpr int LANES = SI_LANES;
constexpr int PARTS = 32 / LANES;  // vectors per 32-value block
typedef float    f32v __attribute__((vector_size(4 * LANES)));
typedef int32_t  i32v __attribute__((vector_size(4 * LANES)));
typedef uint32_t u32v __attribute__((vector_size(4 * LANES)));
typedef uint8_t  u8x16 __attribute__((vector_size(16)));
typedef uint16_t u16v __attribute__((vector_size(2 * LANES)));

template <typename V, typename S> inline V load_as(const S * p) { V v; std::memcpy(&v, p, sizeof v); return v; }
inline f32v splat(float x) { return f32v{} + x; }
inline u8x16 splat_u8(uint8_t x) {  // a run-time byte in every lane (GCC refuses `vector + int` here)
    u8x16 v;
    std::memset(&v, x, sizeof v);
    return v;
}
// integers to floats through 32-bit lanes: GCC scalarizes a direct 8-bit to float conversion
template <typename V> inline f32v to_f32(V q) { return __builtin_convertvector(__builtin_convertvector(q, i32v), f32v); }
inline float fp16(const uint8_t * p) { ggml_fp16_t d; std::memcpy(&d, p, 2); return GGML_CPU_FP16_TO_FP32(d); }

// LANES F16 values as floats, with the CPU's conversion instructions: F16C on x86, FCVTL on
// ARM (every ARMv8 has it); elsewhere ggml's own conversion, one value at a time.
inline f32v f16_lanes(const void * p) {
#if defined(__F16C__) && SI_LANES == 16
    return (f32v) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *) p));
#elif defined(__F16C__) && SI_LANES == 8
    return (f32v) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) p));
#elif defined(__aarch64__) && SI_LANES == 16
    const float16x8_t lo = vld1q_f16((const float16_t *) p), hi = vld1q_f16((const float16_t *) p + 8);
    float f[16];
    vst1q_f32(f, vcvt_f32_f16(vget_low_f16(lo)));
    vst1q_f32(f + 4, vcvt_high_f32_f16(lo));
    vst1q_f32(f + 8, vcvt_f32_f16(vget_low_f16(hi)));
    vst1q_f32(f + 12, vcvt_high_f32_f16(hi));
    return load_as<f32v>(f);
#else
    float f[LANES];
    for (int i = 0; i < LANES; ++i) f[i] = fp16((const uint8_t *) p + 2 * i);
    return load_as<f32v>(f);
#endif
}

// K-quants: a super-block of 256 values is eight 32-value blocks with 6-bit scales and mins
// packed in 12 bytes (Q4_K, Q5_K): block j's scale and min.
inline void k_scale_min(const uint8_t * scales, int j, float & scale, float & min) {
    if (j < 4) {
        scale = scales[j] & 63;
        min = scales[j + 4] & 63;
    } else {
        scale = (scales[j + 4] & 0x0F) | ((scales[j - 4] >> 6) << 4);
        min = (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4);
    }
}

// Sixteen bytes as floats (16 / LANES vectors). Byte arithmetic stays in 16-byte vectors: GCC
// scalarizes shifts of an 8-byte vector on x86.
inline void bytes_to_f32(u8x16 q, f32v * out) {
#if SI_LANES == 16
    out[0] = to_f32(q);
#elif defined(__AVX2__)  // GCC scalarizes the generic form's upper half
    out[0] = (f32v) _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32((__m128i) q));
    out[1] = (f32v) _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_unpackhi_epi64((__m128i) q, (__m128i) q)));
#else
    out[0] = to_f32(__builtin_shufflevector(q, q, 0, 1, 2, 3, 4, 5, 6, 7));
    out[1] = to_f32(__builtin_shufflevector(q, q, 8, 9, 10, 11, 12, 13, 14, 15));
#endif
}
constexpr int HALF = 16 / LANES;  // vectors per 16 values

// out[p] = scale * out[p] + offset for the n vectors of out
inline void scale_parts(f32v * out, int n, float scale, float offset) {
    for (int p = 0; p < n; ++p) out[p] = splat(scale) * out[p] + offset;
}

// The 32 values of block b of a row as floats: values LANES*p .. LANES*p + LANES-1 in out[p].
template <ggml_type T>
inline void block_values(const char * row, int64_t b, f32v * out) {
    if constexpr (T == GGML_TYPE_F32) {
        for (int p = 0; p < PARTS; ++p) out[p] = load_as<f32v>((const float *) row + 32 * b + LANES * p);
    } else if constexpr (T == GGML_TYPE_F16) {
        for (int p = 0; p < PARTS; ++p) out[p] = f16_lanes((const ggml_fp16_t *) row + 32 * b + LANES * p);
    } else if constexpr (T == GGML_TYPE_BF16) {  // bf16 is the top half of an f32
        for (int p = 0; p < PARTS; ++p) {
            const u16v r = load_as<u16v>((const uint16_t *) row + 32 * b + LANES * p);
            out[p] = (f32v) (__builtin_convertvector(r, u32v) << 16);
        }
    } else if constexpr (T == GGML_TYPE_Q8_0) {  // d, 32 x int8
        // as unsigned bytes offset by 128: GCC scalarizes the signed 8-bit widening here
        const uint8_t * blk = (const uint8_t *) row + 34 * b;
        bytes_to_f32(load_as<u8x16>(blk + 2) ^ 0x80, out);
        bytes_to_f32(load_as<u8x16>(blk + 18) ^ 0x80, out + HALF);
        scale_parts(out, PARTS, fp16(blk), -128.0f * fp16(blk));
    } else if constexpr (T == GGML_TYPE_Q4_0 || T == GGML_TYPE_Q4_1) {
        // Q4_0: d, 16 bytes; Q4_1: d, m, 16 bytes. Low nibbles are values 0..15, high 16..31.
        constexpr bool with_min = T == GGML_TYPE_Q4_1;
        const uint8_t * blk = (const uint8_t *) row + (with_min ? 20 : 18) * b;
        const u8x16 q = load_as<u8x16>(blk + (with_min ? 4 : 2));
        bytes_to_f32(q & 0x0F, out);
        bytes_to_f32(q >> 4, out + HALF);
        const float d = fp16(blk);
        scale_parts(out, PARTS, d, with_min ? fp16(blk + 2) : -8.0f * d);
    } else if constexpr (T == GGML_TYPE_Q4_K || T == GGML_TYPE_Q5_K) {
        // d, dmin, scales[12], (Q5_K: qh[32], a fifth bit per value), qs[128]: blocks 2i and 2i+1
        // share qs[32i..32i+31], low nibbles then high; value = d * scale * q - dmin * min
        constexpr bool five = T == GGML_TYPE_Q5_K;
        const uint8_t * sb = (const uint8_t *) row + (five ? 176 : 144) * (b / 8);
        const int j = (int) (b % 8);
        float scale, min;
        k_scale_min(sb + 4, j, scale, min);
        for (int h = 0; h < 2; ++h) {
            const u8x16 packed = load_as<u8x16>(sb + (five ? 48 : 16) + 32 * (j / 2) + 16 * h);
            u8x16 q = j % 2 ? packed >> 4 : packed & 0x0F;
            if constexpr (five) {  // bit j of qh: a vector compare (x86 has no per-byte shift by a variable)
                const u8x16 qh = load_as<u8x16>(sb + 16 + 16 * h);
                q |= (u8x16) ((qh & splat_u8((uint8_t) (1u << j))) != 0) & 16;
            }
            bytes_to_f32(q, out + HALF * h);
        }
        scale_parts(out, PARTS, fp16(sb) * scale, -fp16(sb + 2) * min);
    } else if constexpr (T == GGML_TYPE_Q6_K) {
        // ql[128] (low 4 bits), qh[64] (high 2 bits), int8 scales[16] (one per 16 values), d; each
        // 128-value half n: block r of it takes ql[64n + 32(r%2) + l] (r < 2: low nibble) and bits
        // 2r of qh[32n + l]; value = d * scale * (q - 32)
        const uint8_t * sb = (const uint8_t *) row + 210 * (b / 8);
        const int j = (int) (b % 8), n = j / 4, r = j % 4;
        const float d = fp16(sb + 208);
        for (int h = 0; h < 2; ++h) {
            const u8x16 ql = load_as<u8x16>(sb + 64 * n + 32 * (r % 2) + 16 * h);
            const u8x16 qh = load_as<u8x16>(sb + 128 + 32 * n + 16 * h);
            // bits 2r, 2r+1 of qh to bits 4, 5, with constant shifts (no per-byte variable shift on x86)
            const u8x16 hi = r == 0 ? (qh & 0x03) << 4 : r == 1 ? (qh & 0x0C) << 2 : r == 2 ? qh & 0x30 : (qh & 0xC0) >> 2;
            bytes_to_f32((r < 2 ? ql & 0x0F : ql >> 4) | hi, out + HALF * h);
            const float scale = d * (float) (int8_t) sb[192 + 8 * n + h + 2 * r];
            scale_parts(out + HALF * h, HALF, scale, -32.0f * scale);
        }
    }
}

template <ggml_type T> struct AddRows {
    static void run(const char * const * rows, const float * v, int nr, int64_t E, float * y) {
        for (int64_t b = 0; b < E / 32; ++b) {
            f32v acc[PARTS], vals[PARTS];
            for (int p = 0; p < PARTS; ++p) acc[p] = load_as<f32v>(y + 32 * b + LANES * p);
            for (int k = 0; k < nr; ++k) {
                block_values<T>(rows[k], b, vals);
                for (int p = 0; p < PARTS; ++p) acc[p] += v[k] * vals[p];
            }
            for (int p = 0; p < PARTS; ++p) std::memcpy(y + 32 * b + LANES * p, &acc[p], sizeof acc[p]);
        }
    }
};

// block_values has a loop for each of GGML_SI_FUSED_TYPES (sparse_ffn_ops.h), on every CPU.
bool has_block_loop(ggml_type type) {
    return ggml_si_has_fused_loop(type);
}

// Runs K<type>::run(args...) for a type that has_block_loop.
template <template <ggml_type> class K, typename... A> void with_block_type(ggml_type type, A... args) {
    switch (type) {
#define SI_CASE(T) case GGML_TYPE_##T: K<GGML_TYPE_##T>::run(args...); break;
        GGML_SI_FUSED_TYPES(SI_CASE)
#undef SI_CASE
        default: GGML_ABORT("no block loop for type %s", ggml_type_name(type));
    }
}

// y[0..E) += sum_k v[k] * rows[k][0..E) for nr <= GROUP rows; false when this type (or this E,
// or this CPU) has no fused loop and the caller converts row by row instead.
bool add_rows_fused(ggml_type type, const char * const * rows, const float * v, int nr, int64_t E, float * y) {
    if (E % 32 != 0 || !has_block_loop(type)) return false;
    with_block_type<AddRows>(type, rows, v, nr, E, y);
    return true;
}

// out[k] = rows[k][0..K) . x[0..K) for nr <= GROUP rows, GROUP weight streams at a time (as
// add_rows: one row at a time reaches 2/3 of the bandwidth once the weights are not in cache).
template <ggml_type T> struct DotRows {
    static void run(const char * const * rows, int nr, const float * x, int64_t K, float * out) {
        f32v acc[GROUP] = {};
        for (int64_t b = 0; b < K / 32; ++b) {
            f32v xs[PARTS], vals[PARTS];
            for (int p = 0; p < PARTS; ++p) xs[p] = load_as<f32v>(x + 32 * b + LANES * p);
            for (int k = 0; k < nr; ++k) {
                block_values<T>(rows[k], b, vals);
                for (int p = 0; p < PARTS; ++p) acc[k] += vals[p] * xs[p];
            }
        }
        for (int k = 0; k < nr; ++k) {
            float sum = 0.0f;
            for (int i = 0; i < LANES; ++i) sum += acc[k][i];
            out[k] = sum;
        }
    }
};

// The first cache lines of a row read next: a jump to a non-adjacent row otherwise starts with
// demand misses until the hardware prefetcher catches up.
inline void prefetch_row_start(const char * row, size_t row_size) {
    for (size_t off = 0; off < std::min<size_t>(row_size, 1024); off += 64) __builtin_prefetch(row + off);
}

// Blocks [b0, b0 + n_blocks) of 32 values of a row as floats, converted in registers (ggml's
// to_float is scalar code for most quantized types).
template <ggml_type T> struct BlocksToFloat {
    static void run(const char * row, int64_t b0, int64_t n_blocks, float * out) {
        for (int64_t b = 0; b < n_blocks; ++b) {
            f32v vals[PARTS];
            block_values<T>(row, b0 + b, vals);
            std::memcpy(out + 32 * b, vals, sizeof vals);
        }
    }
};

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

// One token (decode): threads split the neurons; each adds its rows, GROUP at a time, into a
// private output row, and the private rows are summed at the end.
void mul_rows_t_one_token(const ggml_compute_params * params, ggml_tensor * dst) {
    const ggml_tensor * w = dst->src[0];
    const RowIds row_of(dst);
    const float * h = (const float *) dst->src[1]->data;
    const int64_t n = dst->src[1]->ne[0], E = w->ne[0];
    const int ith = params->ith, nth = params->nth;
    const int64_t stride = E + 64;  // floats per thread buffer, apart by a cache line or more
    float * y = (float *) params->wdata + (int64_t) ith * 2 * stride;
    float * chunk = y + stride;
    std::memset(y, 0, E * sizeof(float));
    const size_t row_size = ggml_row_size(w->type, E);
    // groups dealt out in turn: the static rows come first and are contiguous, the dynamic ones
    // scattered (slower to read), so contiguous halves would leave one thread waiting
    for (int64_t j = ith * GROUP; j < n; j += nth * GROUP) {
        const int nr = (int) std::min<int64_t>(GROUP, n - j);
        const char * rows[GROUP];
        for (int k = 0; k < nr; ++k) rows[k] = (const char *) w->data + row_of(j + k) * w->nb[1];
        for (int64_t k = j + nth * GROUP; k < std::min(n, j + (nth + 1) * GROUP); ++k) {
            prefetch_row_start((const char *) w->data + row_of(k) * w->nb[1], row_size);
        }
        if (add_rows_fused(w->type, rows, h + j, nr, E, y)) continue;
        for (int k = 0; k < nr; ++k) {
            if (h[j + k] == 0.0f) continue;
            rows_to_float(w, row_of, j + k, 1, 0, E, chunk, E);
            ggml_vec_mad_f32((int) E, y, chunk, h[j + k]);
        }
    }
    ggml_barrier(params->threadpool);
    int64_t c0, c1;
    column_range(dst, ith, nth, c0, c1);
    float * out = (float *) dst->data;
    for (int64_t c = c0; c < c1; ++c) {
        float sum = 0.0f;
        for (int t = 0; t < nth; ++t) sum += ((const float *) params->wdata)[(int64_t) t * 2 * stride + c];
        out[c] = sum;
    }
}

// Several tokens (prefill): out[:, t] = sum_j h[j, t] w[row j] is a matrix product whose weight
// is stored along the output; computed as a blocked outer-product GEMM. A panel of weight
// columns is converted to F32 once per chunk of rows and reused by every token, and a register
// tile of TILE_T tokens x TILE_E columns accumulates over the rows.
#if defined(__AVX512F__)
constexpr int VEC = 16, TILE_T = 8;
#elif defined(__AVX__)
constexpr int VEC = 8, TILE_T = 6;
#else
constexpr int VEC = 4, TILE_T = 8;
#endif
constexpr int TILE_E = 2 * VEC;
typedef float vfloat __attribute__((vector_size(VEC * sizeof(float))));
constexpr int64_t PANEL_ROWS = 128, TOKEN_CHUNK = 64;

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
    const int64_t n_panels = (E + panel_width - 1) / panel_width;
    const int64_t n_chunks = (T + TOKEN_CHUNK - 1) / TOKEN_CHUNK;
    float * panel = (float *) params->wdata + params->ith * (PANEL_ROWS * panel_width + 64);
    auto h_row = [&](int64_t t) { return (const float *) ((const char *) hs->data + t * hs->nb[1]); };
    auto c_row = [&](int64_t t) { return (float *) ((char *) dst->data + t * dst->nb[1]); };

    for (int64_t item = params->ith; item < n_panels * n_chunks; item += params->nth) {
        const int64_t e0 = (item % n_panels) * panel_width, width = std::min(panel_width, E - e0);
        const int64_t t0 = (item / n_panels) * TOKEN_CHUNK, t1 = std::min(T, t0 + TOKEN_CHUNK);
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

// One thread's scratch of the counting op: two float arrays and an int32 array of n_load.
struct CountScratch {
    float * value;     // the token's ranking key per neuron
    float * partition; // a copy that nth_element reorders
    int32_t * count;   // votes of this thread's tokens
};

size_t count_scratch_bytes(int64_t n_load) {
    return (size_t) n_load * (2 * sizeof(float) + sizeof(int32_t));
}

CountScratch count_scratch(void * base, int64_t n_load) {
    float * f = (float *) base;
    return {f, f + n_load, (int32_t *) (f + 2 * n_load)};
}

// The key a token's neuron is ranked by: NaN below every number, so a broken activation is
// never chosen over a real one and the sort's ordering stays strict.
inline float rank_key(float a, bool by_magnitude) {
    if (std::isnan(a)) return -INFINITY;
    return by_magnitude ? std::fabs(a) : a;
}

}  // namespace

extern "C" {

size_t ggml_si_work_size(const struct ggml_tensor * node, int n_tasks) {
    switch (node->op) {
        case GGML_OP_SI_MUL_ROWS: {
            const ggml_type vdt = ggml_get_type_traits_cpu(node->src[0]->type)->vec_dot_type;
            return ggml_row_size(vdt, node->src[1]->ne[0]) * node->src[1]->ne[1] + 64;
        }
        case GGML_OP_SI_MUL_ROWS_T: {
            // one token: a private output row and a converted weight row per thread;
            // several: a converted weight panel per thread
            const int64_t E = node->src[0]->ne[0];
            const int64_t panel = PANEL_ROWS * std::max<int64_t>(64, ggml_blck_size(node->src[0]->type)) + 64;
            return (size_t) n_tasks * std::max<int64_t>(2 * (E + 64), panel) * sizeof(float);
        }
        case GGML_OP_SI_COUNT:
            // per thread: a positives count, then per neuron a value, a copy to partition and a count
            return (size_t) n_tasks * (sizeof(int64_t) + count_scratch_bytes(node->src[0]->ne[0])) + 64;
        case GGML_OP_SI_SELECT:
            return (size_t) node->src[0]->ne[0] * sizeof(int32_t) + 64;  // candidate order
        default:
            return 0;
    }
}

void ggml_si_compute_forward_mul_rows(const struct ggml_compute_params * params, struct ggml_tensor * dst) {
    const ggml_tensor * w = dst->src[0];
    const ggml_tensor * x = dst->src[1];
    const RowIds row_of(dst);
    const int64_t K = x->ne[0], T = x->ne[1], n = dst->ne[0];
    const auto * traits = ggml_get_type_traits_cpu(w->type);
    const ggml_type vdt = traits->vec_dot_type;
    const size_t x_row = ggml_row_size(vdt, K);
    const int ith = params->ith, nth = params->nth;
    check_row_ids(dst, "ggml_si_mul_rows");

    // float weights: the fused loop (several rows in flight); quantized ones: ggml's vec_dot
    // with a quantized x (integer dot products) is faster than converting the weights
    const bool float_weights = w->type == GGML_TYPE_F32 || w->type == GGML_TYPE_F16 || w->type == GGML_TYPE_BF16;
    if (T == 1 && K % 32 == 0 && float_weights && has_block_loop(w->type)) {
        mul_rows_one_token(params, dst);
        return;
    }
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
    for (int64_t c0 = ith * chunk; c0 < n; c0 += nth * chunk) {
        const int64_t c1 = std::min(n, c0 + chunk);
        for (int64_t j = c0; j < c1; ++j) {
            const char * row = (const char *) w->data + row_of(j) * w->nb[1];
            const int64_t next = j + 1 < c1 ? j + 1 : c0 + nth * chunk;
            if (next < n) prefetch_row_start((const char *) w->data + row_of(next) * w->nb[1], w->nb[1]);
            for (int64_t t = 0; t < T; ++t) {
                float * out = (float *) ((char *) dst->data + t * dst->nb[1]) + j;
                traits->vec_dot((int) K, out, 0, row, 0, xq + t * x_row, 0, 1);
            }
        }
    }
}

void ggml_si_compute_forward_mul_rows_t(const struct ggml_compute_params * params, struct ggml_tensor * dst) {
    check_row_ids(dst, "ggml_si_mul_rows_t");
    if (dst->src[1]->ne[1] == 1) {
        mul_rows_t_one_token(params, dst);
    } else {
        mul_rows_t_tokens(params, dst);
    }
}

void ggml_si_compute_forward_count(const struct ggml_compute_params * params, struct ggml_tensor * dst) {
    const ggml_tensor * act = dst->src[0];
    const ggml_tensor * prev = dst->src[1];
    const float alpha = ggml_get_op_params_f32(dst, GGML_SI_COUNT_ALPHA);
    const bool by_magnitude = ggml_get_op_params_i32(dst, GGML_SI_COUNT_BY_MAGNITUDE) != 0;
    const int64_t n_load = act->ne[0], T = act->ne[1];
    const int ith = params->ith, nth = params->nth;
    auto token = [act](int64_t t) { return (const float *) ((const char *) act->data + t * act->nb[1]); };

    int64_t * positives = (int64_t *) params->wdata;
    auto scratch_of = [&](int i) {
        return count_scratch((char *) params->wdata + nth * sizeof(int64_t) + i * count_scratch_bytes(n_load), n_load);
    };
    const CountScratch mine = scratch_of(ith);

    // k = round(alpha * mean number of positive activations per token); threads take tokens in turn
    positives[ith] = 0;
    for (int64_t t = ith; t < T; t += nth) {
        for (int64_t i = 0; i < n_load; ++i) positives[ith] += token(t)[i] > 0.0f;
    }
    ggml_barrier(params->threadpool);
    int64_t all_positives = 0;
    for (int i = 0; i < nth; ++i) all_positives += positives[i];
    const int64_t k = T == 0 ? 0 : std::min<int64_t>(n_load, std::llround(alpha * (double) all_positives / (double) T));

    // a token's top k: the k-th largest key by nth_element on a copy, then every neuron above it
    // and, among those equal to it, the lower rows until k are counted
    std::fill(mine.count, mine.count + n_load, 0);
    for (int64_t t = ith; t < T && k > 0; t += nth) {
        const float * a = token(t);
        for (int64_t i = 0; i < n_load; ++i) mine.value[i] = rank_key(a[i], by_magnitude);
        std::copy(mine.value, mine.value + n_load, mine.partition);
        std::nth_element(mine.partition, mine.partition + (k - 1), mine.partition + n_load, std::greater<float>());
        const float kth = mine.partition[k - 1];
        int64_t ties = k;
        for (int64_t i = 0; i < n_load; ++i) ties -= mine.value[i] > kth;
        for (int64_t i = 0; i < n_load; ++i) {
            if (mine.value[i] > kth || (mine.value[i] == kth && ties-- > 0)) mine.count[i] += 1;
        }
    }
    ggml_barrier(params->threadpool);
    // threads merge the counts, each a range of neurons, onto the previous batches' counts
    const int64_t per = (n_load + nth - 1) / nth;
    const int64_t i0 = std::min(n_load, per * ith), i1 = std::min(n_load, i0 + per);
    float * out = (float *) dst->data;
    const float * before = prev ? (const float *) prev->data : nullptr;
    for (int64_t i = i0; i < i1; ++i) {
        int64_t votes = 0;
        for (int t = 0; t < nth; ++t) votes += scratch_of(t).count[i];
        out[i] = (before ? before[i] : 0.0f) + (float) votes;
    }
}

void ggml_si_compute_forward_select(const struct ggml_compute_params * params, struct ggml_tensor * dst) {
    if (params->ith != 0) {
        return;
    }
    const float * counts = (const float *) dst->src[0]->data;
    const int64_t n_load = dst->src[0]->ne[0];
    const int32_t n_static = ggml_get_op_params_i32(dst, GGML_SI_SELECT_N_STATIC);
    const int32_t n_dynamic = ggml_get_op_params_i32(dst, GGML_SI_SELECT_N_DYNAMIC);
    // the n_dynamic most counted non-static neurons; ties to the lower row
    int32_t * order = (int32_t *) params->wdata;
    const int64_t n_candidates = n_load - n_static;
    std::iota(order, order + n_candidates, n_static);
    auto more = [counts](int32_t x, int32_t y) { return counts[x] > counts[y] || (counts[x] == counts[y] && x < y); };
    std::partial_sort(order, order + n_dynamic, order + n_candidates, more);
    std::sort(order, order + n_dynamic);

    int32_t * out = (int32_t *) dst->data;
    for (int32_t i = 0; i < n_static; ++i) out[i] = i;
    std::copy(order, order + n_dynamic, out + n_static);
}

}  // extern "C"
