// CPU kernels of selectinfer's ops (compiled into ggml-cpu).
//   mul_rows    one token, float weights: eight rows at a time with loops converting in
//               registers; Q4_0, Q4_1, Q8_0 and the K-quants on x86 with AVX2: eight rows at a
//               time in integers (x quantized once to int8; Q4_0 and Q4_1 with AVX-512 VNNI four
//               blocks of a row per vector); otherwise ggml's own vec_dot for
//               the weight type, row by row (x converted once to the type's vec_dot_type), like
//               upstream's mul_mat.
//               several tokens: quantized and BF16 rows on AMX bf16 tiles where the CPU has
//               them; else Q4_0 and Q4_1 on x86 with AVX2 through upstream's repacked GEMM.
//   mul_rows_t  one token: adds rows sixteen at a time with per-type loops that convert in
//               registers (block_loops.h; Q8_0, Q4_0 and Q4_1 with AVX-512 VNNI four rows per
//               dpbusd, two blocks per vector), other types row by row;
//               several tokens: a blocked GEMM over F32 panels of the weight (quantized and
//               BF16 rows on AMX bf16 tiles where the CPU has them).
//   ffn_rows    one token, the gathered neurons' whole FFN (gate and up as mul_rows, the GLU,
//               down as mul_rows_t, plus the static block's output) in one op, each thread
//               running the whole FFN of its groups of neurons: one barrier where the five nodes had seven.
//   count       a prompt batch's votes: threads rank tokens in turn (a radix select per token,
//               selection_rule.h; with AVX-512 partitions in vectors), then merge the counts by
//               rows.
//   select      the most counted neurons: threads score a range of candidates each, then one
//               chooses (the same radix select, or partitions).
#include "sparse_ffn_ops.h"
#include "block_loops.h"
#include "selection_rule.h"

#include "ggml-cpu-impl.h"
#include "ggml-cpu.h"
#include "ggml-impl.h"
#include "vec.h"
#include "repack.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <numeric>
#include <vector>

#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace {

// The weight row of an op's j-th neuron: ids[j] - first_id (the id of the weight's row 0; the
// dynamic rows of a layer whose static rows live apart start at n_static), or j without ids.
struct RowIds {
    const int32_t * ids = nullptr;
    int64_t first_id = 0;
    int64_t n = 0;

    explicit RowIds(const ggml_tensor * dst) {
        if (const ggml_tensor * t = dst->src[dst->op == GGML_OP_SI_FFN_ROWS ? 4 : 2]) {
            ids = (const int32_t *) t->data;
            n = t->ne[0];
        }
        first_id = ggml_get_op_params_i32(dst, GGML_SI_MUL_ROWS_FIRST_ID);
    }
    int64_t operator()(int64_t j) const { return ids ? (int64_t) ids[j] - first_id : j; }
};

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

int64_t ceil_div(int64_t x, int64_t by) { return (x + by - 1) / by; }
int64_t round_up(int64_t x, int64_t to) { return ceil_div(x, to) * to; }

// Columns [c0, c1) of t handled by thread ith: whole blocks of t's type.
void column_range(const ggml_tensor * t, int ith, int nth, int64_t & c0, int64_t & c1) {
    const int64_t blck = ggml_blck_size(t->type);
    const int64_t n_blocks = t->ne[0] / blck;
    const int64_t per = ceil_div(n_blocks, nth);
    c0 = std::min(n_blocks, per * ith) * blck;
    c1 = std::min(n_blocks, per * (ith + 1)) * blck;
}

// --- one token: y += sum over a group of rows of v[k] * row k ------------------------------------
using namespace si_blocks;

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

// y[0..E) += sum_k v[k] * rows[k][0..E) for nr <= ADD_GROUP rows; false when this type (or this E,
// or this CPU) has no fused loop and the caller converts row by row instead.
bool add_rows_fused(ggml_type type, const char * const * rows, const float * v, int nr, int64_t E, float * y,
                    const char * const * next, int n_next) {
    if (E % 32 != 0 || !has_block_loop(type)) return false;
    with_block_type<AddRows>(type, rows, v, nr, E, y, next, n_next);
    return true;
}

// The first cache lines of a row read next: a jump to a non-adjacent row otherwise starts with
// demand misses until the hardware prefetcher catches up.
inline void prefetch_row_start(const char * row, size_t row_size) {
    for (size_t off = 0; off < std::min<size_t>(row_size, 1024); off += 64) __builtin_prefetch(row + off);
}

