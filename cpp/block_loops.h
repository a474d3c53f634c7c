// The fused block loops of the row ops (step 3, selective computation): the 32 values of a weight
// block decoded in registers, per type of GGML_SI_FUSED_TYPES, and the loops over rows built on
// them (sparse_ffn_cpu.cpp). Self-contained (ggml.h for the type names) so that a test can build
// them for every x86 level and check them against numpy (tests/test_block_loops.py).
#pragma once

#include "ggml.h"

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
        // Q4_K, Q5_K: 12 bytes hold the eight blocks' 6-bit scales and mins: bytes 0-3 scales 0-3
        // (low 6 bits), 4-7 mins 0-3, 8-11 the low 4 bits of scales 4-7 and (high nibble) mins 4-7,
        // whose top 2 bits are the top bits of bytes 0-3 (scales) and 4-7 (mins); four bytes at a time
        uint32_t w[3];
        std::memcpy(w, sb + 4, 12);
        const uint32_t packed[4] = {
            w[0] & 0x3F3F3F3Fu,                                         // scales 0-3
            (w[2] & 0x0F0F0F0Fu) | ((w[0] >> 2) & 0x30303030u),         // scales 4-7
            w[1] & 0x3F3F3F3Fu,                                         // mins 0-3
            ((w[2] >> 4) & 0x0F0F0F0Fu) | ((w[1] >> 2) & 0x30303030u),  // mins 4-7
        };
        f32v parts[HALF];
        bytes_to_f32(load_as<u8x16>(packed), parts);
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
        const uint8_t * blk = (const uint8_t *) row + 34 * b;
        bytes_to_f32(load_as<u8x16>(blk + 2) ^ 0x80, q);
        bytes_to_f32(load_as<u8x16>(blk + 18) ^ 0x80, q + HALF);
        const float d = fp16(blk);
        s = {{d, d}, {-128.0f * d, -128.0f * d}};
    } else if constexpr (T == GGML_TYPE_Q4_0 || T == GGML_TYPE_Q4_1) {
        // Q4_0: d, 16 bytes; Q4_1: d, m, 16 bytes. Low nibbles are values 0..15, high 16..31.
        constexpr bool with_min = T == GGML_TYPE_Q4_1;
        const uint8_t * blk = (const uint8_t *) row + (with_min ? 20 : 18) * b;
        const u8x16 packed = load_as<u8x16>(blk + (with_min ? 4 : 2));
        bytes_to_f32(packed & 0x0F, q);
        bytes_to_f32(packed >> 4, q + HALF);
        const float d = fp16(blk), offset = with_min ? fp16(blk + 2) : -8.0f * d;
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

// y[0..E) += sum_k v[k] * rows[k][0..E) for nr <= GROUP rows, block by block: GROUP weight
// streams keep the memory bus busy, and y is read and written once per block.
template <ggml_type T> struct AddRows {
    static void run(const char * const * rows, const float * v, int nr, int64_t E, float * y) {
        if constexpr (is_k_quant<T>) {
            for (int64_t sb = 0; sb < E / 256; ++sb) add_super_block(rows, v, nr, sb, y + 256 * sb);
            return;
        }
        for (int64_t b = 0; b < E / 32; ++b) {
            f32v acc[PARTS], vals[PARTS];
            for (int p = 0; p < PARTS; ++p) acc[p] = load_as<f32v>(y + 32 * b + LANES * p);
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
            for (int p = 0; p < PARTS; ++p) std::memcpy(y + 32 * b + LANES * p, &acc[p], sizeof acc[p]);
        }
    }

    // A K-quant super-block of every row: its scales unpacked once per row (not per block), then
    // block by block with the block index a constant (no branches on it in the inner loop).
    static void add_super_block(const char * const * rows, const float * v, int nr, int64_t sb, float * y) {
        const uint8_t * sbs[GROUP];
        float scale[GROUP][16], offset[16] = {};
        for (int k = 0; k < nr; ++k) {
            sbs[k] = (const uint8_t *) rows[k] + k_super_bytes<T> * sb;
            // the next super-block of the row, ahead of the hardware prefetcher (Q6_K: 2x on Zen 4,
            // whose streams lose track of eight rows read end first: scales, then values)
            for (int line = 0; line < k_super_bytes<T> + 64; line += 64) __builtin_prefetch(sbs[k] + k_super_bytes<T> + line);
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
