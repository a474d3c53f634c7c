// count (a prompt batch's votes) and select (the most counted neurons): a radix select per token
// (selection_rule.h), with AVX-512 partitions in vectors.
#include "sparse_ffn_cpu.h"
#include "selection_rule.h"

#include <functional>

namespace si_cpu {

#if defined(SI_PARTITION_SELECT)  // x86 with AVX-512F (cpu_features.h)
// --- a token's top k on AVX-512: the k-th largest key by partitions in vectors ------------------
// The radix select reads every key into a histogram, one scalar increment each, in four passes.
// Here a pass compares sixteen keys at a time with two pivots taken from a sorted sample of the
// candidates around the k-th's expected rank, and keeps, compressed, the keys between them (or
// above, or below, when the k-th is there): two passes of ~1/16 of the keys each, then a sort of
// the few left. Same rule and result as si_rule::kth_largest (selection_rule.h), which takes over
// when a pass keeps every candidate (many equal keys).
constexpr int64_t SAMPLE = 32;  // also the candidates that are sorted instead

// keys[0..m) (m <= SAMPLE) into out in descending order: each key goes to its rank, the keys
// above it plus the equal ones before it, counted in two vectors (std::sort's insertion sort of
// so few keys mispredicts a branch at every other step: it was 45% of the counting op's time)
static void sort_descending_few(const uint32_t * keys, int64_t m, uint32_t * out) {
    static_assert(SAMPLE == 32, "two vectors of keys");
    const __mmask16 live[2] = {tail_mask(m), tail_mask(m - 16)};
    const __m512i v[2] = {_mm512_maskz_loadu_epi32(live[0], keys), _mm512_maskz_loadu_epi32(live[1], keys + 16)};
    for (int64_t j = 0; j < m; ++j) {
        const __m512i key = _mm512_set1_epi32((int) keys[j]);
        int rank = 0;
        for (int h = 0; h < 2; ++h) {
            const __mmask16 before = tail_mask(j - 16 * h);
            rank += __builtin_popcount(_mm512_mask_cmpgt_epu32_mask(live[h], v[h], key)) +
                    __builtin_popcount(_mm512_mask_cmpeq_epu32_mask(live[h] & before, v[h], key));
        }
        out[rank] = keys[j];
    }
}

// How many of keys[0..m) are above hi, and at or above lo.
static void count_above(const uint32_t * keys, int64_t m, uint32_t hi, uint32_t lo, int64_t & above_hi, int64_t & from_lo) {
    const __m512i h = _mm512_set1_epi32((int) hi), l = _mm512_set1_epi32((int) lo);
    above_hi = from_lo = 0;
    for (int64_t i = 0; i < m; i += 16) {
        const __mmask16 live = tail_mask(m - i);
        const __m512i v = _mm512_maskz_loadu_epi32(live, keys + i);
        above_hi += __builtin_popcount(_mm512_mask_cmpgt_epu32_mask(live, v, h));
        from_lo += __builtin_popcount(_mm512_mask_cmpge_epu32_mask(live, v, l));
    }
}

// The keys of keys[0..m) in [lo, hi], in order, into out (which may be keys: it writes behind
// what it has read); returns how many.
static int64_t keep_between(const uint32_t * keys, int64_t m, uint32_t lo, uint32_t hi, uint32_t * out) {
    const __m512i h = _mm512_set1_epi32((int) hi), l = _mm512_set1_epi32((int) lo);
    int64_t n_out = 0;
    for (int64_t i = 0; i < m; i += 16) {
        const __mmask16 live = tail_mask(m - i);
        const __m512i v = _mm512_maskz_loadu_epi32(live, keys + i);
        const __mmask16 in = _mm512_mask_cmple_epu32_mask(_mm512_mask_cmpge_epu32_mask(live, v, l), v, h);
        _mm512_mask_compressstoreu_epi32(out + n_out, in, v);
        n_out += __builtin_popcount(in);
    }
    return n_out;
}

// The order bits of the k-th largest of keys[0..n) (1 <= k <= n) and how many keys equal to it
// are taken (the lowest rows), as si_rule::kth_largest; cand: room for n.
static uint32_t kth_largest_partition(const uint32_t * keys, int64_t n, int64_t k, int64_t & ties, uint32_t * cand) {
    const uint32_t * src = keys;
    int64_t m = n, wanted = k;  // candidates, and the rank among them sought (1 = the largest)
    while (m > SAMPLE) {
        uint32_t picked[SAMPLE], sample[SAMPLE];
        for (int64_t j = 0; j < SAMPLE; ++j) picked[j] = src[j * m / SAMPLE];
        sort_descending_few(picked, SAMPLE, sample);
        const int64_t r = (wanted - 1) * SAMPLE / m;  // the k-th's rank in the sample, expected
        const uint32_t hi = sample[std::max<int64_t>(r - 1, 0)], lo = sample[std::min<int64_t>(r + 1, SAMPLE - 1)];
        int64_t above_hi, from_lo;
        count_above(src, m, hi, lo, above_hi, from_lo);
        int64_t kept;
        if (above_hi >= wanted) {  // above hi
            kept = keep_between(src, m, hi + 1, UINT32_MAX, cand);
        } else if (from_lo < wanted) {  // below lo
            wanted -= from_lo;
            kept = keep_between(src, m, 0, lo - 1, cand);
        } else {  // in [lo, hi]
            wanted -= above_hi;
            kept = keep_between(src, m, lo, hi, cand);
        }
        if (kept == m) {  // nothing left out (equal keys): the radix select, narrowing in place
            return si_rule::kth_largest([&](int64_t i) { return cand[i]; }, m, wanted, ties, cand);
        }
        src = cand;
        m = kept;
    }
    uint32_t sorted[SAMPLE];  // (m <= SAMPLE)
    sort_descending_few(src, m, sorted);
    const uint32_t kth = sorted[wanted - 1];
    ties = wanted - (std::lower_bound(sorted, sorted + m, kth, std::greater<uint32_t>()) - sorted);
    return kth;
}

// A token's keys (si_rule::order_bits of si_rule::rank_key), sixteen at a time.
static void token_keys(const float * a, int64_t n, bool by_magnitude, uint32_t * keys) {
    const __m512i abs_bits = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000);
    const __m512i minus_inf = _mm512_set1_epi32((int) 0xff800000u), minus_zero = _mm512_set1_epi32((int) 0x80000000u);
    const __m512i ones = _mm512_set1_epi32(-1);
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 live = tail_mask(n - i);
        __m512i u = _mm512_maskz_loadu_epi32(live, a + i);
        const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, abs_bits), inf);
        const __mmask16 unsigned_ = (by_magnitude ? (__mmask16) 0xffff : _mm512_cmpeq_epi32_mask(u, minus_zero)) & ~nan;
        u = _mm512_mask_and_epi32(_mm512_mask_mov_epi32(u, nan, minus_inf), unsigned_, u, abs_bits);  // NaN: -inf
        const __mmask16 negative = _mm512_cmplt_epi32_mask(u, _mm512_setzero_si512());
        u = _mm512_mask_xor_epi32(_mm512_or_si512(u, minus_zero), negative, u, ones);  // ~u, or u | sign
        _mm512_mask_storeu_epi32(keys + i, live, u);
    }
}

