// The fused block loops of the row ops (step 3, selective computation): the 32 values of a weight
// block decoded in registers, per type of GGML_SI_FUSED_TYPES, and the loops over rows built on
// them (the kernel families of sparse_ffn_cpu.h). Self-contained (ggml.h for the type names,
// sparse_ffn_ops.h for their lists, cpu_features.h for the CPU levels) so that a test can build
// them for every x86 level and check them against numpy (tests/test_block_loops.py).
#pragma once

#include "cpu_features.h"
#include "ggml.h"
#include "sparse_ffn_ops.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#elif defined(__aarch64__)
#include <arm_neon.h>
#endif

namespace si_blocks {

// DotRows takes GROUP rows at a time, block by block, converting in registers: eight weight
// streams keep the memory bus busy where one row at a time (convert, then add) reaches half the
// bandwidth.
constexpr int GROUP = 8;
// AddRows takes up to sixteen rows: its integer loop converts each block's sums once per call,
// shared by more rows (the integer loop alone on Zen 4: 8% (Q4_K) to 24% (Q5_K, Q6_K) fewer
// cycles per weight than with eight).
constexpr int ADD_GROUP = 16;

// The loops work in vectors of the CPU's own width: GCC lowers a wider generic vector on AVX2 to
// stack spills and per-lane extracts (measured 3-10x slower). 16 floats with AVX-512, 8 on other
// x86, 16 elsewhere (NEON keeps them in four registers): SI_LANES (cpu_features.h).
#if (defined(__x86_64__) || defined(__i386__)) && !defined(__AVX__)
// without AVX GCC builds the 8-float vectors from two SSE registers and notes that passing one
// would change the ABI: these loops are inline functions of one file, which no other code calls
#pragma GCC diagnostic ignored "-Wpsabi"
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
// An IEEE half at p as a float: F16C or ARM's conversion, else from the bits (exact).
inline float fp16(const uint8_t * p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
#if defined(__F16C__)
    return _cvtsh_ss(h);
#elif defined(__aarch64__)
    __fp16 f;
    std::memcpy(&f, &h, 2);
    return f;
#else
    const uint32_t sign = (uint32_t) (h & 0x8000) << 16, exponent = (h >> 10) & 0x1F, mantissa = h & 0x3FF;
    if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24
        const float m = std::ldexp((float) mantissa, -24);
        return sign ? -m : m;
    }
    const uint32_t bits = sign | (exponent == 0x1F ? 0x7F800000u | (mantissa << 13)   // inf, NaN
                                                   : ((exponent + 112) << 23) | (mantissa << 13));
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
#endif
}

// LANES F16 values as floats, with the CPU's conversion instructions: F16C on x86, FCVTL on
// ARM (every ARMv8 has it); elsewhere fp16() one value at a time.
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

// Sixteen bytes as floats (16 / LANES vectors). Byte arithmetic stays in 16-byte vectors: GCC
// scalarizes shifts of an 8-byte vector on x86.
inline void bytes_to_f32(u8x16 q, f32v * out) {
#if SI_LANES == 16 && defined(__AVX512F__)  // GCC may extract the generic form's lanes one by one
    out[0] = (f32v) _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32((__m128i) q));
#elif SI_LANES == 16
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

// K-quants: super-blocks of 256 values, eight blocks of 32.
template <ggml_type T> constexpr bool is_k_quant = T == GGML_TYPE_Q4_K || T == GGML_TYPE_Q5_K || T == GGML_TYPE_Q6_K;
template <ggml_type T> constexpr int k_super_bytes = T == GGML_TYPE_Q4_K ? 144 : T == GGML_TYPE_Q5_K ? 176 : 210;

// The integers q of block j of super-block sb (before its scale and offset).
template <ggml_type T>
inline void k_block_q(const uint8_t * sb, int j, f32v * q) {
    if constexpr (T == GGML_TYPE_Q4_K || T == GGML_TYPE_Q5_K) {
        // d, dmin, scales[12], (Q5_K: qh[32], a fifth bit per value), qs[128]: blocks 2i and 2i+1
        // share qs[32i..32i+31], low nibbles then high; value = d * scale * q - dmin * min
        constexpr bool five = T == GGML_TYPE_Q5_K;
        for (int h = 0; h < 2; ++h) {
            const u8x16 packed = load_as<u8x16>(sb + (five ? 48 : 16) + 32 * (j / 2) + 16 * h);
            u8x16 q4 = j % 2 ? packed >> 4 : packed & 0x0F;
            if constexpr (five) {  // bit j of qh: a vector compare (x86 has no per-byte shift by a variable)
                const u8x16 qh = load_as<u8x16>(sb + 16 + 16 * h);
                q4 |= (u8x16) ((qh & splat_u8((uint8_t) (1u << j))) != 0) & 16;
            }
            bytes_to_f32(q4, q + HALF * h);
        }
    } else if constexpr (T == GGML_TYPE_Q6_K) {
        // ql[128] (low 4 bits), qh[64] (high 2 bits), int8 scales[16] (one per 16 values), d; each
        // 128-value half n: block r of it takes ql[64n + 32(r%2) + l] (r < 2: low nibble) and bits
        // 2r of qh[32n + l]; value = d * scale * (q - 32)
        const int n = j / 4, r = j % 4;
        for (int h = 0; h < 2; ++h) {
            const u8x16 ql = load_as<u8x16>(sb + 64 * n + 32 * (r % 2) + 16 * h);
            const u8x16 qh = load_as<u8x16>(sb + 128 + 32 * n + 16 * h);
            // bits 2r, 2r+1 of qh to bits 4, 5, with constant shifts (no per-byte variable shift on x86)
            const u8x16 hi = r == 0 ? (qh & 0x03) << 4 : r == 1 ? (qh & 0x0C) << 2 : r == 2 ? qh & 0x30 : (qh & 0xC0) >> 2;
            bytes_to_f32((r < 2 ? ql & 0x0F : ql >> 4) | hi, q + HALF * h);
        }
    }
}

// Q4_K, Q5_K: the eight blocks' 6-bit scales (bytes 0-7) and mins (8-15) of a super-block. 12
// bytes at 4 hold them: bytes 0-3 scales 0-3 (low 6 bits), 4-7 mins 0-3, 8-11 the low 4 bits of
// scales 4-7 and (high nibble) mins 4-7, whose top 2 bits are the top bits of bytes 0-3 (scales)
// and 4-7 (mins); four bytes at a time.
inline u8x16 k_scales_mins(const uint8_t * sb) {
    uint32_t w[3];
    std::memcpy(w, sb + 4, 12);
    const uint32_t packed[4] = {
        w[0] & 0x3F3F3F3Fu,                                         // scales 0-3
        (w[2] & 0x0F0F0F0Fu) | ((w[0] >> 2) & 0x30303030u),         // scales 4-7
        w[1] & 0x3F3F3F3Fu,                                         // mins 0-3
        ((w[2] >> 4) & 0x0F0F0F0Fu) | ((w[1] >> 2) & 0x30303030u),  // mins 4-7
    };
    return load_as<u8x16>(packed);
}

// A super-block's 16 scales (one per 16 values) times v, and the offsets times v added to
// offset[16]: value u of the super-block's 16-value pieces = scale[u] * q + offset[u].
template <ggml_type T>
inline void k_super_scales(const uint8_t * sb, float v, float * scale, float * offset) {
    float f[16];
    if constexpr (T == GGML_TYPE_Q6_K) {
        const u8x16 sc = load_as<u8x16>(sb + 192) ^ 0x80;  // int8 as unsigned bytes offset by 128
        f32v parts[HALF];
        bytes_to_f32(sc, parts);
        std::memcpy(f, parts, sizeof f);
        const float vd = v * fp16(sb + 208);
        for (int u = 0; u < 16; ++u) {
            scale[u] = vd * (f[u] - 128.0f);
            offset[u] -= 32.0f * scale[u];
        }
    } else {
        // Q4_K, Q5_K: the eight blocks' 6-bit scales and mins
        f32v parts[HALF];
        bytes_to_f32(k_scales_mins(sb), parts);
        std::memcpy(f, parts, sizeof f);
        const float vd = v * fp16(sb), vmin = v * fp16(sb + 2);
        for (int j = 0; j < 8; ++j) {
            scale[2 * j] = scale[2 * j + 1] = vd * f[j];
            offset[2 * j] -= vmin * f[8 + j];
            offset[2 * j + 1] -= vmin * f[8 + j];
        }
    }
}

// f(std::integral_constant<int, i>) for i = 0 .. N-1: block indices known when compiling.
template <int N, typename F> inline void unroll(F && f) {
    if constexpr (N > 0) {
        unroll<N - 1>(f);
        f(std::integral_constant<int, N - 1>{});
    }
}