// A whole row into L2 (not L1: it is read after the rows before it).
inline void prefetch_row_to_l2(const char * row, size_t row_size) {
    for (size_t off = 0; off < row_size; off += 64) __builtin_prefetch(row + off, 0, 2);
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

#if defined(SI_INT_DOTS)
// DotRowsInt<T>::run for a type that has_int_dots (block_loops.h: the one list of those types).
template <ggml_type T> struct IntDots {
    template <typename... A> static void run(A... args) {
        if constexpr (has_int_dots<T>) {
            DotRowsInt<T>::run(args...);
        } else {
            GGML_ABORT("no integer dot products for type %s", ggml_type_name(T));
        }
    }
};

// DotRowsInt<T>::arrange_input for a type that has_int_dots.
template <ggml_type T> struct IntDotsInput {
    static void run(const Int8Vector & x, int64_t K) {
        if constexpr (has_int_dots<T>) DotRowsInt<T>::arrange_input(x, K);
    }
};

bool has_int_dots_for(ggml_type type) {
    switch (type) {
#define SI_CASE(T) case GGML_TYPE_##T: return has_int_dots<GGML_TYPE_##T>;
        GGML_SI_FUSED_TYPES(SI_CASE)
#undef SI_CASE
        default: return false;
    }
}

// One token (decode), gate and up of 4- and 8-bit rows: x quantized once (thread 0), then rows
// GROUP at a time in integers, groups dealt out in turn, each thread's next group read ahead.
void mul_rows_int_one_token(const ggml_compute_params * params, ggml_tensor * dst) {
    const ggml_tensor * w = dst->src[0];
    const RowIds row_of(dst);
    const int64_t n = dst->ne[0], K = w->ne[0];
    const int ith = params->ith, nth = params->nth;
    const Int8Vector xq = int8_vector_at(params->wdata, K);
    if (ith == 0) {
        quantize_int8((const float *) dst->src[1]->data, K, xq);
        with_block_type<IntDotsInput>(w->type, xq, K);
    }
    ggml_barrier(params->threadpool);
    auto row = [&](int64_t j) { return (const char *) w->data + row_of(j) * w->nb[1]; };
    for (int64_t j = ith * GROUP; j < n; j += nth * GROUP) {
        const int nr = (int) std::min<int64_t>(GROUP, n - j);
        const char * rows[GROUP], * next[GROUP];
        for (int k = 0; k < nr; ++k) rows[k] = row(j + k);
        int n_next = 0;
        for (int64_t k = j + nth * GROUP; k < std::min(n, j + (nth + 1) * GROUP); ++k) next[n_next++] = row(k);
        with_block_type<IntDots>(w->type, (const char * const *) rows, nr, xq, K, (float *) dst->data + j,
                                 (const char * const *) next, n_next);
    }
}
#endif

// --- several tokens, Q4_0 and Q4_1 on x86 with AVX2: upstream's repacked GEMM over gathered rows
// A prompt computes every loaded neuron. The original model runs its Q4_0 matrices on ggml's
// repacked kernel (eight rows interleaved per block; on Zen 4 2x faster per row over 64 tokens
// than the plain-buffer GEMM, llamafile's), its Q4_0 and Q4_1 ones on AMX where the CPU has it.
// Gathered rows stay plain, for decode reads single rows (a repacked group is read whole for one
// of its rows), so a prompt repacks them REPACK_ROWS at a time into a thread's scratch (55 KiB for
// a 3072-wide row) and runs upstream's kernel on it, x quantized once, as upstream's mul_mat does
// on repacked weights. Q4_1 has no repacked kernel: its rows go through Q4_0's (the quants and
// scales as they are) and each block's offset is added after (below). (Q4_K has a repacked kernel
// too, but there ggml's plain-buffer product was 1.4-2x faster on Zen 4: it stays.)
#if defined(__AVX2__)
#define SI_REPACKED_GEMM 1
constexpr int64_t REPACK_ROWS = 32;  // the kernel's AVX-512 path takes sixteen rows at a time

// A type's repacked layout, its kernels and the activation type they take. `offsets` is set for
// a type whose kernel leaves out a per-block term: w = kernel's value + offset[b] over block b,
// so each row's product gains sum over b of offset[b] * (sum of x over block b).
template <ggml_type T> struct Repacked;

// block_q4_0x8 (repack.h, interleave 8): per block of 32 values the eight rows' d, then their
// quants in 8-byte pieces, piece c of row k at piece 8c + k, each nibble stored signed (q - 8:
// its bit 3 flipped). Src: block_q4_0 or block_q4_1, both d first (q4_1: then m) and qs last.
template <typename Src> void repack_nibbles_x8(const char * const * rows, int64_t n_blocks, block_q4_0x8 * out) {
    for (int64_t b = 0; b < n_blocks; ++b) {
        for (int k = 0; k < 8; ++k) {
            const Src * src = (const Src *) rows[k] + b;
            std::memcpy(&out[b].d[k], src, sizeof(ggml_half));
            for (int c = 0; c < 2; ++c) {
                uint64_t q;
                std::memcpy(&q, src->qs + 8 * c, 8);
                q ^= 0x8888888888888888ull;
                std::memcpy(out[b].qs + 8 * (8 * c + k), &q, 8);
            }
        }
    }
}

template <> struct Repacked<GGML_TYPE_Q4_0> {
    using Block = block_q4_0x8;
    static constexpr ggml_type x_type = GGML_TYPE_Q8_0;
    static constexpr int64_t values = QK4_0;
    static constexpr bool has_offsets = false;
    // eight rows' n_blocks blocks into out; offsets (per block b, row k at b * stride + k) unused
    static void repack(const char * const * rows, int64_t n_blocks, Block * out, float *, int64_t) {
        repack_nibbles_x8<block_q4_0>(rows, n_blocks, out);
    }
    static void quantize_4_tokens(const float * x, void * y, int64_t K) { ggml_quantize_mat_q8_0_4x8(x, y, K); }
    static void gemm(int K, float * s, size_t bs, const void * w, const void * x, int nr, int nc) {
        ggml_gemm_q4_0_8x8_q8_0(K, s, bs, w, x, nr, nc);
    }
    static void gemv(int K, float * s, size_t bs, const void * w, const void * x, int nc) {
        ggml_gemv_q4_0_8x8_q8_0(K, s, bs, w, x, 1, nc);
    }
};

// Q4_1's w = d q + m (q in 0..15) through Q4_0's kernel, which reads d (q - 8): the offset per
// block is 8 d + m.
template <> struct Repacked<GGML_TYPE_Q4_1> : Repacked<GGML_TYPE_Q4_0> {
    static constexpr int64_t values = QK4_1;
    static constexpr bool has_offsets = true;
    static void repack(const char * const * rows, int64_t n_blocks, Block * out, float * offsets, int64_t stride) {
        repack_nibbles_x8<block_q4_1>(rows, n_blocks, out);
        for (int64_t b = 0; b < n_blocks; ++b) {
            for (int k = 0; k < 8; ++k) {
                ggml_half dm[2];
                std::memcpy(dm, (const block_q4_1 *) rows[k] + b, sizeof dm);
                offsets[b * stride + k] = 8.0f * GGML_CPU_FP16_TO_FP32(dm[0]) + GGML_CPU_FP16_TO_FP32(dm[1]);
            }
        }
    }
};

bool has_repacked_gemm(const ggml_tensor * w, const ggml_tensor * x) {
    return ggml_si_has_repacked_gemm(w->type) && x->ne[1] > 1;
}

// A thread's scratch: REPACK_ROWS rows repacked, a partial chunk's output, the chunk's offsets.
template <ggml_type T> size_t repack_scratch_bytes(int64_t K, int64_t n_tokens) {
    const int64_t n_blocks = K / Repacked<T>::values;
    return (size_t) (REPACK_ROWS / 8) * n_blocks * sizeof(typename Repacked<T>::Block) +
           (size_t) (n_tokens * REPACK_ROWS) * sizeof(float) + (size_t) (n_blocks * REPACK_ROWS) * sizeof(float) + 64;
}

// The op's work buffer: x in the kernel's type, x's sums per block, then a scratch per thread.
template <ggml_type T> size_t repacked_work_bytes(int64_t K, int64_t n_tokens, int n_threads) {
    return ggml_row_size(Repacked<T>::x_type, K) * n_tokens + (size_t) (n_tokens * (K / Repacked<T>::values)) * sizeof(float) +
           64 + (size_t) n_threads * repack_scratch_bytes<T>(K, n_tokens);
}

size_t repacked_work_bytes(ggml_type type, int64_t K, int64_t n_tokens, int n_threads) {
    switch (type) {
#define SI_CASE(T) case GGML_TYPE_##T: return repacked_work_bytes<GGML_TYPE_##T>(K, n_tokens, n_threads);
        GGML_SI_REPACKED_GEMM_TYPES(SI_CASE)
#undef SI_CASE
        default: GGML_ABORT("no repacked GEMM for type %s", ggml_type_name(type));
    }
}

typedef float v8f __attribute__((vector_size(32)));
inline void store_as(float * p, v8f v) { std::memcpy(p, &v, sizeof v); }

// The sum of a block of 32 floats, in vectors.
inline float block_sum(const float * x) {
    v8f sum = load_as<v8f>(x) + load_as<v8f>(x + 8) + load_as<v8f>(x + 16) + load_as<v8f>(x + 24);
    float total = 0.0f;
    for (int i = 0; i < 8; ++i) total += sum[i];
    return total;
}

// out[c] += sum over b of x_sums[b] * offsets[b * REPACK_ROWS + c] for the chunk's nc rows (a
// multiple of 8), summed in registers.
inline void add_offsets(const float * x_sums, const float * offsets, int64_t n_blocks, int64_t nc, float * out) {
    for (int64_t c = 0; c < nc; c += 16) {
        v8f a0{}, a1{};
        const bool two = c + 8 < nc;
        for (int64_t b = 0; b < n_blocks; ++b) {
            const v8f sum = v8f{} + x_sums[b];
            a0 += sum * load_as<v8f>(offsets + b * REPACK_ROWS + c);
            if (two) a1 += sum * load_as<v8f>(offsets + b * REPACK_ROWS + c + 8);
        }
        store_as(out + c, load_as<v8f>(out + c) + a0);
        if (two) store_as(out + c + 8, load_as<v8f>(out + c + 8) + a1);
    }
}

template <ggml_type T> struct MulRowsRepacked {
    static void run(const ggml_compute_params * params, ggml_tensor * dst) {
        using R = Repacked<T>;
        const ggml_tensor * w = dst->src[0];
        const ggml_tensor * x = dst->src[1];
        const RowIds row_of(dst);
        const int64_t K = x->ne[0], n_tokens = x->ne[1], n = dst->ne[0], n_blocks = K / R::values;
        const int ith = params->ith, nth = params->nth;
        // x as upstream's repacked mul_mat takes it: four tokens interleaved per block, the last
        // n_tokens % 4 as plain rows of the kernel's activation type
        const size_t x_row = ggml_row_size(R::x_type, K);
        char * xq = (char *) params->wdata;
        float * x_sums = (float *) (xq + n_tokens * x_row);  // [token][block], for the offsets
        const int64_t T4 = n_tokens - n_tokens % 4;
        for (int64_t t = 4 * ith; t < T4; t += 4 * nth) R::quantize_4_tokens((const float *) x->data + t * K, xq + t * x_row, K);
        const auto from_float = ggml_get_type_traits_cpu(R::x_type)->from_float;
        for (int64_t t = T4 + ith; t < n_tokens; t += nth) from_float((const float *) x->data + t * K, xq + t * x_row, K);
        if constexpr (R::has_offsets) {
            for (int64_t t = ith; t < n_tokens; t += nth) {
                const float * xt = (const float *) x->data + t * K;
                for (int64_t b = 0; b < n_blocks; ++b) x_sums[t * n_blocks + b] = block_sum(xt + b * R::values);
            }
        }
        ggml_barrier(params->threadpool);

        char * scratch = (char *) (((uintptr_t) (x_sums + n_tokens * n_blocks) + 63) & ~(uintptr_t) 63) +
                         ith * repack_scratch_bytes<T>(K, n_tokens);
        auto * packed = (typename R::Block *) scratch;
        float * tail_out = (float *) (scratch + (REPACK_ROWS / 8) * n_blocks * sizeof(typename R::Block));
        float * offsets = tail_out + n_tokens * REPACK_ROWS;  // [block][row of the chunk]
        float * out = (float *) dst->data;
        const int64_t out_stride = dst->nb[1] / sizeof(float);
        for (int64_t j0 = ith * REPACK_ROWS; j0 < n; j0 += nth * REPACK_ROWS) {
            const int64_t n_valid = std::min(REPACK_ROWS, n - j0), nc = (n_valid + 7) / 8 * 8;
            for (int64_t g = 0; g < nc / 8; ++g) {
                const char * rows[8];
                for (int k = 0; k < 8; ++k) {  // a missing row of the last group repeats the last one
                    rows[k] = (const char *) w->data + row_of(j0 + std::min(8 * g + k, n_valid - 1)) * w->nb[1];
                }
                R::repack(rows, n_blocks, packed + g * n_blocks, offsets + 8 * g, REPACK_ROWS);
            }
            // a partial last chunk goes through a private output, so no column past n is written
            float * s = nc == n_valid ? out + j0 : tail_out;
            const int64_t s_stride = nc == n_valid ? out_stride : nc;
            if (T4 > 0) R::gemm((int) K, s, s_stride, packed, xq, (int) T4, (int) nc);
            for (int64_t t = T4; t < n_tokens; ++t) R::gemv((int) K, s + t * s_stride, s_stride, packed, xq + t * x_row, (int) nc);
            if constexpr (R::has_offsets) {
                for (int64_t t = 0; t < n_tokens; ++t) add_offsets(x_sums + t * n_blocks, offsets, n_blocks, nc, s + t * s_stride);
            }
            if (s == tail_out) {
                for (int64_t t = 0; t < n_tokens; ++t) std::memcpy(out + t * out_stride + j0, s + t * nc, n_valid * sizeof(float));
            }
        }
    }
};
#endif

// After a barrier: out[c] = prev[c] (if given) + the sum over the nth threads' private rows (thread
// t's at y0 + t * stride floats) for this thread's columns of dst.
void sum_thread_rows(const ggml_compute_params * params, ggml_tensor * dst, const float * y0, size_t stride,
                     const float * prev) {
    int64_t c0, c1;
    column_range(dst, params->ith, params->nth, c0, c1);
    float * out = (float *) dst->data;
    for (int64_t c = c0; c < c1; ++c) {
        float sum = 0.0f;
        for (int t = 0; t < params->nth; ++t) sum += y0[t * stride + c];
        out[c] = prev ? prev[c] + sum : sum;
    }
}

// One token (decode): threads split the neurons; each adds its rows, ADD_GROUP at a time, into a
// private output row, and the private rows are summed at the end.
void mul_rows_t_one_token(const ggml_compute_params * params, ggml_tensor * dst) {
    const ggml_tensor * w = dst->src[0];
    const RowIds row_of(dst);
    const float * h = (const float *) dst->src[1]->data;
    const float * h_offset = dst->src[3] ? (const float *) dst->src[3]->data : nullptr;  // by weight row
    const int64_t n = dst->src[1]->ne[0], E = w->ne[0];
    const int ith = params->ith, nth = params->nth;
    const int64_t stride = E + 64;  // floats per thread buffer, apart by a cache line or more
    float * y = (float *) params->wdata + (int64_t) ith * 2 * stride;
    float * chunk = y + stride;
    std::memset(y, 0, E * sizeof(float));
    const size_t row_size = ggml_row_size(w->type, E);
    // groups dealt out in turn: the static rows come first and are contiguous, the dynamic ones
    // scattered (slower to read), so contiguous halves would leave one thread waiting
    for (int64_t j = ith * ADD_GROUP; j < n; j += nth * ADD_GROUP) {
        const int nr = (int) std::min<int64_t>(ADD_GROUP, n - j);
        const char * rows[ADD_GROUP], * next[ADD_GROUP];
        for (int k = 0; k < nr; ++k) rows[k] = (const char *) w->data + row_of(j + k) * w->nb[1];
        int n_next = 0;  // this thread's next group, read ahead while this one is added
        for (int64_t k = j + nth * ADD_GROUP; k < std::min(n, j + (nth + 1) * ADD_GROUP); ++k) {
            next[n_next++] = (const char *) w->data + row_of(k) * w->nb[1];
        }
        float v[ADD_GROUP];
        for (int k = 0; k < nr; ++k) v[k] = h_offset ? h[j + k] - h_offset[row_of(j + k)] : h[j + k];
        if (add_rows_fused(w->type, rows, v, nr, E, y, next, n_next)) continue;
        for (int k = 0; k < n_next; ++k) prefetch_row_start(next[k], row_size);
        for (int k = 0; k < nr; ++k) {
            if (v[k] == 0.0f) continue;
            rows_to_float(w, row_of, j + k, 1, 0, E, chunk, E);
            ggml_vec_mad_f32((int) E, y, chunk, v[k]);
        }
    }
    ggml_barrier(params->threadpool);
    sum_thread_rows(params, dst, (const float *) params->wdata, 2 * stride, nullptr);
}

// --- one token, the gathered neurons' whole FFN in one op ----------------------------------------
// As ops of their own, the gathered gate, up, activation, down projection and the sum with the
// static block are five graph nodes a layer, each ending at a barrier where both threads wait for
// the slower (ggml_barrier took 16% of a decode step's samples on the default model, 2 threads).
// Here each thread takes groups of ADD_GROUP neurons in turn, as mul_rows_t_one_token deals them,
// and runs the whole FFN of a group: its gate and up rows dotted with x as ggml_si_mul_rows does,
// the activation as upstream's GLU op does, its down rows added into the thread's output row as
// mul_rows_t_one_token does; so the values are those of the five ops. x is quantized (or
// converted) by each thread for itself rather than once behind a barrier: one barrier in all,
// before the threads' rows are summed. A step that chose its neurons by their gate (gate-guided)
// passes the gate's values, so that only the up and down rows are read, and the compensation's
// nu is taken off each activation as mul_rows_t_one_token does.

// How a one-token product of rows with x runs for a weight type: float weights in the fused
// loop (several rows in flight); quantized ones in integers eight rows at a time where the CPU
// has those loops, else ggml's vec_dot with a quantized x (faster than converting the weights).
enum class DotPath { float_rows, int_rows, vec_dot };

DotPath one_token_dot_path(ggml_type type, int64_t K) {
    const bool float_weights = type == GGML_TYPE_F32 || type == GGML_TYPE_F16 || type == GGML_TYPE_BF16;
    if (K % 32 == 0 && float_weights && has_block_loop(type)) return DotPath::float_rows;
#if defined(SI_INT_DOTS)
    if (K % 32 == 0 && has_int_dots_for(type)) return DotPath::int_rows;
#endif
    return DotPath::vec_dot;
}

// A thread's part of ggml_si_ffn_rows's work buffer: x in the form its dot path takes, then the
// private output row (E floats) and a converted down row (E floats), a cache line or more apart.
struct FfnRowsScratch {
    static size_t x_bytes(ggml_type type, int64_t K) {
        size_t bytes = ggml_row_size(ggml_get_type_traits_cpu(type)->vec_dot_type, K);
#if defined(SI_INT_DOTS)
        bytes = std::max(bytes, int8_vector_bytes(K));
#endif
        return (size_t) round_up((int64_t) bytes + 64, 64);
    }
    static size_t per_thread_bytes(ggml_type type, int64_t K, int64_t E) {
        return x_bytes(type, K) + 2 * (size_t) round_up(E + 16, 16) * sizeof(float);
    }
    FfnRowsScratch(void * wdata, int ith, ggml_type type, int64_t K, int64_t E) {
        char * base = (char *) wdata + (size_t) ith * per_thread_bytes(type, K, E);
        x = base;
        y = (float *) (base + x_bytes(type, K));
        chunk = y + round_up(E + 16, 16);
    }
    char * x;
    float * y;
    float * chunk;
};

void ffn_rows_one_token(const ggml_compute_params * params, ggml_tensor * dst) {
    const ggml_tensor * gate = dst->src[0], * up = dst->src[1], * down = dst->src[2], * prev = dst->src[5];
    const float * x = (const float *) dst->src[3]->data;
    // by weight row: the gate's values where a step has them already, the compensation's nu
    const float * gate_values = dst->src[6] ? (const float *) dst->src[6]->data : nullptr;
    const float * h_offset = dst->src[7] ? (const float *) dst->src[7]->data : nullptr;
    const RowIds row_of(dst);
    const ggml_glu_op glu = (ggml_glu_op) ggml_get_op_params_i32(dst, GGML_SI_FFN_ROWS_GLU);
    const int64_t n = row_of.n, K = up->ne[0], E = down->ne[0];
    const int ith = params->ith, nth = params->nth;
    const FfnRowsScratch scratch(params->wdata, ith, up->type, K, E);
    std::memset(scratch.y, 0, E * sizeof(float));

    const DotPath path = one_token_dot_path(up->type, K);  // gate's type too (when given)
    const auto * traits = ggml_get_type_traits_cpu(up->type);
#if defined(SI_INT_DOTS)
    const Int8Vector xq = int8_vector_at(scratch.x, K);
#endif
    if (path == DotPath::int_rows) {
#if defined(SI_INT_DOTS)
        quantize_int8(x, K, xq);
        with_block_type<IntDotsInput>(up->type, xq, K);
#endif
    } else if (path == DotPath::vec_dot && traits->vec_dot_type != GGML_TYPE_F32) {
        ggml_get_type_traits_cpu(traits->vec_dot_type)->from_float(x, scratch.x, K);
    }
    const char * x_vdt = traits->vec_dot_type == GGML_TYPE_F32 ? (const char *) x : scratch.x;
    // gate or up values of rows[0..nr): GROUP rows per call of the fused loops
    auto dot_rows = [&](const ggml_tensor * w, const char * const * rows, int nr, [[maybe_unused]] const char * const * next,
                        [[maybe_unused]] int n_next, float * out) {
        for (int k0 = 0; k0 < nr; k0 += GROUP) {
            const int m = std::min(GROUP, nr - k0);
            if (path == DotPath::float_rows) {
                with_block_type<DotRows>(w->type, rows + k0, m, x, K, out + k0);
#if defined(SI_INT_DOTS)
            } else if (path == DotPath::int_rows) {
                const int m_next = std::max(0, std::min(GROUP, n_next - k0));
                with_block_type<IntDots>(w->type, rows + k0, m, xq, K, out + k0, next + k0, m_next);
#endif
            } else {
                for (int k = k0; k < k0 + m; ++k) traits->vec_dot((int) K, out + k, 0, rows[k], 0, x_vdt, 0, 1);
            }
        }
    };
    const size_t down_row_bytes = ggml_row_size(down->type, E);
    // the gate, up and down rows of neurons j0 .. j0 + count - 1
    auto rows_of = [&](int64_t j0, int count, const char ** g, const char ** u, const char ** d) {
        for (int k = 0; k < count; ++k) {
            const int64_t r = row_of(j0 + k);
            g[k] = gate ? (const char *) gate->data + r * gate->nb[1] : nullptr;
            u[k] = (const char *) up->data + r * up->nb[1];
            d[k] = (const char *) down->data + r * down->nb[1];
        }
    };
    for (int64_t j = ith * ADD_GROUP; j < n; j += nth * ADD_GROUP) {
        const int nr = (int) std::min<int64_t>(ADD_GROUP, n - j);
        const int64_t j_next = j + nth * ADD_GROUP;
        const int n_next = (int) std::clamp<int64_t>(n - j_next, 0, ADD_GROUP);
        const char * g_rows[ADD_GROUP], * u_rows[ADD_GROUP], * d_rows[ADD_GROUP];
        const char * g_next[ADD_GROUP], * u_next[ADD_GROUP], * d_next[ADD_GROUP];
        rows_of(j, nr, g_rows, u_rows, d_rows);
        rows_of(j_next, n_next, g_next, u_next, d_next);
        float g[ADD_GROUP], u[ADD_GROUP], h[ADD_GROUP];
        if (gate_values) {
            for (int k = 0; k < nr; ++k) g[k] = gate_values[row_of(j + k)];
        } else {
            dot_rows(gate, g_rows, nr, g_next, n_next, g);
        }
        dot_rows(up, u_rows, nr, u_next, n_next, u);
        if (glu == GGML_GLU_OP_GEGLU) {
            ggml_vec_geglu_f32(nr, h, g, u);
        } else {
            ggml_vec_swiglu_f32(nr, h, g, u);
        }
        if (h_offset) {
            for (int k = 0; k < nr; ++k) h[k] -= h_offset[row_of(j + k)];
        }
        if (add_rows_fused(down->type, d_rows, h, nr, E, scratch.y, d_next, n_next)) continue;
        for (int k = 0; k < n_next; ++k) prefetch_row_start(d_next[k], down_row_bytes);
        for (int k = 0; k < nr; ++k) {
            if (h[k] == 0.0f) continue;
            rows_to_float(down, row_of, j + k, 1, 0, E, scratch.chunk, E);
            ggml_vec_mad_f32((int) E, scratch.y, scratch.chunk, h[k]);
        }
    }
    ggml_barrier(params->threadpool);
    sum_thread_rows(params, dst, FfnRowsScratch(params->wdata, 0, up->type, K, E).y,
                    FfnRowsScratch::per_thread_bytes(up->type, K, E) / sizeof(float),
                    prev ? (const float *) prev->data : nullptr);
}

// Several tokens (prefill): out[:, t] = sum_j h[j, t] w[row j] is a matrix product whose weight
// is stored along the output; computed as a blocked outer-product GEMM. A panel of weight
// columns is converted to F32 once per chunk of rows and reused by every token, and a register
// tile of TILE_T tokens x TILE_E columns accumulates over the rows.
#if defined(__AVX512F__)
constexpr int VEC = 16, TILE_T = 8;
// The lanes of a 16-lane vector that hold values when `left` of them remain (none at 0 or below).
inline __mmask16 tail_mask(int64_t left) {
    return left >= 16 ? (__mmask16) 0xffff : left <= 0 ? (__mmask16) 0 : (__mmask16) ((1u << left) - 1);
}
#elif defined(__AVX__)
constexpr int VEC = 8, TILE_T = 6;
#else
constexpr int VEC = 4, TILE_T = 8;
#endif
constexpr int TILE_E = 2 * VEC;
typedef float vfloat __attribute__((vector_size(VEC * sizeof(float))));
constexpr int64_t PANEL_ROWS = 128, TOKEN_CHUNK = 64;

// Tokens per work item (a panel of columns x a chunk of tokens) of a prompt's down projection (F32,
// int8 or bf16 panels): as many as leave every thread two items or more, 64 to 256, a multiple of
// 32 (the bf16 tiles' tokens). A panel is converted once per item, a third of the int8 op at 64
// tokens. A 512-token prompt of a 3B layer's Q4_K down projection, per row against the dense
// layer's (plain buffer): int8 (AVX-512 VNNI) 1.2x with 64-token items, 0.8x with 256; bf16
// tiles (AMX) 0.9x, 0.5x; F32 (AVX2) 1.8x, 1.6x.
constexpr int64_t MAX_TOKEN_CHUNK = 4 * TOKEN_CHUNK;
int64_t prompt_token_chunk(int64_t T, int64_t n_panels, int nth) {
    const int64_t chunks = ceil_div(2 * nth, n_panels);
    return std::clamp<int64_t>(round_up(ceil_div(T, chunks), 32), TOKEN_CHUNK, MAX_TOKEN_CHUNK);
}

// The work items of a prompt's down projection over E columns and T tokens: panels of pw columns
// x token chunks, dealt out to the nth threads in turn.
struct PromptItems {
    int64_t E, pw, T, n_panels, chunk, count;
    PromptItems(int64_t E, int64_t pw, int64_t T, int nth)
        : E(E), pw(pw), T(T), n_panels(ceil_div(E, pw)), chunk(prompt_token_chunk(T, n_panels, nth)),
          count(n_panels * ceil_div(T, chunk)) {}
    // item i: columns [e0, e0 + width) of tokens [t0, t1); thread ith takes items ith, ith + nth, ...
    struct Item { int64_t e0, width, t0, t1; };
    Item operator[](int64_t i) const {
        const int64_t e0 = (i % n_panels) * pw, t0 = (i / n_panels) * chunk;
        return {e0, std::min(pw, E - e0), t0, std::min(T, t0 + chunk)};
    }
};

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
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
#define SI_INT8_PROMPT 1
#include <immintrin.h>

// Below this many tokens requantizing a panel costs more than its products save.
constexpr int64_t INT8_MIN_TOKENS = 8;
constexpr int64_t INT8_SLICE = 32;  // columns per kernel call: two vectors of 16

// The op's work buffer: the activations as int8 [T][n_pad] (zero-padded), their scale and byte
// sum per token and panel, then per thread an F32 panel, its int8 form and its column scales.
struct Int8Layout {
    int64_t n_pad, n_groups, panel_width;
    size_t hq_bytes, scales_bytes, panel_bytes, panel_q_bytes, col_scale_bytes;
    Int8Layout(const ggml_tensor * w, const ggml_tensor * hs) {
        const int64_t T = hs->ne[1];
        n_pad = round_up(hs->ne[0], 64);
        n_groups = ceil_div(hs->ne[0], PANEL_ROWS);
        panel_width = std::max<int64_t>(64, ggml_blck_size(w->type));
        hq_bytes = (size_t) T * n_pad;
        scales_bytes = (size_t) T * n_groups * (sizeof(float) + sizeof(int32_t));
        panel_bytes = PANEL_ROWS * panel_width * sizeof(float);
        panel_q_bytes = PANEL_ROWS * panel_width;
        col_scale_bytes = panel_width * sizeof(float);
    }
    size_t per_thread() const { return panel_bytes + panel_q_bytes + col_scale_bytes + 64; }
    size_t total(int n_threads) const { return 128 + hq_bytes + scales_bytes + n_threads * per_thread(); }
};

bool use_int8_prompt(const ggml_tensor * w, const ggml_tensor * hs) {
    return hs->ne[1] >= INT8_MIN_TOKENS && ggml_is_quantized(w->type) && w->ne[0] % INT8_SLICE == 0;
}

// Token t's n activations: per group of PANEL_ROWS, int8 values round(h * 127 / max|h|), the
// scale max|h| / 127 and the sum of the int8 values; zeros up to n_pad.
void quantize_activations(const float * h, int64_t n, const Int8Layout & lay, int8_t * hq, float * scale,
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
void panel_to_int8(const float * panel, int64_t rows, int64_t width, int64_t stride, uint8_t * panel_q,
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
#endif

// --- several tokens on a CPU with AMX: the same product on bf16 tiles --------------------------
// The original's down projection runs on AMX; ours over F32 panels took 2.6-3x as long as this
// on a 3B layer (Q4_1, Q4_K, 64 tokens).
// Here the activations are rounded to bf16 once per op, each F32 panel to bf16 in the tiles' pair
// layout, and the tile unit multiplies them with F32 accumulation (bf16 keeps 8 bits of
// mantissa: about 0.3% per product, less than the 8-bit activations of upstream's quantized
// matmuls). Tile registers are per thread and ggml's AMX kernels configure them once per thread,
// so this kernel saves the configuration it finds and restores it.
// The tile products are AMX-BF16 instructions, compiled for the two kernels that use them even
// where ggml-cpu is not (ggml's sapphirerapids variant of the one-binary build names AMX_TILE and
// AMX_INT8 only) and run where the CPU has them.
#if defined(__AMX_TILE__) && defined(__AVX512BF16__) && defined(__linux__)
#define SI_AMX_BF16 1
#define SI_AMX_BF16_TARGET __attribute__((target("amx-bf16")))
#include <immintrin.h>

// The CPU has AMX-BF16, and Linux gives the process the tile registers' state (it does only on
// request, arch_prctl); asked once per process.
bool amx_tiles_permitted() {
    static const bool permitted = __builtin_cpu_supports("amx-bf16") &&
                                  syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
    return permitted;
}

struct alignas(64) TileConfig {
    uint8_t palette = 0, start_row = 0, reserved[14] = {};
    uint16_t colsb[16] = {};
    uint8_t rows[16] = {};
};
static_assert(sizeof(TileConfig) == 64);

// The tile configuration of the calling thread while it lives: eight tiles of 16 rows of 64
// bytes (C: 16 tokens x 16 floats; A: 16 tokens x 32 bf16; B: 16 row pairs x 16 columns x 2).
// The asm operands name the whole struct, so the compiler keeps its stores (see ggml-patches).
class TileScope {
    TileConfig saved_;
  public:
    TileScope() {
        __asm__ volatile("sttilecfg %0" : "=m"(saved_));
        TileConfig mine;
        mine.palette = 1;
        for (int i = 0; i < 8; ++i) {
            mine.rows[i] = 16;
            mine.colsb[i] = 64;
        }
        __asm__ volatile("ldtilecfg %0" : : "m"(mine));
    }
    ~TileScope() {
        if (saved_.palette == 0) {
            _tile_release();
        } else {
            __asm__ volatile("ldtilecfg %0" : : "m"(saved_));
        }
    }
};

constexpr int64_t TILE = 16, PAIR_ROWS = 32;  // tokens or columns per tile; rows per k step

// The op's work buffer: the activations in bf16, [round_up(T, 32)][round_up(n, 32)] with zero
// padding, then per thread an F32 panel, its bf16 tiles and an accumulator of a token chunk.
struct Bf16Layout {
    int64_t t_pad, n_pad, panel_width;
    size_t h_bytes, panel_bytes, tiles_bytes, acc_bytes;
    Bf16Layout(const ggml_tensor * w, const ggml_tensor * hs) {
        t_pad = round_up(hs->ne[1], 2 * TILE);
        n_pad = round_up(hs->ne[0], PAIR_ROWS);
        panel_width = round_up(std::max<int64_t>(64, ggml_blck_size(w->type)), 2 * TILE);
        h_bytes = round_up(t_pad * n_pad * 2, 64);
        panel_bytes = PANEL_ROWS * panel_width * sizeof(float);
        tiles_bytes = PANEL_ROWS * panel_width * 2;
        acc_bytes = MAX_TOKEN_CHUNK * panel_width * sizeof(float);
    }
    size_t per_thread() const { return panel_bytes + tiles_bytes + acc_bytes; }
    size_t total(int n_threads) const { return 64 + h_bytes + n_threads * per_thread(); }
};

// Several tokens over the weight types of ggml_si_has_bf16_tiles (F32 and F16 keep the F32 GEMM).
bool use_amx_bf16(const ggml_tensor * w, const ggml_tensor * hs) {
    return hs->ne[1] > 1 && ggml_si_has_bf16_tiles(w->type) && amx_tiles_permitted();
}

// rows (< PANEL_ROWS: the rest zero) x panel_width F32 -> per k step of 32 rows and per 16
// columns one B tile: row r holds, column by column, the bf16 pair (row 2r, row 2r + 1).
void panel_to_tiles(const float * panel, int64_t rows, int64_t panel_width, ggml_bf16_t * tiles) {
    const __m512i interleave = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8,
                                                23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    const int64_t n_col_tiles = panel_width / TILE;
    for (int64_t k = 0; k < PANEL_ROWS / PAIR_ROWS; ++k) {
        for (int64_t ct = 0; ct < n_col_tiles; ++ct) {
            ggml_bf16_t * tile = tiles + (k * n_col_tiles + ct) * TILE * PAIR_ROWS;
            for (int64_t r = 0; r < TILE; ++r) {
                const int64_t j = k * PAIR_ROWS + 2 * r;
                const __m512 even = j < rows ? _mm512_loadu_ps(panel + j * panel_width + ct * TILE) : _mm512_setzero_ps();
                const __m512 odd = j + 1 < rows ? _mm512_loadu_ps(panel + (j + 1) * panel_width + ct * TILE) : _mm512_setzero_ps();
                // words 0..15 the even row, 16..31 the odd one, then paired column by column
                const __m512i both = (__m512i) _mm512_cvtne2ps_pbh(odd, even);
                _mm512_storeu_si512(tile + r * 2 * TILE, _mm512_permutexvar_epi16(interleave, both));
            }
        }
    }
}

SI_AMX_BF16_TARGET void mul_rows_t_tokens_amx(const ggml_compute_params * params, ggml_tensor * dst) {
    const ggml_tensor * w = dst->src[0];
    const ggml_tensor * hs = dst->src[1];
    const RowIds row_of(dst);
    const int64_t n = hs->ne[0], T = hs->ne[1], E = w->ne[0];
    const Bf16Layout lay(w, hs);
    const int ith = params->ith, nth = params->nth;
    char * base = (char *) (((uintptr_t) params->wdata + 63) & ~(uintptr_t) 63);
    auto * h16 = (ggml_bf16_t *) base;
    for (int64_t t = ith; t < lay.t_pad; t += nth) {  // tokens in turn, padded with zeros
        ggml_bf16_t * row = h16 + t * lay.n_pad;
        if (t < T) ggml_cpu_fp32_to_bf16((const float *) ((const char *) hs->data + t * hs->nb[1]), row, n);
        std::memset(row + (t < T ? n : 0), 0, (lay.n_pad - (t < T ? n : 0)) * sizeof(ggml_bf16_t));
    }
    ggml_barrier(params->threadpool);

    char * mine = base + lay.h_bytes + ith * lay.per_thread();
    float * panel = (float *) mine;
    auto * tiles = (ggml_bf16_t *) (mine + lay.panel_bytes);
    float * acc = (float *) (mine + lay.panel_bytes + lay.tiles_bytes);  // [chunk][panel_width]
    const int64_t pw = lay.panel_width, n_col_tiles = pw / TILE;
    const size_t h_stride = lay.n_pad * 2, acc_stride = pw * sizeof(float), b_stride = 2 * TILE * 2;
    const PromptItems items(E, pw, T, nth);
    if (items.count <= ith) return;
    TileScope scope;
    for (int64_t i = ith; i < items.count; i += nth) {
        const auto [e0, width, t0, t1] = items[i];
        const int64_t n_token_tiles = round_up(t1 - t0, 2 * TILE) / TILE;
        std::memset(acc, 0, n_token_tiles * TILE * pw * sizeof(float));
        for (int64_t j0 = 0; j0 < n; j0 += PANEL_ROWS) {
            const int64_t rows = std::min(PANEL_ROWS, n - j0);
            if (width < pw) {  // columns past E: zeros, not stale values
                for (int64_t j = 0; j < rows; ++j) std::memset(panel + j * pw + width, 0, (pw - width) * sizeof(float));
            }
            rows_to_float(w, row_of, j0, rows, e0, width, panel, pw);
            panel_to_tiles(panel, rows, pw, tiles);
            const int64_t n_k = ceil_div(rows, PAIR_ROWS);
            for (int64_t tt = 0; tt < n_token_tiles; tt += 2) {
                for (int64_t ct = 0; ct < n_col_tiles; ct += 2) {
                    float * c = acc + tt * TILE * pw + ct * TILE;
                    _tile_loadd(0, c, acc_stride);
                    _tile_loadd(1, c + TILE, acc_stride);
                    _tile_loadd(2, c + TILE * pw, acc_stride);
                    _tile_loadd(3, c + TILE * pw + TILE, acc_stride);
                    for (int64_t k = 0; k < n_k; ++k) {
                        const ggml_bf16_t * a = h16 + (t0 + tt * TILE) * lay.n_pad + j0 + k * PAIR_ROWS;
                        const ggml_bf16_t * b = tiles + (k * n_col_tiles + ct) * TILE * PAIR_ROWS;
                        _tile_loadd(4, a, h_stride);
                        _tile_loadd(5, a + TILE * lay.n_pad, h_stride);
                        _tile_loadd(6, b, b_stride);
                        _tile_loadd(7, b + TILE * PAIR_ROWS, b_stride);
                        _tile_dpbf16ps(0, 4, 6);
                        _tile_dpbf16ps(1, 4, 7);
                        _tile_dpbf16ps(2, 5, 6);
                        _tile_dpbf16ps(3, 5, 7);
                    }
                    _tile_stored(0, c, acc_stride);
                    _tile_stored(1, c + TILE, acc_stride);
                    _tile_stored(2, c + TILE * pw, acc_stride);
                    _tile_stored(3, c + TILE * pw + TILE, acc_stride);
                }
            }
        }
        for (int64_t t = t0; t < t1; ++t) {
            std::memcpy((float *) ((char *) dst->data + t * dst->nb[1]) + e0, acc + (t - t0) * pw, width * sizeof(float));
        }
    }
}

// --- several tokens on a CPU with AMX: gate and up (ggml_si_mul_rows) on bf16 tiles ----------
// The original's prompt runs its gate and up on ggml's AMX kernels; the gathered rows went
// through ggml's plain-buffer mul_mat (Q8_0, the K-quants) or our repacked Q4_0 GEMM. Here a
// thread dequantizes 32 rows at a time to bf16 (the A tiles, 16 rows x 32 values, read as they
// are), the activations are rounded to bf16 once per op and laid out as B tiles (16 pairs of
// values x 16 tokens), and the tile unit accumulates each 16 rows x 16 tokens in F32 over the
// whole row. The result tile is [row][token]; it is transposed in registers on its way out.
constexpr int64_t ROWS_PER_CHUNK = 2 * TILE;  // the A tiles of one step

// n floats (a multiple of 32) to bf16, rounding to nearest even as ggml's conversion does
void floats_to_bf16(const float * x, ggml_bf16_t * y, int64_t n) {
    for (int64_t i = 0; i < n; i += 32) {
        const __m512bh both = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + i + 16), _mm512_loadu_ps(x + i));
        _mm512_storeu_si512(y + i, (__m512i) both);
    }
}

// The op's work buffer: the activations as B tiles, [token tile][k step] of 16 pairs x 16 tokens
// (the tokens padded with zeros to pairs of tiles), then per thread 32 rows in bf16, one row in
// F32 and the four result tiles.
struct Bf16RowsLayout {
    int64_t K, t_pad, n_k;
    size_t x_bytes, rows_bytes, row_f32_bytes, c_bytes;
    Bf16RowsLayout(const ggml_tensor * x) {
        K = x->ne[0];
        t_pad = round_up(x->ne[1], 2 * TILE);
        n_k = K / PAIR_ROWS;
        x_bytes = (size_t) t_pad * K * 2;
        rows_bytes = (size_t) ROWS_PER_CHUNK * K * 2;
        row_f32_bytes = round_up(K * sizeof(float), 64);
        c_bytes = 4 * TILE * TILE * sizeof(float);
    }
    size_t per_thread() const { return rows_bytes + row_f32_bytes + c_bytes; }
    size_t total(int n_threads) const { return 64 + x_bytes + n_threads * per_thread(); }
    const ggml_bf16_t * x_tile(const ggml_bf16_t * xb, int64_t token_tile, int64_t k) const {
        return xb + (token_tile * n_k + k) * TILE * PAIR_ROWS;
    }
};

bool use_amx_bf16_rows(const ggml_tensor * w, const ggml_tensor * x) {
    return x->ne[1] > 1 && x->ne[0] % PAIR_ROWS == 0 && ggml_si_has_bf16_tiles(w->type) && amx_tiles_permitted();
}

// Token t's activations into the B tiles: the 16 pairs of each k step go to column t % 16 of
// its tile's 16 rows. Tokens past T (the padding) are zeros.
void token_to_tiles(const float * x_t, int64_t t, const Bf16RowsLayout & lay, ggml_bf16_t * xb) {
    const __m512i rows = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                            _mm512_set1_epi32(TILE));  // in 4-byte pairs
    for (int64_t k = 0; k < lay.n_k; ++k) {
        const __m512i pairs = x_t ? (__m512i) _mm512_cvtne2ps_pbh(_mm512_loadu_ps(x_t + k * PAIR_ROWS + 16),
                                                                  _mm512_loadu_ps(x_t + k * PAIR_ROWS))
                                  : _mm512_setzero_si512();
        auto * tile = (int32_t *) lay.x_tile(xb, t / TILE, k) + t % TILE;
        _mm512_i32scatter_epi32(tile, rows, pairs, 4);
    }
}