// Of the sixteen keys from i on: those above kth and, while `ties` lasts, those equal to it (the
// lower rows first); `ties` is lowered by the equal ones taken.
inline __mmask16 taken_lanes(const uint32_t * keys, int64_t i, int64_t n, __m512i kth, int64_t & ties) {
    const __mmask16 live = tail_mask(n - i);
    const __m512i v = _mm512_maskz_loadu_epi32(live, keys + i);
    __mmask16 taken = _mm512_mask_cmpgt_epu32_mask(live, v, kth);
    for (__mmask16 equal = _mm512_mask_cmpeq_epu32_mask(live, v, kth); equal && ties > 0; --ties) {
        const __mmask16 lowest = equal & (__mmask16) -equal;
        taken |= lowest;
        equal ^= lowest;
    }
    return taken;
}

// out[0..k) = first_index + i for the keys above kth and the first `ties` equal to it, ascending.
static void take_indices(const uint32_t * keys, int64_t n, uint32_t kth, int64_t ties, int32_t first_index, int32_t * out) {
    const __m512i kv = _mm512_set1_epi32((int) kth), step = _mm512_set1_epi32(16);
    __m512i index = _mm512_add_epi32(_mm512_set1_epi32(first_index),
                                     _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0));
    int64_t place = 0;
    for (int64_t i = 0; i < n; i += 16, index = _mm512_add_epi32(index, step)) {
        const __mmask16 taken = taken_lanes(keys, i, n, kv, ties);
        _mm512_mask_compressstoreu_epi32(out + place, taken, index);
        place += __builtin_popcount(taken);
    }
}