// Quantized blocks decode to small integers q and, per 16 values, a scale and an offset:
// value = scale * q + offset. The row loops fold the scale into their one multiply-add and sum
// the offsets as scalars, so a weight costs its decoding and one FMA.
struct BlockScale {
    float scale[2], offset[2];  // values 0..15, 16..31
};
template <ggml_type T> constexpr bool is_float_type = T == GGML_TYPE_F32 || T == GGML_TYPE_F16 || T == GGML_TYPE_BF16;
// Bytes per 32 values of a type stored in 32-value blocks (K-quants go by super-block:
// k_super_bytes): Q8_0 d + 32 int8, Q4_1 d, m + 16 bytes, Q4_0 d + 16 bytes, Q5_0 d + 4 bytes of
// fifth bits + 16 bytes, Q5_1 d, m + 4 + 16.
template <ggml_type T>
constexpr int64_t block_bytes = T == GGML_TYPE_F32 ? 128 : is_float_type<T> ? 64 : T == GGML_TYPE_Q8_0 ? 34
                              : T == GGML_TYPE_Q4_1 ? 20 : T == GGML_TYPE_Q5_0 ? 22 : T == GGML_TYPE_Q5_1 ? 24 : 18;
// Where a 32-value block's integers start, after its d (and m): the int8 values (Q8_0), the
// nibbles (Q4_0, Q4_1) or the fifth bits, then the nibbles (Q5_0, Q5_1).
template <ggml_type T>
constexpr int block_data_at = T == GGML_TYPE_Q4_1 || T == GGML_TYPE_Q5_1 ? 4 : 2;
template <ggml_type T> constexpr bool is_five_bit = T == GGML_TYPE_Q5_0 || T == GGML_TYPE_Q5_1;
// The 32 fifth bits of a Q5_0 / Q5_1 block as bytes of 0 or 16: values 0..15, then 16..31. qh: the
// block's 4 bytes of them; 16 bytes are read (the nibbles follow: still inside the block).
inline void fifth_bits(const uint8_t * qh, u8x16 & lo, u8x16 & hi) {
    const u8x16 bytes = load_as<u8x16>(qh), bit = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
    const u8x16 lo_bytes = __builtin_shufflevector(bytes, bytes, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    const u8x16 hi_bytes = __builtin_shufflevector(bytes, bytes, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    lo = (u8x16) ((lo_bytes & bit) != 0) & 16;
    hi = (u8x16) ((hi_bytes & bit) != 0) & 16;
}

// Block b of a float row: its 32 values.
template <ggml_type T>
inline void float_block(const char * row, int64_t b, f32v * out) {
    if constexpr (T == GGML_TYPE_F32) {
        for (int p = 0; p < PARTS; ++p) out[p] = load_as<f32v>((const float *) row + 32 * b + LANES * p);
    } else if constexpr (T == GGML_TYPE_F16) {
        for (int p = 0; p < PARTS; ++p) out[p] = f16_lanes((const ggml_fp16_t *) row + 32 * b + LANES * p);
    } else if constexpr (T == GGML_TYPE_BF16) {  // bf16 is the top half of an f32
        for (int p = 0; p < PARTS; ++p) {
            const u16v r = load_as<u16v>((const uint16_t *) row + 32 * b + LANES * p);
            out[p] = (f32v) (__builtin_convertvector(r, u32v) << 16);
        }
    }
}

// Block b of a quantized row: q (values LANES*p .. LANES*p + LANES-1 in q[p]) and its scales.
template <ggml_type T>
inline void quant_block(const char * row, int64_t b, f32v * q, BlockScale & s) {
    if constexpr (T == GGML_TYPE_Q8_0) {  // d, 32 x int8
        // as unsigned bytes offset by 128: GCC scalarizes the signed 8-bit widening here
        const uint8_t * blk = (const uint8_t *) row + block_bytes<T> * b;
        bytes_to_f32(load_as<u8x16>(blk + 2) ^ 0x80, q);
        bytes_to_f32(load_as<u8x16>(blk + 18) ^ 0x80, q + HALF);
        const float d = fp16(blk);
        s = {{d, d}, {-128.0f * d, -128.0f * d}};
    } else if constexpr (T == GGML_TYPE_Q4_0 || T == GGML_TYPE_Q4_1) {
        // Q4_0: d, 16 bytes; Q4_1: d, m, 16 bytes. Low nibbles are values 0..15, high 16..31.
        constexpr bool with_min = T == GGML_TYPE_Q4_1;
        const uint8_t * blk = (const uint8_t *) row + block_bytes<T> * b;
        const u8x16 packed = load_as<u8x16>(blk + (with_min ? 4 : 2));
        bytes_to_f32(packed & 0x0F, q);
        bytes_to_f32(packed >> 4, q + HALF);
        const float d = fp16(blk), offset = with_min ? fp16(blk + 2) : -8.0f * d;
        s = {{d, d}, {offset, offset}};
    } else if constexpr (is_five_bit<T>) {  // Q4_0's and Q4_1's nibbles with a fifth bit; Q5_0's zero point 16
        constexpr bool with_min = T == GGML_TYPE_Q5_1;
        const uint8_t * blk = (const uint8_t *) row + block_bytes<T> * b;
        const uint8_t * qh = blk + block_data_at<T>;
        const u8x16 packed = load_as<u8x16>(qh + 4);
        u8x16 lo, hi;
        fifth_bits(qh, lo, hi);
        bytes_to_f32((packed & 0x0F) | lo, q);
        bytes_to_f32((packed >> 4) | hi, q + HALF);
        const float d = fp16(blk), offset = with_min ? fp16(blk + 2) : -16.0f * d;
        s = {{d, d}, {offset, offset}};
    }
}

// The 32 values of block b of a row as floats: values LANES*p .. LANES*p + LANES-1 in out[p].
template <ggml_type T>
inline void block_values(const char * row, int64_t b, f32v * out) {
    if constexpr (is_float_type<T>) {
        float_block<T>(row, b, out);
    } else if constexpr (is_k_quant<T>) {  // a block alone: rare (whole super-blocks go faster)
        const uint8_t * sb = (const uint8_t *) row + k_super_bytes<T> * (b / 8);
        const int j = (int) (b % 8);
        float scale[16], offset[16] = {};
        k_super_scales<T>(sb, 1.0f, scale, offset);
        k_block_q<T>(sb, j, out);
        for (int p = 0; p < PARTS; ++p) out[p] = splat(scale[2 * j + p / HALF]) * out[p] + offset[2 * j + p / HALF];
    } else {
        BlockScale s;
        quant_block<T>(row, b, out, s);
        for (int p = 0; p < PARTS; ++p) out[p] = splat(s.scale[p / HALF]) * out[p] + s.offset[p / HALF];
    }
}

// --- Integer sums of rows (x86 with AVX2): the transposed down projection at decode ------------
// A float loop spends a widening, a conversion and an FMA per weight vector (compute-bound on
// 4-5 bit types). Here the row factors w_k = v_k * scale_k of a group of rows are quantized to
// int8 per piece (S = max |w_k| / 127, W_k = round(w_k / S); a piece is a block, Q6_K's 16 values), and the weights' small
// unsigned integers u are multiplied by them with vpmaddubsw, two rows per instruction, summed in
// 16 bits, converted once per block: y += S * sum_k W_k (u_k - c) + offsets, c the middle of u's
// range (the zero point of Q4_0 and Q6_K; for Q4_1 and the other K-quants, c * sum_k w_k joins
// their minimums in exact float offsets). Q8_0's signed values go in as |q| with the factor
// taking q's sign (vpsignb), c = 0. Each term's error is at most S/2 * |u - c|: the
// precision of upstream's dot products, whose activation is quantized to 8 bits per 32 values.
// Non-finite or tiny factors take the float loop.
#if defined(SI_INT_ROWS)  // x86 with AVX2 (cpu_features.h)
template <ggml_type T> constexpr bool has_int_rows = T == GGML_TYPE_Q8_0 || T == GGML_TYPE_Q4_0 || T == GGML_TYPE_Q4_1 ||
                                                    is_five_bit<T> || is_k_quant<T>;
// pairs of rows summed in 16 bits before a widening: 2 * 127 * max |u - c| per pair, under 2^15
// (Q8_0: 2 * 127 * 128, one pair)
template <ggml_type T> constexpr int int_pairs_per_flush = T == GGML_TYPE_Q8_0 ? 1 : T == GGML_TYPE_Q6_K ? 2
                                                         : T == GGML_TYPE_Q5_K || is_five_bit<T> ? 4 : 8;

// The 32 integers of block j of a row, values 0..15 then 16..31 (one 256-bit vector): unsigned
// but Q8_0's.
template <ggml_type T>
inline __m256i int_block_u(const uint8_t * base, int j) {
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    if constexpr (T == GGML_TYPE_Q8_0) {  // base: the block's 32 int8 values (signed, unlike the others)
        return _mm256_loadu_si256((const __m256i *) base);
    } else if constexpr (T == GGML_TYPE_Q4_0 || T == GGML_TYPE_Q4_1) {  // base: the block's 16 packed bytes
        const __m256i x = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *) base));
        return _mm256_and_si256(_mm256_srlv_epi64(x, _mm256_set_epi64x(4, 4, 0, 0)), low4);
    } else if constexpr (is_five_bit<T>) {  // base: the block's 4 bytes of fifth bits, then its 16 packed bytes
        const __m256i x = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *) (base + 4)));
        const __m256i u = _mm256_and_si256(_mm256_srlv_epi64(x, _mm256_set_epi64x(4, 4, 0, 0)), low4);
        // byte l of the result takes byte l / 8 of qh (both halves hold all four), then its bit l % 8
        int32_t qh;
        std::memcpy(&qh, base, 4);
        const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32(qh), _mm256_setr_epi8(
            0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
        const __m256i bit = _mm256_set1_epi64x((int64_t) 0x8040201008040201);
        const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
        return _mm256_or_si256(u, _mm256_and_si256(set, _mm256_set1_epi8(0x10)));
    } else if constexpr (T == GGML_TYPE_Q4_K || T == GGML_TYPE_Q5_K) {  // base: the super-block
        constexpr bool five = T == GGML_TYPE_Q5_K;
        const __m256i x = _mm256_loadu_si256((const __m256i *) (base + (five ? 48 : 16) + 32 * (j / 2)));
        __m256i u = _mm256_and_si256(j % 2 ? _mm256_srli_epi16(x, 4) : x, low4);
        if constexpr (five) {  // bit j of qh[l] is the fifth bit of value l
            const __m256i qh = _mm256_loadu_si256((const __m256i *) (base + 16));
            const __m256i bit = j < 4 ? _mm256_slli_epi16(qh, 4 - j) : _mm256_srli_epi16(qh, j - 4);
            u = _mm256_or_si256(u, _mm256_and_si256(bit, _mm256_set1_epi8(0x10)));
        }
        return u;
    } else {  // Q6_K, base: the super-block; layout as in k_block_q
        const int n = j / 4, r = j % 4;
        const __m256i ql = _mm256_loadu_si256((const __m256i *) (base + 64 * n + 32 * (r % 2)));
        const __m256i qh = _mm256_loadu_si256((const __m256i *) (base + 128 + 32 * n));
        const __m256i lo = _mm256_and_si256(r < 2 ? ql : _mm256_srli_epi16(ql, 4), low4);
        const int shift = 2 * r - 4;  // bits 2r, 2r+1 of qh to bits 4, 5
        const __m256i hi = shift < 0 ? _mm256_slli_epi16(qh, -shift) : _mm256_srli_epi16(qh, shift);
        return _mm256_or_si256(lo, _mm256_and_si256(hi, _mm256_set1_epi8(0x30)));
    }
}

