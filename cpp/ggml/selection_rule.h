// The selection rule of ggml_si_count and ggml_si_select (sparse_ffn_ops.h), written once for the
// CPU kernels (cpu/select.cpp), the CUDA kernels (sparse_ffn_cuda.cu) and the host check of
// the CUDA algorithm (tests/test_cuda_logic.py):
//   - a token's neurons are ranked by value, or |value|, NaN below every number;
//   - a token's top k: k = round(alpha * mean number of positive activations per token);
//   - ties go to the lower row.
// The CUDA kernels find the k-th largest key by its bits, eight at a time from the top (a radix
// select): order_bits maps a key to an unsigned integer in the same order, and next_digit is the
// step each pass takes over the histogram of the candidates' next eight bits.
#pragma once

#include "host_device.h"

#include <cmath>
#include <cstdint>

namespace si_rule {

using si_hd::bits_float;
using si_hd::float_bits;

// The key a token's neuron is ranked by: NaN ranks below every number (a broken activation is
// never chosen over a real one), and -0 equals +0 (as the comparison of floats has it). On the
// bits, so that a device flushing subnormals to zero ranks them as the CPU does.
SI_HD float rank_key(float a, bool by_magnitude) {
    uint32_t u = float_bits(a);
    if ((u & 0x7fffffffu) > 0x7f800000u) return bits_float(0xff800000u);  // NaN: -inf
    if (by_magnitude || u == 0x80000000u) u &= 0x7fffffffu;
    return bits_float(u);
}

// Whether an activation counts as positive for top_k: on the bits (above +0, up to +inf, NaN not),
// so that a device flushing subnormals to zero (CUDA's -use_fast_math) counts them as the CPU does.
SI_HD bool is_positive(float a) { return float_bits(a) - 1u < 0x7f800000u; }

// The score ggml_si_select ranks a value x by (enum ggml_si_score): x itself, or |act(x)| of a gate
// value: SiLU x / (1 + e^-x) as upstream's ggml_silu, and GELU's tanh form, 0.5 x (1 + tanh(u)),
// written x / (1 + e^-2u), which is the same function without the cancellation of 1 + tanh(u) for
// x < 0. Both rest on one exp, so the score is within a few 1e-6 relative of the exact one on the
// CPU and on a device whose exp is its fast approximate one. A NaN stays NaN (ranked last by rank_key).
SI_HD float score_of(float x, int score) {
    if (score == 1) return fabsf(x / (1.0f + expf(-x)));
    if (score == 2) return fabsf(x / (1.0f + expf(-1.5957691216f * (x + 0.044715f * x * x * x))));
    return x;
}

// A candidate's score times its scale (ggml_si_select's optional per-neuron weight; 1 without).
SI_HD float scaled_score(float x, int score, const float * scale, int64_t i) {
    const float s = score_of(x, score);
    return scale ? s * scale[i] : s;
}

// k, the number of neurons each token of a batch votes for: alpha times the mean number of
// positive activations per token, rounded half away from zero, at most n_load.
SI_HD int64_t top_k(float alpha, int64_t positives, int64_t n_tokens, int64_t n_load) {
    if (n_tokens <= 0) return 0;
    const int64_t k = llround((double) alpha * (double) positives / (double) n_tokens);
    return k < n_load ? k : n_load;
}

// An unsigned integer in the order of the float keys (no NaN: rank_key maps NaN to -inf).
SI_HD uint32_t order_bits(float key) {
    const uint32_t u = float_bits(key);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// One pass of the radix select. hist[d]: how many candidates (keys that share the digits chosen
// so far) have d as their next eight bits. `wanted` is the rank, from the top, of the sought key
// among the candidates (1 = the largest); returns the digit that holds it and lowers `wanted` by
// the candidates with a larger digit, so that after the last pass `wanted` is how many keys equal
// to the k-th largest are taken (the lowest rows).
SI_HD int next_digit(const int * hist, int64_t & wanted) {
    int64_t above = 0;
    for (int d = 255; d > 0; --d) {
        if (above + hist[d] >= wanted) {
            wanted -= above;
            return d;
        }
        above += hist[d];
    }
    wanted -= above;
    return 0;
}

// The order bits of the k-th largest of n keys (1 <= k <= n) and how many equal keys are taken
// (ties, the lowest rows): the radix select's passes, written sequentially for the host (the
// kernels build each histogram in parallel). After the first pass the keys sharing its digit are
// copied to `narrowed` (room for n), so the later passes read only those, without a branch on
// every key.
template <typename KeyAt>
inline uint32_t kth_largest(KeyAt key_at, int64_t n, int64_t k, int64_t & ties, uint32_t * narrowed) {
    int64_t wanted = k;
    int hist[256] = {0};
    for (int64_t i = 0; i < n; ++i) hist[key_at(i) >> 24] += 1;
    uint32_t prefix = (uint32_t) next_digit(hist, wanted) << 24;
    int64_t m = 0;
    for (int64_t i = 0; i < n; ++i) {
        const uint32_t u = key_at(i);
        narrowed[m] = u;
        m += (u >> 24) == (prefix >> 24);
    }
    for (int shift = 16; shift >= 0; shift -= 8) {
        const uint32_t mask = ~0u << (shift + 8);  // the digits chosen so far
        int h[256] = {0};
        for (int64_t j = 0; j < m; ++j) h[(narrowed[j] >> shift) & 255] += (narrowed[j] & mask) == prefix;
        prefix |= (uint32_t) next_digit(h, wanted) << shift;
    }
    ties = wanted;
    return prefix;
}

// Calls take(i, place) for the k largest of keys key_at(0 .. n) (order_bits), ties to the lower
// index, in ascending order of i, place counting from 0: everything above the k-th largest key,
// then the first `ties` equal to it. The CPU select kernel runs it as it is (the count kernel
// takes kth_largest and counts the votes without a branch per key); the CUDA kernels run the
// same passes with a thread block (block_top_k in sparse_ffn_cuda.cu).
template <typename KeyAt, typename Take>
inline void take_top_k(KeyAt key_at, int64_t n, int64_t k, Take take, uint32_t * narrowed) {
    if (k <= 0) return;
    int64_t ties = 0;
    const uint32_t kth = kth_largest(key_at, n, k, ties, narrowed);
    int64_t place = 0;
    for (int64_t i = 0; i < n; ++i) {
        const uint32_t u = key_at(i);
        if (u > kth || (u == kth && ties-- > 0)) take(i, place++);
    }
}

}  // namespace si_rule