// in: 16 rows of 16 floats; out: its transpose (in registers: two rounds of unpacks within
// 128-bit lanes, two of lane shuffles)
void transpose_16x16(const float * in, float * out) {
    __m512 r[16], t[16];
    for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_ps(in + i * 16);
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {  // r[i + m], lane L: column 4L + m of rows i..i+3
        r[i] = (__m512) _mm512_unpacklo_pd((__m512d) t[i], (__m512d) t[i + 2]);
        r[i + 1] = (__m512) _mm512_unpackhi_pd((__m512d) t[i], (__m512d) t[i + 2]);
        r[i + 2] = (__m512) _mm512_unpacklo_pd((__m512d) t[i + 1], (__m512d) t[i + 3]);
        r[i + 3] = (__m512) _mm512_unpackhi_pd((__m512d) t[i + 1], (__m512d) t[i + 3]);
    }
    for (int m = 0; m < 4; ++m) {
        t[m] = _mm512_shuffle_f32x4(r[m], r[4 + m], 0x88);
        t[4 + m] = _mm512_shuffle_f32x4(r[m], r[4 + m], 0xdd);
        t[8 + m] = _mm512_shuffle_f32x4(r[8 + m], r[12 + m], 0x88);
        t[12 + m] = _mm512_shuffle_f32x4(r[8 + m], r[12 + m], 0xdd);
    }
    for (int m = 0; m < 4; ++m) {
        _mm512_storeu_ps(out + m * 16, _mm512_shuffle_f32x4(t[m], t[8 + m], 0x88));
        _mm512_storeu_ps(out + (4 + m) * 16, _mm512_shuffle_f32x4(t[4 + m], t[12 + m], 0x88));
        _mm512_storeu_ps(out + (8 + m) * 16, _mm512_shuffle_f32x4(t[m], t[8 + m], 0xdd));
        _mm512_storeu_ps(out + (12 + m) * 16, _mm512_shuffle_f32x4(t[4 + m], t[12 + m], 0xdd));
    }
}