#if defined(__AVX512F__) && defined(__AVX512BW__)
// A K-quant super-block's blocks j and j + 1 (j even) as int_block_u's in one vector, block j in
// the low half: the two share their bytes of qs (Q4_K, Q5_K: low and high nibbles; Q6_K: one
// 64-byte stretch of ql) and of qh, so this is the work of one block. A shift count outside
// 0..63 gives 0 (vpsllvq, vpsrlvq): the bit shifts need no branch on j.
template <ggml_type T>
inline __m512i k_block_pair_u(const uint8_t * sb, int j) {
    const __m512i low4 = _mm512_set1_epi8(0x0F);
    const __m512i bit = _mm512_set_epi64(j + 1, j + 1, j + 1, j + 1, j, j, j, j);  // qh's bit of each half
    auto to_bit4 = [&](__m512i qh, __m512i b) {  // bit b of every byte to its bit 4
        const __m512i four = _mm512_set1_epi64(4);
        return _mm512_or_si512(_mm512_sllv_epi64(qh, _mm512_sub_epi64(four, b)), _mm512_srlv_epi64(qh, _mm512_sub_epi64(b, four)));
    };
    if constexpr (T == GGML_TYPE_Q4_K || T == GGML_TYPE_Q5_K) {
        constexpr bool five = T == GGML_TYPE_Q5_K;
        const __m512i x = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *) (sb + (five ? 48 : 16) + 32 * (j / 2))));
        __m512i u = _mm512_and_si512(_mm512_srlv_epi64(x, _mm512_set_epi64(4, 4, 4, 4, 0, 0, 0, 0)), low4);
        if constexpr (five) {
            const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *) (sb + 16)));
            u = _mm512_or_si512(u, _mm512_and_si512(to_bit4(qh, bit), _mm512_set1_epi8(0x10)));
        }
        return u;
    } else {  // Q6_K: blocks 4n + r, 4n + r + 1 (r = 0 or 2) read ql's bytes 64n.. 64n + 63, shifted alike
        const int n = j / 4, r = j % 4;
        const __m512i ql = _mm512_loadu_si512((const void *) (sb + 64 * n));
        const __m512i lo = _mm512_and_si512(r < 2 ? ql : _mm512_srli_epi16(ql, 4), low4);
        const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *) (sb + 128 + 32 * n)));
        // bits 2 (r + h), 2 (r + h) + 1 of qh to bits 4, 5: bit 2 (r + h) to 4, with h the half
        const __m512i pair_bit = _mm512_add_epi64(_mm512_slli_epi64(bit, 1), _mm512_set1_epi64(-2 * (4 * n)));
        return _mm512_or_si512(lo, _mm512_and_si512(to_bit4(qh, pair_bit), _mm512_set1_epi8(0x30)));
    }
}
#endif

// The int8 factors of a group of rows, per piece (a block; Q6_K's 16 values), at most 16 pieces.
struct IntFactors {
    int32_t pair[ADD_GROUP / 2][16];  // low 16 bits: the W bytes of rows 2i and 2i + 1, for vpmaddubsw
    float step[16];               // S
    int32_t sum_w[16];            // sum_k W_k
    float sum_f[16];              // sum_k w_k, exact
};

// w[k][piece] for rows k < nr, NP pieces (8 or 16; unused ones 0) to int8 factors; false when a
// factor is not finite or the step would be under FLT_MIN (the float loop then runs).
template <int NP>
inline bool quantize_factors(const float (*w)[NP], int nr, IntFactors & f) {
    static_assert(NP == 8 || NP == 16, "pieces in whole 8-float vectors, at most 16");
    constexpr int H = NP / 8;
    const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF)), huge = _mm256_set1_ps(3.0e38f);
    __m256 m[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()}, sum[2] = {m[0], m[0]};
    __m256 finite = _mm256_castsi256_ps(_mm256_set1_epi32(-1));
    for (int k = 0; k < nr; ++k) {
        for (int h = 0; h < H; ++h) {
            const __m256 x = _mm256_loadu_ps(w[k] + 8 * h), a = _mm256_and_ps(x, magnitude);
            finite = _mm256_and_ps(finite, _mm256_cmp_ps(a, huge, _CMP_LE_OQ));  // false for NaN and inf
            m[h] = _mm256_max_ps(m[h], a);
            sum[h] = _mm256_add_ps(sum[h], x);
        }
    }
    __m256 inv[2];
    for (int h = 0; h < H; ++h) {
        const __m256 nonzero = _mm256_cmp_ps(m[h], _mm256_setzero_ps(), _CMP_GT_OQ);
        finite = _mm256_and_ps(finite, _mm256_or_ps(_mm256_xor_ps(nonzero, _mm256_castsi256_ps(_mm256_set1_epi32(-1))),
                                                    _mm256_cmp_ps(m[h], _mm256_set1_ps(1.0e-30f), _CMP_GE_OQ)));
        inv[h] = _mm256_and_ps(nonzero, _mm256_div_ps(_mm256_set1_ps(127.0f), m[h]));
        _mm256_storeu_ps(f.step + 8 * h, _mm256_div_ps(m[h], _mm256_set1_ps(127.0f)));
        _mm256_storeu_ps(f.sum_f + 8 * h, sum[h]);
    }
    if (_mm256_movemask_ps(finite) != 0xFF) return false;
    __m256i sum_w[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
    for (int i = 0; i < ADD_GROUP / 2; ++i) {
        for (int h = 0; h < H; ++h) {
            // |w * inv| <= 127, rounded to nearest; a missing partner row is 0
            const int k = 2 * i;
            const __m256i w0 = k < nr ? _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(w[k] + 8 * h), inv[h])) : _mm256_setzero_si256();
            const __m256i w1 = k + 1 < nr ? _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(w[k + 1] + 8 * h), inv[h])) : _mm256_setzero_si256();
            sum_w[h] = _mm256_add_epi32(sum_w[h], _mm256_add_epi32(w0, w1));
            const __m256i pair = _mm256_or_si256(_mm256_and_si256(w0, _mm256_set1_epi32(0xFF)), _mm256_slli_epi32(w1, 8));
            _mm256_storeu_si256((__m256i *) (f.pair[i] + 8 * h), pair);
        }
    }
    for (int h = 0; h < H; ++h) _mm256_storeu_si256((__m256i *) (f.sum_w + 8 * h), sum_w[h]);
    return true;
}