// count[i] += 1 for the keys above kth and the first `ties` equal to it.
static void add_votes(const uint32_t * keys, int64_t n, uint32_t kth, int64_t ties, int32_t * count) {
    const __m512i kv = _mm512_set1_epi32((int) kth), one = _mm512_set1_epi32(1);
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 taken = taken_lanes(keys, i, n, kv, ties), live = tail_mask(n - i);
        const __m512i c = _mm512_maskz_loadu_epi32(live, count + i);
        _mm512_mask_storeu_epi32(count + i, live, _mm512_mask_add_epi32(c, taken, c, one));
    }
}
#endif

// One thread's scratch of the counting op: three arrays of n_load.
struct CountScratch {
    uint32_t * key;       // the token's ranking key per neuron (si_rule::order_bits)
    uint32_t * narrowed;  // the radix select's candidates after its first pass
    int32_t * count;      // votes of this thread's tokens
};

size_t count_scratch_bytes(int64_t n_load) {
    return (size_t) n_load * (2 * sizeof(uint32_t) + sizeof(int32_t));
}

static CountScratch count_scratch(void * base, int64_t n_load) {
    uint32_t * k = (uint32_t *) base;
    return {k, k + n_load, (int32_t *) (k + 2 * n_load)};
}

void count_votes(const ggml_compute_params * params, ggml_tensor * dst) {
    const ggml_tensor * prev = dst->src[1];
    const float alpha = ggml_get_op_params_f32(dst, GGML_SI_COUNT_ALPHA);
    const bool by_magnitude = ggml_get_op_params_i32(dst, GGML_SI_COUNT_BY_MAGNITUDE) != 0;
    const int64_t n_load = dst->ne[0], T = dst->src[0]->ne[1];
    const int ith = params->ith, nth = params->nth;
    // a token's activations: act's neurons, then act_rest's where given (neurons n_first on)
    const ggml_tensor * parts[2] = {dst->src[0], dst->src[2]};
    const int n_parts = parts[1] ? 2 : 1;
    const int64_t n_first = parts[0]->ne[0];
    auto token = [&](int p, int64_t t) { return (const float *) ((const char *) parts[p]->data + t * parts[p]->nb[1]); };

    int64_t * positives = (int64_t *) params->wdata;
    auto scratch_of = [&](int i) {
        return count_scratch((char *) params->wdata + nth * sizeof(int64_t) + i * count_scratch_bytes(n_load), n_load);
    };
    const CountScratch mine = scratch_of(ith);

    // k = round(alpha * mean number of positive activations per token); threads take tokens in turn
    int64_t my_positives = 0;  // summed in a register (vectorised), not through the shared array
    for (int64_t t = ith; t < T; t += nth) {
        for (int p = 0; p < n_parts; ++p) {
            const float * a = token(p, t);
            for (int64_t i = 0; i < parts[p]->ne[0]; ++i) my_positives += si_rule::is_positive(a[i]);
        }
    }
    positives[ith] = my_positives;
    ggml_barrier(params->threadpool);
    int64_t all_positives = 0;
    for (int i = 0; i < nth; ++i) all_positives += positives[i];
    const int64_t k = si_rule::top_k(alpha, all_positives, T, n_load);

    // a token's top k (selection_rule.h): the k-th largest key by radix select, then every neuron
    // above it and, among those equal to it, the lower rows until k are counted (without a branch
    // on every neuron: about half of them are taken)
    std::fill(mine.count, mine.count + n_load, 0);
    for (int64_t t = ith; t < T && k > 0; t += nth) {
        int64_t ties = 0;
#if defined(SI_PARTITION_SELECT)
        for (int p = 0; p < n_parts; ++p) token_keys(token(p, t), parts[p]->ne[0], by_magnitude, mine.key + p * n_first);
        const uint32_t kth = kth_largest_partition(mine.key, n_load, k, ties, mine.narrowed);
        add_votes(mine.key, n_load, kth, ties, mine.count);
#else
        for (int p = 0; p < n_parts; ++p) {
            const float * a = token(p, t);
            for (int64_t i = 0; i < parts[p]->ne[0]; ++i) {
                mine.key[p * n_first + i] = si_rule::order_bits(si_rule::rank_key(a[i], by_magnitude));
            }
        }
        const uint32_t kth = si_rule::kth_largest([&](int64_t i) { return mine.key[i]; }, n_load, k, ties, mine.narrowed);
        for (int64_t i = 0; i < n_load; ++i) {
            bool taken = mine.key[i] > kth;
            if (mine.key[i] == kth) taken = ties-- > 0;
            mine.count[i] += taken;
        }
#endif
    }
    ggml_barrier(params->threadpool);
    // threads merge the counts, each a range of neurons, onto the previous batches' counts
    const int64_t per = ceil_div(n_load, nth);
    const int64_t i0 = std::min(n_load, per * ith), i1 = std::min(n_load, i0 + per);
    float * out = (float *) dst->data;
    const float * before = prev ? (const float *) prev->data : nullptr;
    for (int64_t i = i0; i < i1; ++i) {
        int64_t votes = 0;
        for (int t = 0; t < nth; ++t) votes += scratch_of(t).count[i];
        out[i] = (before ? before[i] : 0.0f) + (float) votes;
    }
}

