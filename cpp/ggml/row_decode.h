// The values of a weight row, 32 at a time, for every type of GGML_SI_FUSED_TYPES: the CUDA
// kernels' dequantization (sparse_ffn_cuda.cu), written once for the host and the device so that
// the CPU tests check it against gguf-py's dequantization (tests/test_cuda_logic.py). Byte
// layouts as ggml stores them (ggml-common.h); 16-bit fields are read whole on the device (see u16_at).
#pragma once

#include "ggml.h"
#include "host_device.h"

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#include <cuda_fp16.h>
#endif

namespace si_decode {

using si_hd::bits_float;

// Every 16-bit field of these formats sits at an even offset of a row, and rows start aligned:
// the device reads it whole, the host byte-wise (little-endian).
SI_HD uint16_t u16_at(const uint8_t * p) {
#if defined(__CUDA_ARCH__)
    return *(const uint16_t *) p;
#else
    return (uint16_t) (p[0] | (p[1] << 8));
#endif
}

SI_HD float f32_at(const uint8_t * p) {
#if defined(__CUDA_ARCH__)
    return *(const float *) p;
#else
    float f;
    std::memcpy(&f, p, sizeof f);
    return f;
#endif
}

// An IEEE half as a float, exactly (subnormals, infinities and NaN included).
SI_HD float fp16_to_float(uint16_t h) {
#if defined(__CUDA_ARCH__)
    return __half2float(__ushort_as_half(h));
#else
    const uint32_t sign = (uint32_t) (h & 0x8000) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
    if (exp == 0) {  // zero or subnormal: mant * 2^-24
        const float v = (float) mant * 5.9604644775390625e-08f;
        return sign ? -v : v;
    }
    if (exp == 31) return bits_float(sign | 0x7f800000u | (mant << 13));
    return bits_float(sign | ((exp + 112) << 23) | (mant << 13));
#endif
}

SI_HD float fp16_at(const uint8_t * p) { return fp16_to_float(u16_at(p)); }
SI_HD float bf16_at(const uint8_t * p) { return bits_float((uint32_t) u16_at(p) << 16); }

// The 6-bit scale and min of sub-block j (0..7) of a Q4_K / Q5_K super-block's 12 scale bytes.
SI_HD void k_scale_min(const uint8_t * q, int j, float & scale, float & min) {
    if (j < 4) {
        scale = (float) (q[j] & 63);
        min = (float) (q[j + 4] & 63);
    } else {
        scale = (float) ((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        min = (float) ((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

// Format<T>: BLOCK_VALUES values in BLOCK_BYTES bytes; group(block, g, y) writes the 32 values of
// group g (0 .. BLOCK_VALUES / 32 - 1) of a block.
template <ggml_type T> struct Format;

template <> struct Format<GGML_TYPE_F32> {
    static constexpr int BLOCK_VALUES = 32, BLOCK_BYTES = 128;
    static SI_HD void group(const uint8_t * b, int, float * y) {
        for (int i = 0; i < 32; ++i) y[i] = f32_at(b + 4 * i);
    }
};

template <> struct Format<GGML_TYPE_F16> {
    static constexpr int BLOCK_VALUES = 32, BLOCK_BYTES = 64;
    static SI_HD void group(const uint8_t * b, int, float * y) {
        for (int i = 0; i < 32; ++i) y[i] = fp16_at(b + 2 * i);
    }
};

template <> struct Format<GGML_TYPE_BF16> {
    static constexpr int BLOCK_VALUES = 32, BLOCK_BYTES = 64;
    static SI_HD void group(const uint8_t * b, int, float * y) {
        for (int i = 0; i < 32; ++i) y[i] = bf16_at(b + 2 * i);
    }
};

// d (fp16), 32 x int8
template <> struct Format<GGML_TYPE_Q8_0> {
    static constexpr int BLOCK_VALUES = 32, BLOCK_BYTES = 34;
    static SI_HD void group(const uint8_t * b, int, float * y) {
        const float d = fp16_at(b);
        for (int i = 0; i < 32; ++i) y[i] = d * (float) (int8_t) b[2 + i];
    }
};

// d (fp16), 16 bytes: value i in the low nibble of byte i, value i + 16 in its high nibble, minus 8
template <> struct Format<GGML_TYPE_Q4_0> {
    static constexpr int BLOCK_VALUES = 32, BLOCK_BYTES = 18;
    static SI_HD void group(const uint8_t * b, int, float * y) {
        const float d = fp16_at(b);
        for (int i = 0; i < 16; ++i) {
            y[i] = d * (float) ((b[2 + i] & 0xF) - 8);
            y[i + 16] = d * (float) ((b[2 + i] >> 4) - 8);
        }
    }
};

// d, m (fp16), 16 bytes as Q4_0: d * q + m
template <> struct Format<GGML_TYPE_Q4_1> {
    static constexpr int BLOCK_VALUES = 32, BLOCK_BYTES = 20;
    static SI_HD void group(const uint8_t * b, int, float * y) {
        const float d = fp16_at(b), m = fp16_at(b + 2);
        for (int i = 0; i < 16; ++i) {
            y[i] = d * (float) (b[4 + i] & 0xF) + m;
            y[i + 16] = d * (float) (b[4 + i] >> 4) + m;
        }
    }
};

// Q5_0: d (fp16), qh (4 bytes, little-endian: bit i is the fifth bit of value i), 16 bytes of
// nibbles as Q4_0; value minus 16. Q5_1: d, m (fp16), then qh and the nibbles; d * q + m.
template <ggml_type T> struct Format5 {
    static constexpr bool WITH_MIN = T == GGML_TYPE_Q5_1;
    static constexpr int BLOCK_VALUES = 32, BLOCK_BYTES = WITH_MIN ? 24 : 22;
    static SI_HD void group(const uint8_t * b, int, float * y) {
        const float d = fp16_at(b), m = WITH_MIN ? fp16_at(b + 2) : 0.0f;
        const int zero = WITH_MIN ? 0 : 16;
        const uint8_t * qh = b + (WITH_MIN ? 4 : 2);
        const uint8_t * q = qh + 4;
        for (int i = 0; i < 16; ++i) {
            const int lo = (q[i] & 0xF) | (((qh[i / 8] >> (i % 8)) & 1) << 4);
            const int hi = (q[i] >> 4) | (((qh[2 + i / 8] >> (i % 8)) & 1) << 4);
            y[i] = d * (float) (lo - zero) + m;
            y[i + 16] = d * (float) (hi - zero) + m;
        }
    }
};
template <> struct Format<GGML_TYPE_Q5_0> : Format5<GGML_TYPE_Q5_0> {};
template <> struct Format<GGML_TYPE_Q5_1> : Format5<GGML_TYPE_Q5_1> {};

// d, dmin (fp16), 12 scale bytes, 128 bytes: group g in the low (even g) or high (odd g) nibbles
// of bytes 32 * (g / 2) ..; d * scale * q - dmin * min
template <> struct Format<GGML_TYPE_Q4_K> {
    static constexpr int BLOCK_VALUES = 256, BLOCK_BYTES = 144;
    static SI_HD void group(const uint8_t * b, int g, float * y) {
        float scale, min;
        k_scale_min(b + 4, g, scale, min);
        const float d = fp16_at(b) * scale, m = fp16_at(b + 2) * min;
        const uint8_t * q = b + 16 + 32 * (g / 2);
        const int shift = 4 * (g & 1);
        for (int i = 0; i < 32; ++i) y[i] = d * (float) ((q[i] >> shift) & 0xF) - m;
    }
};

// d, dmin (fp16), 12 scale bytes, 32 high-bit bytes (bit g of byte i: the fifth bit of value i of
// group g), 128 bytes of low nibbles as Q4_K
template <> struct Format<GGML_TYPE_Q5_K> {
    static constexpr int BLOCK_VALUES = 256, BLOCK_BYTES = 176;
    static SI_HD void group(const uint8_t * b, int g, float * y) {
        float scale, min;
        k_scale_min(b + 4, g, scale, min);
        const float d = fp16_at(b) * scale, m = fp16_at(b + 2) * min;
        const uint8_t * qh = b + 16;
        const uint8_t * q = b + 48 + 32 * (g / 2);
        const int shift = 4 * (g & 1);
        for (int i = 0; i < 32; ++i) {
            const int v = ((q[i] >> shift) & 0xF) | (((qh[i] >> g) & 1) << 4);
            y[i] = d * (float) v - m;
        }
    }
};

// 128 bytes of low nibbles, 64 bytes of 2-bit highs, 16 int8 scales, d (fp16). Values in halves
// of 128; within a half, group q (0..3) takes low (q < 2) or high nibbles of bytes 32 * (q & 1) ..,
// high bits 2q of the half's 32 high bytes, scale 2q (values 0-15) and 2q + 1 (values 16-31).
template <> struct Format<GGML_TYPE_Q6_K> {
    static constexpr int BLOCK_VALUES = 256, BLOCK_BYTES = 210;
    static SI_HD void group(const uint8_t * b, int g, float * y) {
        const int half = g / 4, q = g % 4;
        const uint8_t * ql = b + 64 * half + 32 * (q & 1);
        const uint8_t * qh = b + 128 + 32 * half;
        const int8_t * sc = (const int8_t *) (b + 192 + 8 * half);
        const float d = fp16_at(b + 208);
        const int shift = 4 * (q >> 1), hshift = 2 * q;
        for (int i = 0; i < 32; ++i) {
            const int v = (((ql[i] >> shift) & 0xF) | (((qh[i] >> hshift) & 3) << 4)) - 32;
            y[i] = d * (float) sc[2 * q + i / 16] * (float) v;
        }
    }
};

// Values 32 g .. 32 g + 31 of a row of type T.
template <ggml_type T> SI_HD void row_group(const uint8_t * row, int64_t g, float * y) {
    constexpr int per_block = Format<T>::BLOCK_VALUES / 32;
    Format<T>::group(row + (g / per_block) * Format<T>::BLOCK_BYTES, (int) (g % per_block), y);
}

}  // namespace si_decode