// A K-quant super-block's factors for the integer loop: v times its scales, one per piece (Q4_K
// and Q5_K: 8, a block's two halves share theirs; Q6_K: 16), and for Q4_K and Q5_K the minimums'
// terms added to offset[8]. Vectorized: per row of a group, this is most of a super-block's work
// besides its weights.
template <ggml_type T> constexpr int int_pieces = T == GGML_TYPE_Q6_K ? 16 : 8;
template <ggml_type T>
inline void int_super_scales(const uint8_t * sb, float v, float * scale, float * offset) {
    if constexpr (T == GGML_TYPE_Q6_K) {  // int8 scales[16] at 192, d at 208; the zero point 32 is the center
        const __m128i sc = _mm_loadu_si128((const __m128i *) (sb + 192));
        const __m256 vd = _mm256_set1_ps(v * fp16(sb + 208));
        _mm256_storeu_ps(scale, _mm256_mul_ps(vd, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc))));
        _mm256_storeu_ps(scale + 8, _mm256_mul_ps(vd, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(sc, 8)))));
    } else {
        const __m128i packed = (__m128i) k_scales_mins(sb);
        const __m256 sc = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(packed));
        const __m256 mins = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(packed, 8)));
        _mm256_storeu_ps(scale, _mm256_mul_ps(_mm256_set1_ps(v * fp16(sb)), sc));
        _mm256_storeu_ps(offset, _mm256_fnmadd_ps(_mm256_set1_ps(v * fp16(sb + 2)), mins, _mm256_loadu_ps(offset)));
    }
}

// y[0..32) += S * sum_k W_k (u_k - c) + offset, one block of every row: u(k) its integers,
// values 0..15 with the factors of piece lo, 16..31 with those of piece hi.
template <ggml_type T, typename U>
inline void add_int_block(U && u, int nr, int lo, int hi, const IntFactors & f, int center,
                          const float * offset, float * y) {
    __m256i acc[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256()};
    __m256i lo16 = _mm256_setzero_si256(), hi16 = _mm256_setzero_si256();
    auto flush = [&]() {  // 16-bit sums to 32 bits: lo16 holds values 0-7 | 16-23, hi16 8-15 | 24-31
        acc[0] = _mm256_add_epi32(acc[0], _mm256_cvtepi16_epi32(_mm256_castsi256_si128(lo16)));
        acc[1] = _mm256_add_epi32(acc[1], _mm256_cvtepi16_epi32(_mm256_castsi256_si128(hi16)));
        acc[2] = _mm256_add_epi32(acc[2], _mm256_cvtepi16_epi32(_mm256_extracti128_si256(lo16, 1)));
        acc[3] = _mm256_add_epi32(acc[3], _mm256_cvtepi16_epi32(_mm256_extracti128_si256(hi16, 1)));
        lo16 = hi16 = _mm256_setzero_si256();
    };
    for (int k = 0; k < nr; k += 2) {
        const __m256i a = u(k), b = k + 1 < nr ? u(k + 1) : a;  // an odd last row pairs with W = 0
        const int32_t * pair = f.pair[k / 2];
        const __m256i factors = lo == hi ? _mm256_set1_epi16((int16_t) pair[lo])  // one broadcast
                                         : _mm256_set_m128i(_mm_set1_epi16((int16_t) pair[hi]), _mm_set1_epi16((int16_t) pair[lo]));
        const __m256i ab_lo = _mm256_unpacklo_epi8(a, b), ab_hi = _mm256_unpackhi_epi8(a, b);
        if constexpr (T == GGML_TYPE_Q8_0) {  // |q| (-128 reads as 128 unsigned) times W with q's sign
            lo16 = _mm256_add_epi16(lo16, _mm256_maddubs_epi16(_mm256_abs_epi8(ab_lo), _mm256_sign_epi8(factors, ab_lo)));
            hi16 = _mm256_add_epi16(hi16, _mm256_maddubs_epi16(_mm256_abs_epi8(ab_hi), _mm256_sign_epi8(factors, ab_hi)));
        } else {
            lo16 = _mm256_add_epi16(lo16, _mm256_maddubs_epi16(ab_lo, factors));
            hi16 = _mm256_add_epi16(hi16, _mm256_maddubs_epi16(ab_hi, factors));
        }
        if ((k / 2 + 1) % int_pairs_per_flush<T> == 0) flush();
    }
    flush();
    for (int q = 0; q < 4; ++q) {  // the q-th 8 values
        const int piece = q < 2 ? lo : hi;
        const __m256i sum = _mm256_sub_epi32(acc[q], _mm256_set1_epi32(center * f.sum_w[piece]));
        const __m256 prev = _mm256_add_ps(_mm256_loadu_ps(y + 8 * q), _mm256_set1_ps(offset[q / 2]));
        _mm256_storeu_ps(y + 8 * q, _mm256_fmadd_ps(_mm256_set1_ps(f.step[piece]), _mm256_cvtepi32_ps(sum), prev));
    }
}
// --- Integer dot products of rows (x86 with AVX2): gathered gate and up at decode --------------
// One upstream vec_dot call per row spends a horizontal reduction, a scale conversion and an FMA
// per row and block; ggml's repacked kernels, which the original model runs on, take eight rows
// per pass (1.5x faster per byte on Zen 4, end to end). Here x is quantized once to int8 per 32
// values (as upstream's Q8_0) and eight rows go together: per block, each row's integers times
// x's with vpmaddubsw (weights unsigned), the eight rows' sums reduced together, and the eight
// rows' scales applied in one FMA. 4-bit types reduce in 16 bits (a lane ends with 16 products,
// at most 16 * 15 * 127 < 2^15), Q8_0 in 32 (its signed products are twice as large). K-quants
// go a super-block at a time, its eight blocks' sums in the lanes of one vector per row, in 32
// bits (VNNI's dpbusd where the CPU has it): their gathered rows took 1.1-1.6x a dense row's time
// through upstream's vec_dot and take 0.9x here (scripts/bench_ffn.py, Q4_K and Q5_K, Xeon).
#if defined(SI_INT_DOTS)  // and F16C (cpu_features.h)
#define SI_OR_TYPE(N) || T == GGML_TYPE_##N
template <ggml_type T> constexpr bool has_int_dots = false GGML_SI_INT_DOT_TYPES(SI_OR_TYPE);
#undef SI_OR_TYPE

// With AVX-512 VNNI, Q4_0 and Q4_1 rows are dotted four blocks per vector (run_blocks_512):
// SI_INT_DOTS_512 (cpu_features.h).

// x quantized per 32 values: x[i] ~ d[i / 32] * q[i]; sum[b] = sum of block b's q. For
// run_blocks_512 also per group of four blocks (DotRowsInt::arrange_input; a missing block's
// values zero): split[128 g ..] the four blocks' values 0..15, then their values 16..31;
// d4[16 g + 4 j + i] = d of block 4 g + j, s4[...] = d * sum / 4 of that block (four lanes each).
struct Int8Vector {
    int8_t * q;
    float * d;
    int32_t * sum;
    int8_t * split;
    float * d4;
    float * s4;
};

inline int64_t int8_groups(int64_t K) { return (K / 32 + 3) / 4; }

inline size_t int8_vector_bytes(int64_t K) {
    return (size_t) K + (size_t) (K / 32) * 8 + 64 + (size_t) int8_groups(K) * (128 + 2 * 64) + 64;
}

// The vector's arrays in buf (int8_vector_bytes(K) bytes).
inline Int8Vector int8_vector_at(void * buf, int64_t K) {
    int8_t * q = (int8_t *) buf;
    float * d = (float *) (((uintptr_t) (q + K) + 31) & ~(uintptr_t) 31);
    int32_t * sum = (int32_t *) (d + K / 32);
    int8_t * split = (int8_t *) (((uintptr_t) (sum + K / 32) + 63) & ~(uintptr_t) 63);
    float * d4 = (float *) (split + 128 * int8_groups(K));
    return {q, d, sum, split, d4, d4 + 16 * int8_groups(K)};
}

// x[0..K) (K a multiple of 32) to int8 per block: d = max |x| / 127, q = round(x / d). A block with
// a NaN or an infinity gets d = NaN, so that every dot product with it is NaN (never finite).
inline void quantize_int8(const float * x, int64_t K, const Int8Vector & out) {
    const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
    for (int64_t b = 0; b < K / 32; ++b) {
        __m256 v[4], m = _mm256_setzero_ps();
        bool finite = true;
        for (int i = 0; i < 4; ++i) {
            v[i] = _mm256_loadu_ps(x + 32 * b + 8 * i);
            const __m256 a = _mm256_and_ps(v[i], magnitude);
            finite &= _mm256_movemask_ps(_mm256_cmp_ps(a, _mm256_set1_ps(3.0e38f), _CMP_LE_OQ)) == 0xFF;
            m = _mm256_max_ps(m, a);
        }
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
        const float amax = _mm_cvtss_f32(m4), d = amax / 127.0f;
        const __m256 inv = _mm256_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
        __m256i q32[4];
        for (int i = 0; i < 4; ++i) q32[i] = finite ? _mm256_cvtps_epi32(_mm256_mul_ps(v[i], inv)) : _mm256_setzero_si256();
        // 32-bit to 8-bit lanes: packs work within 128-bit halves, the permute restores the order
        const __m256i q16 = _mm256_packs_epi32(q32[0], q32[1]), q16b = _mm256_packs_epi32(q32[2], q32[3]);
        const __m256i q8 = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(q16, q16b), _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256((__m256i *) (out.q + 32 * b), q8);
        const __m256i wide = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), q8), _mm256_set1_epi16(1));
        __m128i s = _mm_add_epi32(_mm256_castsi256_si128(wide), _mm256_extracti128_si256(wide, 1));
        s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
        s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 1));
        out.sum[b] = _mm_cvtsi128_si32(s);
        out.d[b] = finite ? d : NAN;
    }
}

