// What the kernel families of the CPU backend's sparse FFN ops share (internal to ggml-cpu): the
// helpers over gathered rows, the tile sizes and work items of a prompt's products, the work
// buffer layouts the dispatch sizes, and each family's entry points. The families, one file each:
//   rows_common.cpp    row ids, column ranges, rows added or converted with the fused block loops
//   rows_vec_dot.cpp   mul_rows through ggml's vec_dot, row by row (any batch: the fallback)
//   rows_one_token.cpp decode: mul_rows (float rows, integer dots), mul_rows_t, ffn_rows
//   repacked_gemm.cpp  several tokens, Q4_0/Q4_1 on x86 with AVX2 through upstream's repacked GEMM
//   rows_t_tokens.cpp  several tokens, mul_rows_t over F32 panels (a blocked GEMM)
//   int8_prompt.cpp    several tokens, mul_rows_t in int8 on AVX-512 VNNI
//   amx_bf16.cpp       several tokens, mul_rows and mul_rows_t on AMX bf16 tiles
//   select.cpp         count and select (partitions in vectors on AVX-512)
// sparse_ffn_cpu.cpp picks among them for each op, type and batch (the entry points ggml calls).
// Which families a build has: cpu_features.h.
#pragma once

#include "cpu_features.h"
#include "sparse_ffn_ops.h"
#include "block_loops.h"

#include "ggml-cpu-impl.h"
#include "ggml-cpu.h"
#include "ggml-impl.h"
#include "vec.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace si_cpu {

using namespace si_blocks;

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
void check_row_ids(const ggml_tensor * dst, const char * op);

inline int64_t ceil_div(int64_t x, int64_t by) { return (x + by - 1) / by; }
inline int64_t round_up(int64_t x, int64_t to) { return ceil_div(x, to) * to; }

// Columns [c0, c1) of t handled by thread ith: whole blocks of t's type.
void column_range(const ggml_tensor * t, int ith, int nth, int64_t & c0, int64_t & c1);

// --- one token: y += sum over a group of rows of v[k] * row k ------------------------------------
// block_values has a loop for each of GGML_SI_FUSED_TYPES (sparse_ffn_ops.h), on every CPU.
inline bool has_block_loop(ggml_type type) {
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
                    const char * const * next, int n_next);

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
                   float * out, int64_t stride);

// --- mul_rows through ggml's vec_dot, row by row, x converted once (rows_vec_dot.cpp) -------------
void mul_rows_vec_dot(const ggml_compute_params * params, ggml_tensor * dst);

// --- one token (decode): rows_one_token.cpp -------------------------------------------------------
// One token (decode), gate and up: rows GROUP at a time, groups dealt out to threads in turn
// (the static rows come first and are contiguous, the dynamic ones scattered and slower to read).
void mul_rows_one_token(const ggml_compute_params * params, ggml_tensor * dst);
#if defined(SI_INT_DOTS)
// One token (decode), gate and up of 4- and 8-bit rows: x quantized once (thread 0), then rows
// GROUP at a time in integers, groups dealt out in turn, each thread's next group read ahead.
void mul_rows_int_one_token(const ggml_compute_params * params, ggml_tensor * dst);
#endif
// One token (decode): threads split the neurons; each adds its rows, ADD_GROUP at a time, into a
// private output row, and the private rows are summed at the end.
void mul_rows_t_one_token(const ggml_compute_params * params, ggml_tensor * dst);

// How a one-token product of rows with x runs for a weight type: float weights in the fused
// loop (several rows in flight); quantized ones in integers eight rows at a time where the CPU
// has those loops, else ggml's vec_dot with a quantized x (faster than converting the weights).
enum class DotPath { float_rows, int_rows, vec_dot };
DotPath one_token_dot_path(ggml_type type, int64_t K);

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
// The gathered neurons' whole FFN in one op (ggml_si_ffn_rows).
void ffn_rows_one_token(const ggml_compute_params * params, ggml_tensor * dst);

#if defined(SI_REPACKED_GEMM)
// --- several tokens, Q4_0 and Q4_1 on x86 with AVX2: upstream's repacked GEMM (repacked_gemm.cpp)
bool has_repacked_gemm(const ggml_tensor * w, const ggml_tensor * x);
// The op's work buffer.
size_t repacked_work_bytes(ggml_type type, int64_t K, int64_t n_tokens, int n_threads);
// mul_rows of several tokens for a type of GGML_SI_REPACKED_GEMM_TYPES.
void mul_rows_tokens_repacked(const ggml_compute_params * params, ggml_tensor * dst);
#endif

// --- several tokens: the tiles and work items of a prompt's down projection ----------------------
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
int64_t prompt_token_chunk(int64_t T, int64_t n_panels, int nth);

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

// mul_rows_t of several tokens over F32 panels (rows_t_tokens.cpp).
void mul_rows_t_tokens(const ggml_compute_params * params, ggml_tensor * dst);

#if defined(SI_INT8_PROMPT)
// --- several tokens, quantized rows on x86 with AVX-512 VNNI: mul_rows_t in int8 (int8_prompt.cpp)
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

bool use_int8_prompt(const ggml_tensor * w, const ggml_tensor * hs);
void mul_rows_t_tokens_int8(const ggml_compute_params * params, ggml_tensor * dst);
#endif

#if defined(SI_AMX_BF16)
// --- several tokens on a CPU with AMX: mul_rows_t and mul_rows on bf16 tiles (amx_bf16.cpp) -------
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
bool use_amx_bf16(const ggml_tensor * w, const ggml_tensor * hs);
SI_AMX_BF16_TARGET void mul_rows_t_tokens_amx(const ggml_compute_params * params, ggml_tensor * dst);

constexpr int64_t ROWS_PER_CHUNK = 2 * TILE;  // the A tiles of one step

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

bool use_amx_bf16_rows(const ggml_tensor * w, const ggml_tensor * x);
SI_AMX_BF16_TARGET void mul_rows_tokens_amx(const ggml_compute_params * params, ggml_tensor * dst);
#endif

// --- count and select (select.cpp) ---------------------------------------------------------------
// One thread's scratch of the counting op, in bytes: three arrays of n_load.
size_t count_scratch_bytes(int64_t n_load);
// A prompt batch's votes (ggml_si_count).
void count_votes(const ggml_compute_params * params, ggml_tensor * dst);
// The most counted neurons (ggml_si_select).
void select_neurons(const ggml_compute_params * params, ggml_tensor * dst);

}  // namespace si_cpu