SI_AMX_BF16_TARGET void mul_rows_tokens_amx(const ggml_compute_params * params, ggml_tensor * dst) {
    const ggml_tensor * w = dst->src[0];
    const ggml_tensor * x = dst->src[1];
    const RowIds row_of(dst);
    const int64_t T = x->ne[1], n = dst->ne[0];
    const Bf16RowsLayout lay(x);
    const int64_t K = lay.K;
    const int ith = params->ith, nth = params->nth;
    char * base = (char *) (((uintptr_t) params->wdata + 63) & ~(uintptr_t) 63);
    auto * xb = (ggml_bf16_t *) base;
    for (int64_t t0 = ith * TILE; t0 < lay.t_pad; t0 += nth * TILE) {  // a tile's tokens: its cache lines
        for (int64_t t = t0; t < t0 + TILE; ++t) {
            token_to_tiles(t < T ? (const float *) ((const char *) x->data + t * x->nb[1]) : nullptr, t, lay, xb);
        }
    }
    ggml_barrier(params->threadpool);

    char * mine = base + lay.x_bytes + ith * lay.per_thread();
    auto * rows = (ggml_bf16_t *) mine;
    auto * row_f32 = (float *) (mine + lay.rows_bytes);
    auto * c = (float *) (mine + lay.rows_bytes + lay.row_f32_bytes);  // the four result tiles
    float transposed[TILE * TILE];                                       // one of them, [token][row]
    const size_t a_stride = K * 2, b_stride = 2 * TILE * 2, c_stride = TILE * sizeof(float);
    if (ith * ROWS_PER_CHUNK >= n) return;
    TileScope scope;
    for (int64_t j0 = ith * ROWS_PER_CHUNK; j0 < n; j0 += nth * ROWS_PER_CHUNK) {
        const int64_t n_rows = std::min(ROWS_PER_CHUNK, n - j0);
        for (int64_t r = 0; r < n_rows; ++r) {
            if (w->type == GGML_TYPE_BF16) {
                std::memcpy(rows + r * K, (const char *) w->data + row_of(j0 + r) * w->nb[1], K * 2);
            } else {
                rows_to_float(w, row_of, j0 + r, 1, 0, K, row_f32, K);
                floats_to_bf16(row_f32, rows + r * K, K);
            }
        }
        if (n_rows < ROWS_PER_CHUNK) std::memset(rows + n_rows * K, 0, (ROWS_PER_CHUNK - n_rows) * K * 2);
        for (int64_t tt = 0; tt < lay.t_pad / TILE; tt += 2) {
            _tile_zero(0);
            _tile_zero(1);
            _tile_zero(2);
            _tile_zero(3);
            for (int64_t k = 0; k < lay.n_k; ++k) {
                _tile_loadd(4, rows + k * PAIR_ROWS, a_stride);
                _tile_loadd(5, rows + TILE * K + k * PAIR_ROWS, a_stride);
                _tile_loadd(6, lay.x_tile(xb, tt, k), b_stride);
                _tile_loadd(7, lay.x_tile(xb, tt + 1, k), b_stride);
                _tile_dpbf16ps(0, 4, 6);  // rows 0..15 x the first 16 tokens
                _tile_dpbf16ps(1, 4, 7);  // rows 0..15 x the next 16
                _tile_dpbf16ps(2, 5, 6);  // rows 16..31 x the first 16
                _tile_dpbf16ps(3, 5, 7);
            }
            _tile_stored(0, c, c_stride);
            _tile_stored(1, c + TILE * TILE, c_stride);
            _tile_stored(2, c + 2 * TILE * TILE, c_stride);
            _tile_stored(3, c + 3 * TILE * TILE, c_stride);
            for (int i = 0; i < 4; ++i) {  // tile i: rows 16 (i / 2) on, tokens 16 (tt + i % 2) on
                const int64_t r0 = TILE * (i / 2), t0 = TILE * (tt + i % 2);
                if (r0 >= n_rows || t0 >= T) continue;
                transpose_16x16(c + i * TILE * TILE, transposed);
                const int64_t nr = std::min(TILE, n_rows - r0);
                for (int64_t t = t0; t < std::min(T, t0 + TILE); ++t) {
                    std::memcpy((float *) ((char *) dst->data + t * dst->nb[1]) + j0 + r0, transposed + (t - t0) * TILE,
                                nr * sizeof(float));
                }
            }
        }
    }
}
#endif