template <ggml_type T> struct DotRowsInt {
    static constexpr int64_t bytes = block_bytes<T>;
    static constexpr int quants_at = block_data_at<T>;

    // Eight rows' halves at offset `at` of block b as floats (F16C).
    static __m256 halves(const char * const * r, int64_t b, int at) {
        auto h = [&](int k) { int16_t v; std::memcpy(&v, r[k] + bytes * b + at, 2); return v; };
        return _mm256_cvtph_ps(_mm_setr_epi16(h(0), h(1), h(2), h(3), h(4), h(5), h(6), h(7)));
    }

    // Block b of the eight rows dotted with x's block: one int32 per row.
    static __m256i block_sums(const char * const * r, int64_t b, __m256i xq) {
        if constexpr (T == GGML_TYPE_Q8_0 || is_five_bit<T>) {  // 8- and 5-bit products reduce in 32 bits
            __m256i p[8];
            for (int k = 0; k < 8; ++k) {
                const char * at = r[k] + bytes * b + quants_at;
                if constexpr (T == GGML_TYPE_Q8_0) {
                    const __m256i w = _mm256_loadu_si256((const __m256i *) at);
                    p[k] = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(xq, w)),
                                             _mm256_set1_epi16(1));
                } else {  // 16 products of up to 31 * 127 would overflow the 16-bit tree below
                    p[k] = _mm256_madd_epi16(_mm256_maddubs_epi16(int_block_u<T>((const uint8_t *) at, 0), xq),
                                             _mm256_set1_epi16(1));
                }
            }
            // 32-bit lanes: rows 0-3 in each half of h0, 4-7 of h1, then the halves added
            const __m256i h0 = _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]));
            const __m256i h1 = _mm256_hadd_epi32(_mm256_hadd_epi32(p[4], p[5]), _mm256_hadd_epi32(p[6], p[7]));
            return _mm256_add_epi32(_mm256_permute2x128_si256(h0, h1, 0x20), _mm256_permute2x128_si256(h0, h1, 0x31));
        } else {
            __m256i p[8];
            for (int k = 0; k < 8; ++k) {
                p[k] = _mm256_maddubs_epi16(int_block_u<T>((const uint8_t *) r[k] + bytes * b + quants_at, 0), xq);
            }
            // 16-bit lanes: each half ends with rows 0-7 (values 0-15 in the low half, 16-31 in the high)
            const __m256i h = _mm256_hadd_epi16(
                _mm256_hadd_epi16(_mm256_hadd_epi16(p[0], p[1]), _mm256_hadd_epi16(p[2], p[3])),
                _mm256_hadd_epi16(_mm256_hadd_epi16(p[4], p[5]), _mm256_hadd_epi16(p[6], p[7])));
            return _mm256_add_epi32(_mm256_cvtepi16_epi32(_mm256_castsi256_si128(h)),
                                    _mm256_cvtepi16_epi32(_mm256_extracti128_si256(h, 1)));
        }
    }

    // What run reads of x beyond quantize_int8's arrays, once per x: run_blocks_512's groups.
    static void arrange_input(const Int8Vector & x, int64_t K) {
#if defined(SI_INT_DOTS_512)
        if constexpr (T == GGML_TYPE_Q4_0 || T == GGML_TYPE_Q4_1) {
            std::memset(x.split, 0, 128 * int8_groups(K));
            for (int64_t b = 0; b < int8_groups(K) * 4; ++b) {
                const int64_t g = b / 4, j = b % 4;
                const bool present = b < K / 32;
                if (present) {
                    std::memcpy(x.split + 128 * g + 16 * j, x.q + 32 * b, 16);
                    std::memcpy(x.split + 128 * g + 64 + 16 * j, x.q + 32 * b + 16, 16);
                }
                for (int i = 0; i < 4; ++i) {
                    x.d4[16 * g + 4 * j + i] = present ? x.d[b] : 0.0f;
                    x.s4[16 * g + 4 * j + i] = present ? x.d[b] * (float) x.sum[b] * 0.25f : 0.0f;
                }
            }
        }
#endif
        (void) x, (void) K;
    }

    // out[k] = row k . x for nr <= GROUP rows (x quantized, then arranged); next: rows read after
    // these, fetched ahead.
    static void run(const char * const * rows, int nr, const Int8Vector & x, int64_t K, float * out,
                    const char * const * next = nullptr, int n_next = 0) {
        static_assert(GROUP == 8, "eight rows per pass");
        if constexpr (is_k_quant<T>) {
            run_k(rows, nr, x, K, out, next, n_next);
#if defined(SI_INT_DOTS_512)
        } else if constexpr (T == GGML_TYPE_Q4_0 || T == GGML_TYPE_Q4_1) {
            run_blocks_512(rows, nr, x, K, out, next, n_next);
#endif
        } else {
            run_blocks(rows, nr, x, K, out, next, n_next);
        }
    }

#if defined(SI_INT_DOTS_512)
    // Q4_0 and Q4_1 with AVX-512 VNNI: four blocks of a row per step, block j's 16 packed bytes in
    // 128-bit lane j, so that a row's integers meet x's (Int8Vector::split, arranged once per x:
    // arranged per call of eight rows it took about half of the gain) in two dpbusd and each
    // block's four 32-bit lanes take its scales as floats: no per-block reduction across rows
    // (run_blocks' hadd tree is shuffle-bound). A row's lanes sum to one float at the end. On a
    // Xeon with AMX, 576-wide Q4_1 rows: 11-23% less time per row than run_blocks from L2; from
    // L3 both wait on memory (4-10% less).
    static void run_blocks_512(const char * const * rows, int nr, const Int8Vector & x, int64_t K, float * out,
                               const char * const * next, int n_next) {
        constexpr bool with_min = T == GGML_TYPE_Q4_1;
        const int64_t n_blocks = K / 32;
        // the group's first 64 bytes as words: d of block j over lanes 4j..4j+3, then Q4_1's m alike
        alignas(64) int16_t dm_words[32];
        for (int w = 0; w < 32; ++w) dm_words[w] = (int16_t) ((bytes * ((w % 16) / 4) + (w < 16 ? 0 : 2)) / 2);
        const __m512i dm_index = _mm512_load_si512(dm_words);
        const __m512i low4 = _mm512_set1_epi8(0x0F);
        const char * r[GROUP];
        for (int k = 0; k < GROUP; ++k) r[k] = rows[k < nr ? k : 0];  // missing rows repeat row 0
        __m512 acc[GROUP];  // a whole group, so that the accumulators stay in registers
        for (int k = 0; k < GROUP; ++k) acc[k] = _mm512_setzero_ps();
        for (int64_t b = 0; b < n_blocks; b += 4) {
            const int nb = (int) std::min<int64_t>(4, n_blocks - b);
            for (int k = 0; k < n_next; ++k) {
                for (int64_t line = (bytes * b) & ~63; line < bytes * (b + nb); line += 64) __builtin_prefetch(next[k] + line, 0, 1);
            }
            const int64_t g = b / 4;
            const __m512i x_lo = _mm512_load_si512(x.split + 128 * g), x_hi = _mm512_load_si512(x.split + 128 * g + 64);
            const __m512 dx = _mm512_loadu_ps(x.d4 + 16 * g), sx = _mm512_loadu_ps(x.s4 + 16 * g);
            // the last group of a row may hold fewer blocks: masked loads read none past them
            const __mmask64 dm_mask = nb == 4 ? ~(__mmask64) 0 : (((__mmask64) 1 << (bytes * (nb - 1) + 4)) - 1);
#pragma GCC unroll 8  // (not unrolled, GCC keeps acc in memory: a load and a store per row and step)
            for (int k = 0; k < GROUP; ++k) {
                const uint8_t * p = (const uint8_t *) r[k] + bytes * b;
                __m512i q = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *) (p + quants_at)));
                if (nb == 4) {
                    q = _mm512_inserti32x4(q, _mm_loadu_si128((const __m128i *) (p + quants_at + bytes)), 1);
                    q = _mm512_inserti32x4(q, _mm_loadu_si128((const __m128i *) (p + quants_at + 2 * bytes)), 2);
                    q = _mm512_inserti32x4(q, _mm_loadu_si128((const __m128i *) (p + quants_at + 3 * bytes)), 3);
                } else {
                    q = _mm512_maskz_mov_epi32(0x000F, q);
                    for (int j = 1; j < nb; ++j) {
                        q = _mm512_mask_broadcast_i32x4(q, (__mmask16) (0xF << (4 * j)),
                                                        _mm_loadu_si128((const __m128i *) (p + quants_at + bytes * j)));
                    }
                }
                const __m512i lo = _mm512_and_si512(q, low4), hi = _mm512_and_si512(_mm512_srli_epi16(q, 4), low4);
                const __m512i dots = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, x_lo), hi, x_hi);
                const __m512i dm = _mm512_permutexvar_epi16(dm_index, _mm512_maskz_loadu_epi8(dm_mask, p));
                __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(dots), dx);
                if constexpr (!with_min) f = _mm512_fmadd_ps(sx, _mm512_set1_ps(-8.0f), f);  // d (u - 8)
                acc[k] = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm512_castsi512_si256(dm)), f, acc[k]);
                if constexpr (with_min) {  // d u + m: m times x's block sum
                    acc[k] = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm512_extracti64x4_epi64(dm, 1)), sx, acc[k]);
                }
            }
        }
        for (int k = 0; k < nr; ++k) out[k] = _mm512_reduce_add_ps(acc[k]);
    }