void select_neurons(const ggml_compute_params * params, ggml_tensor * dst) {
    const float * counts = (const float *) dst->src[0]->data;
    const int64_t n_load = dst->src[0]->ne[0];
    const int32_t n_static = ggml_get_op_params_i32(dst, GGML_SI_SELECT_N_STATIC);
    const int32_t n_dynamic = ggml_get_op_params_i32(dst, GGML_SI_SELECT_N_DYNAMIC);
    const int32_t score = ggml_get_op_params_i32(dst, GGML_SI_SELECT_SCORE);
    const float * candidates = counts + n_static;
    const float * scale = dst->src[1] ? (const float *) dst->src[1]->data : nullptr;
    // keys once (the select reads each several times), threads a range each (a decode step's
    // score |act(x)| costs an exp per candidate); then one thread chooses
    uint32_t * keys = (uint32_t *) params->wdata;
    const int64_t n = n_load - n_static, per = ceil_div(n, params->nth);
    const int64_t i0 = std::min(n, per * params->ith), i1 = std::min(n, i0 + per);
    for (int64_t i = i0; i < i1; ++i) {
        keys[i] = si_rule::order_bits(si_rule::rank_key(si_rule::scaled_score(candidates[i], score, scale, i), false));
    }
    ggml_barrier(params->threadpool);
    if (params->ith != 0) {
        return;
    }
    // the n_dynamic non-static neurons of the highest score, ties to the lower row, ascending
    int32_t * out = (int32_t *) dst->data;
    for (int32_t i = 0; i < n_static; ++i) out[i] = i;
#if defined(SI_PARTITION_SELECT)
    if (n_dynamic > 0) {
        int64_t ties = 0;
        const uint32_t kth = kth_largest_partition(keys, n_load - n_static, n_dynamic, ties, keys + (n_load - n_static));
        take_indices(keys, n_load - n_static, kth, ties, n_static, out + n_static);
    }
#else
    si_rule::take_top_k([&](int64_t i) { return keys[i]; },
                        n_load - n_static, n_dynamic,
                        [&](int64_t i, int64_t place) { out[n_static + place] = (int32_t) (n_static + i); },
                        keys + (n_load - n_static));
#endif
}

}  // namespace si_cpu
