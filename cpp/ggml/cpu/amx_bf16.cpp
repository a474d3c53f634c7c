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
#include "sparse_ffn_cpu.h"

#if defined(SI_AMX_BF16)  // x86 with AMX-TILE and AVX512-BF16, Linux (cpu_features.h)
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace si_cpu {

// The CPU has AMX-BF16, and Linux gives the process the tile registers' state (it does only on
// request, arch_prctl); asked once per process.
static bool amx_tiles_permitted() {
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

// The tile sizes and the op's work buffer: TILE, PAIR_ROWS, Bf16Layout (sparse_ffn_cpu.h).

// Several tokens over the weight types of ggml_si_has_bf16_tiles (F32 and F16 keep the F32 GEMM).
bool use_amx_bf16(const ggml_tensor * w, const ggml_tensor * hs) {
    return hs->ne[1] > 1 && ggml_si_has_bf16_tiles(w->type) && amx_tiles_permitted();
}

// rows (< PANEL_ROWS: the rest zero) x panel_width F32 -> per k step of 32 rows and per 16
// columns one B tile: row r holds, column by column, the bf16 pair (row 2r, row 2r + 1).
static void panel_to_tiles(const float * panel, int64_t rows, int64_t panel_width, ggml_bf16_t * tiles) {
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
// The rows of one step and the op's work buffer: ROWS_PER_CHUNK, Bf16RowsLayout (sparse_ffn_cpu.h).

// n floats (a multiple of 32) to bf16, rounding to nearest even as ggml's conversion does
static void floats_to_bf16(const float * x, ggml_bf16_t * y, int64_t n) {
    for (int64_t i = 0; i < n; i += 32) {
        const __m512bh both = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + i + 16), _mm512_loadu_ps(x + i));
        _mm512_storeu_si512(y + i, (__m512i) both);
    }
}

bool use_amx_bf16_rows(const ggml_tensor * w, const ggml_tensor * x) {
    return x->ne[1] > 1 && x->ne[0] % PAIR_ROWS == 0 && ggml_si_has_bf16_tiles(w->type) && amx_tiles_permitted();
}

// Token t's activations into the B tiles: the 16 pairs of each k step go to column t % 16 of
// its tile's 16 rows. Tokens past T (the padding) are zeros.
static void token_to_tiles(const float * x_t, int64_t t, const Bf16RowsLayout & lay, ggml_bf16_t * xb) {
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
static void transpose_16x16(const float * in, float * out) {
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

}  // namespace si_cpu
#endif  // SI_AMX_BF16