#endif

    // 32-value blocks: block by block, the eight rows' sums in lanes.
    static void run_blocks(const char * const * rows, int nr, const Int8Vector & x, int64_t K, float * out,
                           const char * const * next, int n_next) {
        const char * r[8];
        for (int k = 0; k < 8; ++k) r[k] = rows[k < nr ? k : 0];  // missing rows repeat row 0
        __m256 acc = _mm256_setzero_ps();
        const int64_t n_blocks = K / 32;
        for (int64_t b = 0; b < n_blocks; ++b) {
            const int64_t line = (bytes * (b + 1) - 1) & ~63;
            if (line >= bytes * b) {  // a cache line ends in this block: the next rows' same line
                for (int k = 0; k < n_next; ++k) __builtin_prefetch(next[k] + line, 0, 1);
            }
            const __m256i s = block_sums(r, b, _mm256_loadu_si256((const __m256i *) (x.q + 32 * b)));
            const __m256 d = _mm256_mul_ps(halves(r, b, 0), _mm256_set1_ps(x.d[b]));
            if constexpr (T == GGML_TYPE_Q4_0 || T == GGML_TYPE_Q5_0) {  // d (u - z): the zero point times x's sum
                constexpr int zero = T == GGML_TYPE_Q4_0 ? 8 : 16;
                acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(_mm256_sub_epi32(s, _mm256_set1_epi32(zero * x.sum[b]))), acc);
            } else {
                acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(s), acc);
                if constexpr (T == GGML_TYPE_Q4_1 || T == GGML_TYPE_Q5_1) {  // d u + m: m times x's sum
                    acc = _mm256_fmadd_ps(halves(r, b, 2), _mm256_set1_ps(x.d[b] * (float) x.sum[b]), acc);
                }
            }
        }
        float sums[8];
        _mm256_storeu_ps(sums, acc);
        std::memcpy(out, sums, nr * sizeof(float));
    }

    // K-quants: a super-block of each of the rows in turn (eight streams in flight), its eight
    // blocks' integer sums with x in lanes (Q6_K: its sixteen 16-value pieces in two vectors),
    // times the blocks' scales and x's steps in one FMA; a row's lanes are summed at the end.
    static void run_k(const char * const * rows, int nr, const Int8Vector & x, int64_t K, float * out,
                      const char * const * next, int n_next) {
        constexpr int64_t bytes = k_super_bytes<T>;
        __m256 acc[GROUP];
        for (int k = 0; k < nr; ++k) acc[k] = _mm256_setzero_ps();
        for (int64_t sb = 0; sb < K / 256; ++sb) {
            for (int k = 0; k < n_next; ++k) {
                for (int64_t line = (bytes * sb) & ~63; line < bytes * (sb + 1); line += 64) __builtin_prefetch(next[k] + line, 0, 1);
            }
            const int8_t * xq = x.q + 256 * sb;
            const __m256 dx = _mm256_loadu_ps(x.d + 8 * sb);
            if constexpr (T == GGML_TYPE_Q6_K) {
                // values d * scale * (u - 32): x's sums per piece (shared by the rows) times 32
                __m256i ones[8], center[2];
                std::fill(ones, ones + 8, _mm256_set1_epi8(1));
                piece_sums(ones, xq, center);
                // pieces 2j (values 0-15 of block j) and 2j+1 in piece_sums' order, x's steps alike
                const __m256i order = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
                const __m256 dx_by_piece[2] = {_mm256_permute2f128_ps(dx, dx, 0x00), _mm256_permute2f128_ps(dx, dx, 0x11)};
                for (int h = 0; h < 2; ++h) center[h] = _mm256_slli_epi32(center[h], 5);
                for (int k = 0; k < nr; ++k) {
                    const uint8_t * s = (const uint8_t *) rows[k] + bytes * sb;
                    __m256i sums[2];
                    super_block_sums(s, xq, sums);
                    const __m128i sc = _mm_loadu_si128((const __m128i *) (s + 192));
                    const __m256 d = _mm256_set1_ps(fp16(s + 208));
                    for (int h = 0; h < 2; ++h) {
                        const __m256i sc8 = _mm256_permutevar8x32_epi32(_mm256_cvtepi8_epi32(h ? _mm_srli_si128(sc, 8) : sc), order);
                        const __m256 factor = _mm256_mul_ps(_mm256_mul_ps(d, dx_by_piece[h]), _mm256_cvtepi32_ps(sc8));
                        acc[k] = _mm256_fmadd_ps(factor, _mm256_cvtepi32_ps(_mm256_sub_epi32(sums[h], center[h])), acc[k]);
                    }
                }
            } else {
                // values d * sc * u - dmin * m: the minimums times x's block sums
                const __m256 dx_sum = _mm256_mul_ps(dx, _mm256_cvtepi32_ps(_mm256_loadu_si256((const __m256i *) (x.sum + 8 * sb))));
                for (int k = 0; k < nr; ++k) {
                    const uint8_t * s = (const uint8_t *) rows[k] + bytes * sb;
                    __m256i sums[2];
                    super_block_sums(s, xq, sums);
                    const __m256i block = _mm256_add_epi32(_mm256_permute2x128_si256(sums[0], sums[1], 0x20),
                                                           _mm256_permute2x128_si256(sums[0], sums[1], 0x31));
                    const __m128i packed = (__m128i) k_scales_mins(s);
                    const __m256 sc = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(packed));
                    const __m256 mins = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(packed, 8)));
                    const __m256 factor = _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(fp16(s)), dx), sc);
                    acc[k] = _mm256_fmadd_ps(factor, _mm256_cvtepi32_ps(block), acc[k]);
                    acc[k] = _mm256_fnmadd_ps(_mm256_mul_ps(_mm256_set1_ps(fp16(s + 2)), mins), dx_sum, acc[k]);
                }
            }
        }
        for (int k = 0; k < nr; ++k) {
            __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(acc[k]), _mm256_extractf128_ps(acc[k], 1));
            s4 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
            out[k] = _mm_cvtss_f32(_mm_add_ss(s4, _mm_shuffle_ps(s4, s4, 1)));
        }
    }

    // A row's super-block s dotted with x's 256 int8 values, in piece_sums' lanes.
    static void super_block_sums(const uint8_t * s, const int8_t * xq, __m256i * sums) {
        __m256i u[8];
        unroll<8>([&](auto J) { u[decltype(J)::value] = int_block_u<T>(s, decltype(J)::value); });
        piece_sums(u, xq, sums);
    }

    // Blocks j = 0..7 of a super-block, u[j] its unsigned integers (at most 63), dotted with x's
    // 256 int8 values xq in 32-bit sums: h[0] = [values 0-15 of blocks 0..3 | values 16-31 of
    // blocks 0..3], h[1] the same for blocks 4..7.
    static void piece_sums(const __m256i * u, const int8_t * xq, __m256i * h) {
        __m256i a[8];
        for (int j = 0; j < 8; ++j) a[j] = dot_u8_i8(u[j], _mm256_loadu_si256((const __m256i *) (xq + 32 * j)));
        h[0] = _mm256_hadd_epi32(_mm256_hadd_epi32(a[0], a[1]), _mm256_hadd_epi32(a[2], a[3]));
        h[1] = _mm256_hadd_epi32(_mm256_hadd_epi32(a[4], a[5]), _mm256_hadd_epi32(a[6], a[7]));
    }

    // Sums of four adjacent products of unsigned u (at most 63: no 16-bit pair saturates) and
    // signed q in 32-bit lanes: one VNNI instruction where the CPU has it.
    static __m256i dot_u8_i8(__m256i u, __m256i q) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
        return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, q);
#elif defined(__AVXVNNI__)
        return _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), u, q);
#else
        return _mm256_madd_epi16(_mm256_maddubs_epi16(u, q), _mm256_set1_epi16(1));
#endif
    }
};
#else
template <ggml_type T> constexpr bool has_int_dots = false;
#endif  // SI_INT_DOTS
#else
template <ggml_type T> constexpr bool has_int_rows = false;
template <ggml_type T> constexpr bool has_int_dots = false;
#endif

