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
#include "sparse_ffn_cpu.h"

#if defined(SI_REPACKED_GEMM)  // x86 with AVX2 (cpu_features.h)
#include "repack.h"

namespace si_cpu {

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

// mul_rows of several tokens through the type's repacked kernel.
void mul_rows_tokens_repacked(const ggml_compute_params * params, ggml_tensor * dst) {
    const ggml_tensor * w = dst->src[0];
    switch (w->type) {
#define SI_CASE(T) case GGML_TYPE_##T: MulRowsRepacked<GGML_TYPE_##T>::run(params, dst); return;
        GGML_SI_REPACKED_GEMM_TYPES(SI_CASE)
#undef SI_CASE
        default: GGML_ABORT("no repacked GEMM for type %s", ggml_type_name(w->type));
    }
}

}  // namespace si_cpu
#endif  // SI_REPACKED_GEMM