#if defined(__AVX512F__)
#define SI_PARTITION_SELECT 1
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
void sort_descending_few(const uint32_t * keys, int64_t m, uint32_t * out) {
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
void count_above(const uint32_t * keys, int64_t m, uint32_t hi, uint32_t lo, int64_t & above_hi, int64_t & from_lo) {
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
int64_t keep_between(const uint32_t * keys, int64_t m, uint32_t lo, uint32_t hi, uint32_t * out) {
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
uint32_t kth_largest_partition(const uint32_t * keys, int64_t n, int64_t k, int64_t & ties, uint32_t * cand) {
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
void token_keys(const float * a, int64_t n, bool by_magnitude, uint32_t * keys) {
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
void take_indices(const uint32_t * keys, int64_t n, uint32_t kth, int64_t ties, int32_t first_index, int32_t * out) {
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
void add_votes(const uint32_t * keys, int64_t n, uint32_t kth, int64_t ties, int32_t * count) {
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

CountScratch count_scratch(void * base, int64_t n_load) {
    uint32_t * k = (uint32_t *) base;
    return {k, k + n_load, (int32_t *) (k + 2 * n_load)};
}

}  // namespace

extern "C" {

size_t ggml_si_work_size(const struct ggml_tensor * node, int n_tasks) {
    switch (node->op) {
        case GGML_OP_SI_MUL_ROWS: {
            const ggml_type vdt = ggml_get_type_traits_cpu(node->src[0]->type)->vec_dot_type;
            const int64_t K = node->src[1]->ne[0];
            const size_t in_vec_dot_type = ggml_row_size(vdt, K) * node->src[1]->ne[1] + 64;
#if defined(SI_AMX_BF16)
            if (use_amx_bf16_rows(node->src[0], node->src[1])) return Bf16RowsLayout(node->src[1]).total(n_tasks);
#endif
#if defined(SI_REPACKED_GEMM)
            if (has_repacked_gemm(node->src[0], node->src[1])) {
                return repacked_work_bytes(node->src[0]->type, K, node->src[1]->ne[1], n_tasks);
            }
#endif
#if defined(SI_INT_DOTS)
            return std::max(in_vec_dot_type, int8_vector_bytes(K));  // or one token as an Int8Vector
#else
            return in_vec_dot_type;
#endif
        }
        case GGML_OP_SI_MUL_ROWS_T: {
            // one token: a private output row and a converted weight row per thread;
            // several: a converted weight panel per thread (with AMX: the bf16 layout's buffers)
            const int64_t E = node->src[0]->ne[0];
#if defined(SI_AMX_BF16)
            if (use_amx_bf16(node->src[0], node->src[1])) {
                const Bf16Layout lay(node->src[0], node->src[1]);
                return lay.total(n_tasks);
            }
#endif
#if defined(SI_INT8_PROMPT)
            if (use_int8_prompt(node->src[0], node->src[1])) {
                return Int8Layout(node->src[0], node->src[1]).total(n_tasks);
            }
#endif
            const int64_t panel = PANEL_ROWS * std::max<int64_t>(64, ggml_blck_size(node->src[0]->type)) + 64;
            return (size_t) n_tasks * std::max<int64_t>(2 * (E + 64), panel) * sizeof(float);
        }
        case GGML_OP_SI_FFN_ROWS:
            return (size_t) n_tasks * FfnRowsScratch::per_thread_bytes(node->src[1]->type, node->src[1]->ne[0],
                                                                       node->src[2]->ne[0]);
        case GGML_OP_SI_COUNT:
            // per thread: a positives count, then per neuron a key, a narrowed key and a count
            return (size_t) n_tasks * (sizeof(int64_t) + count_scratch_bytes(node->ne[0])) + 64;
        case GGML_OP_SI_SELECT:  // the candidates' keys, and those the radix select narrows to
            return 2 * (size_t) node->src[0]->ne[0] * sizeof(uint32_t);
        default:
            return 0;
    }
}

bool ggml_si_mul_rows_beats_mul_mat(const struct ggml_tensor * w, const struct ggml_tensor * x) {
    if (x->ne[1] == 1) return one_token_dot_path(w->type, x->ne[0]) == DotPath::int_rows;
#if defined(SI_AMX_BF16)
    if (use_amx_bf16_rows(w, x)) return true;
#endif
#if defined(SI_REPACKED_GEMM)
    if (has_repacked_gemm(w, x)) return true;
#endif
    return false;
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

    const DotPath one_token = T == 1 ? one_token_dot_path(w->type, K) : DotPath::vec_dot;
    if (one_token == DotPath::float_rows) {
        mul_rows_one_token(params, dst);
        return;
    }
#if defined(SI_AMX_BF16)
    if (use_amx_bf16_rows(w, x)) {
        mul_rows_tokens_amx(params, dst);
        return;
    }
#endif
#if defined(SI_REPACKED_GEMM)
    if (has_repacked_gemm(w, x)) {
        switch (w->type) {
#define SI_CASE(T) case GGML_TYPE_##T: MulRowsRepacked<GGML_TYPE_##T>::run(params, dst); return;
            GGML_SI_REPACKED_GEMM_TYPES(SI_CASE)
#undef SI_CASE
            default: GGML_ABORT("no repacked GEMM for type %s", ggml_type_name(w->type));
        }
    }
#endif
#if defined(SI_INT_DOTS)
    if (one_token == DotPath::int_rows) {
        mul_rows_int_one_token(params, dst);
        return;
    }
#endif
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

void ggml_si_compute_forward_mul_rows_t(const struct ggml_compute_params * params, struct ggml_tensor * dst) {
    check_row_ids(dst, "ggml_si_mul_rows_t");
    if (dst->src[1]->ne[1] == 1) {
        mul_rows_t_one_token(params, dst);
        return;
    }
#if defined(SI_AMX_BF16)
    if (use_amx_bf16(dst->src[0], dst->src[1])) {
        mul_rows_t_tokens_amx(params, dst);
        return;
    }
#endif
#if defined(SI_INT8_PROMPT)
    if (use_int8_prompt(dst->src[0], dst->src[1])) {
        mul_rows_t_tokens_int8(params, dst);
        return;
    }
#endif
    mul_rows_t_tokens(params, dst);
}

void ggml_si_compute_forward_ffn_rows(const struct ggml_compute_params * params, struct ggml_tensor * dst) {
    check_row_ids(dst, "ggml_si_ffn_rows");
    ffn_rows_one_token(params, dst);
}

void ggml_si_compute_forward_count(const struct ggml_compute_params * params, struct ggml_tensor * dst) {
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
            for (int64_t i = 0; i < parts[p]->ne[0]; ++i) my_positives += a[i] > 0.0f;
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

void ggml_si_compute_forward_select(const struct ggml_compute_params * params, struct ggml_tensor * dst) {
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

}  // extern "C"