// y[0..E) += sum_k v[k] * rows[k][0..E) for nr <= ADD_GROUP rows, block by block: the weight
// streams keep the memory bus busy, and y is read and written once per block.
// next[0..n_next): the rows the caller adds after these, read ahead chunk by chunk while these
// are added (a group's distance hides the memory latency; the rows of a group are short streams
// that the hardware prefetcher follows late).
template <ggml_type T> struct AddRows {
    static void run(const char * const * rows, const float * v, int nr, int64_t E, float * y,
                    const char * const * next = nullptr, int n_next = 0) {
        if constexpr (is_k_quant<T>) {
            for (int64_t sb = 0; sb < E / 256; ++sb) {
                prefetch(next, n_next, k_super_bytes<T> * sb, k_super_bytes<T> * (sb + 1));
                add_super_block(rows, v, nr, sb, y + 256 * sb);
            }
            return;
        }
#if defined(SI_INT_ROWS)
        if constexpr (has_int_rows<T>) {  // eight blocks at a time: one quantization of the factors
            for (int64_t b = 0; b < E / 32; b += 8) {
                const int nb = (int) std::min<int64_t>(8, E / 32 - b);
                prefetch(next, n_next, block_bytes<T> * b, block_bytes<T> * (b + nb));
                if (add_blocks_int(rows, v, nr, b, nb, y + 32 * b)) continue;
                for (int i = 0; i < nb; ++i) add_block_float(rows, v, nr, b + i, y + 32 * (b + i));
            }
            return;
        }
#endif
        for (int64_t b = 0; b < E / 32; ++b) {
            if (b % 8 == 0) prefetch(next, n_next, block_bytes<T> * b, block_bytes<T> * std::min<int64_t>(b + 8, E / 32));
            add_block_float(rows, v, nr, b, y + 32 * b);
        }
    }

    static void prefetch(const char * const * next, int n_next, int64_t lo, int64_t hi) {
        for (int k = 0; k < n_next; ++k) {
            for (int64_t line = lo & ~63; line < hi; line += 64) __builtin_prefetch(next[k] + line);
        }
    }

    static void add_block_float(const char * const * rows, const float * v, int nr, int64_t b, float * y) {
        f32v acc[PARTS], vals[PARTS];
        for (int p = 0; p < PARTS; ++p) acc[p] = load_as<f32v>(y + LANES * p);
        if constexpr (is_float_type<T>) {
            for (int k = 0; k < nr; ++k) {
                float_block<T>(rows[k], b, vals);
                for (int p = 0; p < PARTS; ++p) acc[p] += v[k] * vals[p];
            }
        } else {
            float offset[2] = {0.0f, 0.0f};
            for (int k = 0; k < nr; ++k) {
                BlockScale s;
                quant_block<T>(rows[k], b, vals, s);
                for (int p = 0; p < PARTS; ++p) acc[p] += splat(v[k] * s.scale[p / HALF]) * vals[p];
                offset[0] += v[k] * s.offset[0];
                offset[1] += v[k] * s.offset[1];
            }
            for (int p = 0; p < PARTS; ++p) acc[p] += offset[p / HALF];
        }
        for (int p = 0; p < PARTS; ++p) std::memcpy(y + LANES * p, &acc[p], sizeof acc[p]);
    }

#if defined(SI_INT_ROWS)
    // Q8_0, Q4_0, Q4_1: blocks [b0, b0 + nb) (nb <= 8) of every row in integers, a piece per block;
    // false (nothing added) where the float loop must run.
    static bool add_blocks_int(const char * const * rows, const float * v, int nr, int64_t b0, int nb, float * y) {
        constexpr bool with_min = T == GGML_TYPE_Q4_1 || T == GGML_TYPE_Q5_1;
        constexpr int64_t bytes = block_bytes<T>;
        float w[ADD_GROUP][8] = {}, offset[8] = {};
#if defined(SI_INT_DOTS_512)
        // a row's d (and m) of its nb blocks in one gather: converting them one by one took
        // more time than the integer sums (Xeon with AMX, 576-wide Q4_1 rows)
        const __m256i starts = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32((int) bytes));
        const __mmask8 present = (__mmask8) ((1u << nb) - 1);
        __m256 mins = _mm256_setzero_ps();
        for (int k = 0; k < nr; ++k) {
            const __m256i dm = _mm256_mmask_i32gather_epi32(_mm256_setzero_si256(), present, starts, rows[k] + bytes * b0, 1);
            const __m256 vk = _mm256_set1_ps(v[k]);
            _mm256_storeu_ps(w[k], _mm256_mul_ps(vk, _mm256_cvtph_ps(_mm256_cvtepi32_epi16(dm))));
            if constexpr (with_min) mins = _mm256_fmadd_ps(vk, _mm256_cvtph_ps(_mm256_cvtepi32_epi16(_mm256_srli_epi32(dm, 16))), mins);
        }
        _mm256_storeu_ps(offset, mins);
#else
        for (int k = 0; k < nr; ++k) {
            const uint8_t * blk = (const uint8_t *) rows[k] + bytes * b0;
            for (int i = 0; i < nb; ++i) {
                w[k][i] = v[k] * fp16(blk + bytes * i);
                if constexpr (with_min) offset[i] += v[k] * fp16(blk + bytes * i + 2);
            }
        }
#endif
        IntFactors f;
        if (!quantize_factors(w, nr, f)) return false;
        // Q8_0: d * q; Q4_0: d * (u - 8), 8 its zero point (Q5_0: 16); Q4_1: d * u + m, u - 8 in
        // integers, 8 * d * v exact (Q5_1: 16)
        constexpr int center = T == GGML_TYPE_Q8_0 ? 0 : is_five_bit<T> ? 16 : 8;
        if constexpr (with_min) {
            for (int i = 0; i < nb; ++i) offset[i] += center * f.sum_f[i];
        }
#if defined(SI_INT_DOTS_512)
        add_int_blocks_512(rows, nr, b0, nb, f, offset, y);
#else
        for (int i = 0; i < nb; ++i) {
            auto u = [&](int k) { return int_block_u<T>((const uint8_t *) rows[k] + bytes * (b0 + i) + block_data_at<T>, 0); };
            const float offsets[2] = {offset[i], offset[i]};
            add_int_block<T>(u, nr, i, i, f, center, offsets, y + 32 * i);
        }
#endif
        return true;
    }
#endif

#if defined(SI_INT_ROWS) && defined(SI_INT_DOTS_512)
    // Two blocks of a row as unsigned bytes in one vector, 128-bit lanes: block a's values 0..15,
    // 16..31, then block b's (Q8_0: q + 128, its center 128 instead of 0). a, b: the blocks'
    // integers (block_data_at).
    static __m512i block_pair_u(const char * a, const char * b) {
        if constexpr (is_five_bit<T>) {  // the nibbles, then bit l of the two qh words to byte l's bit 4
            uint32_t qh_a, qh_b;
            std::memcpy(&qh_a, a, 4);
            std::memcpy(&qh_b, b, 4);
            const __m512i fifth = _mm512_maskz_mov_epi8((__mmask64) qh_a | ((__mmask64) qh_b << 32), _mm512_set1_epi8(0x10));
            return _mm512_or_si512(AddRows<GGML_TYPE_Q4_0>::block_pair_u(a + 4, b + 4), fifth);
        } else if constexpr (T == GGML_TYPE_Q8_0) {
            const __m512i x = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *) a)),
                                                 _mm256_loadu_si256((const __m256i *) b), 1);
            return _mm512_xor_si512(x, _mm512_set1_epi8((char) 0x80));
        } else {
            const __m512i x = _mm512_inserti64x4(
                _mm512_castsi256_si512(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *) a))),
                _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *) b)), 1);
            return _mm512_and_si512(_mm512_srlv_epi64(x, _mm512_set_epi64(4, 4, 0, 0, 4, 4, 0, 0)), _mm512_set1_epi8(0x0F));
        }
    }

    // add_blocks_int's sums with AVX-512 VNNI (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1: a piece per block).
    // With the gathered scales (add_blocks_int), 576-wide Q4_1 rows on a Xeon with AMX: 35-50% less
    // time per row than add_int_block from L2, about 18% from L3.
    static void add_int_blocks_512(const char * const * rows, int nr, int64_t b0, int nb, const IntFactors & f,
                                   const float * offset, float * y) {
        constexpr int64_t bytes = block_bytes<T>;
        constexpr int at = block_data_at<T>, center = T == GGML_TYPE_Q8_0 ? 128 : is_five_bit<T> ? 16 : 8;
        auto u = [&](int k, int i, int i2) {
            return block_pair_u(rows[k] + bytes * (b0 + i) + at, rows[k] + bytes * (b0 + i2) + at);
        };
        add_int_pairs_512<1>(u, nr, nb, f, center, offset, y);
    }
#endif

#if defined(SI_INT_ROWS) && defined(SI_INT_DOTS_512)
    // y[0..32 nb) += S * sum_k W_k (u_k - c) + offset per piece, with AVX-512 VNNI: two blocks per
    // vector, four rows per dpbusd (their bytes interleaved, the four int8 factors of a piece in
    // each 32-bit lane), summed in 32 bits (at most 16 * 127 * 255), so no 16-bit flushes as in
    // add_int_block; one 4x4 transpose of 128-bit lanes per block pair puts the values back in
    // order. u(k, i, i2): row k's blocks i and i2 as unsigned bytes, 128-bit lanes holding i's
    // values 0..15, 16..31, then i2's. PPB pieces per block: 1 (piece = block) or 2 (Q6_K: piece
    // 2 b + half, for values 0..15 and 16..31).
    template <int PPB, typename U>
    static void add_int_pairs_512(U && u, int nr, int nb, const IntFactors & f, int center, const float * offset,
                                  float * y) {
        static_assert(PPB == 1 || PPB == 2, "one or two pieces per block");
        // rows 4q..4q+3's int8 factors of piece p in one 32-bit lane (a missing row's factor is 0)
        auto quad = [&](int q, int p) {
            return (int32_t) (((uint32_t) f.pair[2 * q][p] & 0xFFFFu) | ((uint32_t) f.pair[2 * q + 1][p] << 16));
        };
        for (int i = 0; i < nb; i += 2) {
            const int i2 = i + 1 < nb ? i + 1 : i;  // an odd last block pairs with itself; the copy is not stored
            int piece[4];  // of each 128-bit lane
            for (int h = 0; h < 4; ++h) piece[h] = PPB * (h < 2 ? i : i2) + (PPB == 2 ? h % 2 : 0);
            __m512i acc[4] = {_mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512()};
            for (int q = 0; q < (nr + 3) / 4; ++q) {
                __m512i x[4];
                for (int k = 0; k < 4; ++k) x[k] = u(4 * q + k < nr ? 4 * q + k : 0, i, i2);
                // 32-bit lane t of acc[j], in 128-bit lane L: value 4 j + t of L's sixteen, rows 4q..4q+3
                const __m512i t0 = _mm512_unpacklo_epi8(x[0], x[1]), t1 = _mm512_unpackhi_epi8(x[0], x[1]);
                const __m512i t2 = _mm512_unpacklo_epi8(x[2], x[3]), t3 = _mm512_unpackhi_epi8(x[2], x[3]);
                __m512i factors = _mm512_mask_set1_epi32(_mm512_set1_epi32(quad(q, piece[0])), 0xFF00, quad(q, piece[2]));
                if constexpr (PPB == 2) {
                    factors = _mm512_mask_set1_epi32(factors, 0x00F0, quad(q, piece[1]));
                    factors = _mm512_mask_set1_epi32(factors, 0xF000, quad(q, piece[3]));
                }
                acc[0] = _mm512_dpbusd_epi32(acc[0], _mm512_unpacklo_epi16(t0, t2), factors);
                acc[1] = _mm512_dpbusd_epi32(acc[1], _mm512_unpackhi_epi16(t0, t2), factors);
                acc[2] = _mm512_dpbusd_epi32(acc[2], _mm512_unpacklo_epi16(t1, t3), factors);
                acc[3] = _mm512_dpbusd_epi32(acc[3], _mm512_unpackhi_epi16(t1, t3), factors);
            }
            const __m512i lo01 = _mm512_shuffle_i32x4(acc[0], acc[1], 0x44), lo23 = _mm512_shuffle_i32x4(acc[2], acc[3], 0x44);
            const __m512i hi01 = _mm512_shuffle_i32x4(acc[0], acc[1], 0xEE), hi23 = _mm512_shuffle_i32x4(acc[2], acc[3], 0xEE);
            const __m512i sums[4] = {_mm512_shuffle_i32x4(lo01, lo23, 0x88), _mm512_shuffle_i32x4(lo01, lo23, 0xDD),
                                     _mm512_shuffle_i32x4(hi01, hi23, 0x88), _mm512_shuffle_i32x4(hi01, hi23, 0xDD)};
            for (int h = 0; h < (i2 != i ? 4 : 2); ++h) {  // values 0..15, 16..31 of block i, then of i2
                const int p = piece[h];
                float * out = y + 32 * (h < 2 ? i : i2) + 16 * (h % 2);
                const __m512i sum = _mm512_sub_epi32(sums[h], _mm512_set1_epi32(center * f.sum_w[p]));
                const __m512 prev = _mm512_add_ps(_mm512_loadu_ps(out), _mm512_set1_ps(offset[p]));
                _mm512_storeu_ps(out, _mm512_fmadd_ps(_mm512_set1_ps(f.step[p]), _mm512_cvtepi32_ps(sum), prev));
            }
        }
    }
#endif

#if defined(SI_INT_ROWS)
    // A K-quant super-block of every row in integers; false (nothing added) where the float loop must run.
    static bool add_super_block_int(const char * const * rows, const float * v, int nr, int64_t sb, float * y) {
        constexpr int NP = int_pieces<T>;
        const uint8_t * sbs[ADD_GROUP];
        float w[ADD_GROUP][NP], offset[NP] = {};
        for (int k = 0; k < nr; ++k) {
            sbs[k] = (const uint8_t *) rows[k] + k_super_bytes<T> * sb;
            int_super_scales<T>(sbs[k], v[k], w[k], offset);
        }
        IntFactors f;
        if (!quantize_factors<NP>(w, nr, f)) return false;
        // Q6_K's values are scale * (u - 32): its zero point is the center; Q4_K's and Q5_K's
        // d * sc * u - dmin * m: u - c in integers, c * scale joins the minimums' exact offsets
        constexpr int center = T == GGML_TYPE_Q6_K ? 32 : T == GGML_TYPE_Q5_K ? 16 : 8;
#if defined(SI_INT_DOTS_512)
        float offsets[16] = {};
        if constexpr (NP == 8) {
            for (int j = 0; j < 8; ++j) offsets[j] = offset[j] + center * f.sum_f[j];
        }
        auto u = [&](int k, int i, int /* i + 1: eight blocks */) {
            return k_block_pair_u<T>(sbs[k], i);
        };
        add_int_pairs_512<NP / 8>(u, nr, 8, f, center, offsets, y);
        return true;
#endif
        unroll<8>([&](auto J) {
            constexpr int j = decltype(J)::value;
            auto u = [&](int k) { return int_block_u<T>(sbs[k], j); };
            if constexpr (NP == 16) {
                const float none[2] = {0.0f, 0.0f};
                add_int_block<T>(u, nr, 2 * j, 2 * j + 1, f, center, none, y + 32 * j);
            } else {
                const float exact = offset[j] + center * f.sum_f[j], offsets[2] = {exact, exact};
                add_int_block<T>(u, nr, j, j, f, center, offsets, y + 32 * j);
            }
        });
        return true;
    }
#endif

    // A K-quant super-block of every row: in integers where it can, else its scales unpacked once
    // per row (not per block), then block by block with the block index a constant (no branches
    // on it in the inner loop).
    static void add_super_block(const char * const * rows, const float * v, int nr, int64_t sb, float * y) {
#if defined(SI_INT_ROWS)
        if (add_super_block_int(rows, v, nr, sb, y)) return;
#endif
        const uint8_t * sbs[ADD_GROUP];
        float scale[ADD_GROUP][16], offset[16] = {};
        for (int k = 0; k < nr; ++k) {
            sbs[k] = (const uint8_t *) rows[k] + k_super_bytes<T> * sb;
            k_super_scales<T>(sbs[k], v[k], scale[k], offset);
        }
        unroll<8>([&](auto J) {
            constexpr int j = decltype(J)::value;
            f32v acc[PARTS], q[PARTS];
            for (int p = 0; p < PARTS; ++p) acc[p] = load_as<f32v>(y + 32 * j + LANES * p);
            for (int k = 0; k < nr; ++k) {
                k_block_q<T>(sbs[k], j, q);
                for (int p = 0; p < PARTS; ++p) acc[p] += splat(scale[k][2 * j + p / HALF]) * q[p];
            }
            for (int p = 0; p < PARTS; ++p) acc[p] += offset[2 * j + p / HALF];
            for (int p = 0; p < PARTS; ++p) std::memcpy(y + 32 * j + LANES * p, &acc[p], sizeof acc[p]);
        });
    }
};

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

// Blocks [b0, b0 + n_blocks) of 32 values of a row as floats, converted in registers (ggml's
// to_float is scalar code for most quantized types); K-quants a super-block at a time where the
// range holds whole ones (their scales unpacked once).
template <ggml_type T> struct BlocksToFloat {
    static void run(const char * row, int64_t b0, int64_t n_blocks, float * out) {
        if constexpr (is_k_quant<T>) {
            if (b0 % 8 == 0 && n_blocks % 8 == 0) {
                for (int64_t sb = b0 / 8; sb < (b0 + n_blocks) / 8; ++sb, out += 256) {
                    super_block_to_float((const uint8_t *) row + k_super_bytes<T> * sb, out);
                }
                return;
            }
        }
        for (int64_t b = 0; b < n_blocks; ++b) {
            f32v vals[PARTS];
            block_values<T>(row, b0 + b, vals);
            std::memcpy(out + 32 * b, vals, sizeof vals);
        }
    }

    static void super_block_to_float(const uint8_t * sb, float * out) {
        float scale[16], offset[16] = {};
        k_super_scales<T>(sb, 1.0f, scale, offset);
        unroll<8>([&](auto J) {
            constexpr int j = decltype(J)::value;
            f32v q[PARTS];
            k_block_q<T>(sb, j, q);
            for (int p = 0; p < PARTS; ++p) {
                const f32v value = splat(scale[2 * j + p / HALF]) * q[p] + offset[2 * j + p / HALF];
                std::memcpy(out + 32 * j + LANES * p, &value, sizeof value);
            }
        });
    }
};

}  // namespace si_blocks
