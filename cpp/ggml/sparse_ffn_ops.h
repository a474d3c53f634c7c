// selectinfer's ggml ops (step 3, selective computation), wired into ggml by
// ggml-patches/0003-sparse-ffn-ops.patch: five entries in `enum ggml_op`, their names, and
// the CPU dispatch. Graph constructors live in sparse_ffn_ops.cpp (ggml-base), CPU kernels in
// sparse_ffn_cpu.cpp (ggml-cpu).
//
// Shapes use ggml order (ne[0] is the row length). A neuron is a row of every FFN matrix.
#pragma once

#include "ggml.h"

#ifdef __cplusplus
extern "C" {
#endif

// Row-indexed matrix-vector (gate and up at decode):
//   w [K, R] any type, x [K, T] F32, ids [n] I32 -> [n, T] F32,  out[j, t] = w[ids[j] - first_id] . x[:, t]
// (first_id: the id of w's row 0, for a weight that holds the rows from first_id on); ids NULL:
// every row (n = R, first_id 0): what a prompt computes over gathered rows where the CPU kernel
// runs upstream's repacked GEMM (ggml_si_has_repacked_gemm), and decode over every gathered row
// where it dots rows eight at a time in integers (ggml_si_has_int_dots).
// The kernels check every row against R, like upstream's get_rows.
GGML_API struct ggml_tensor * ggml_si_mul_rows(struct ggml_context * ctx, struct ggml_tensor * w,
                                               struct ggml_tensor * x, struct ggml_tensor * ids, int first_id);
// Row-indexed transposed accumulate (the down projection stored one row per neuron):
//   w [E, R] any type, h [n, T] F32, ids [n] I32 or NULL (rows 0..n-1) -> [E, T] F32,
//   out[:, t] = sum_j (h[j, t] - h_offset[r_j]) * w[r_j, :],  r_j = ids[j] - first_id
// h_offset [R] F32 or NULL (zeros), one token only: decode's dropped-neuron compensation (each
// chosen neuron's activation less its share nu of the compensation, without two more ops).
GGML_API struct ggml_tensor * ggml_si_mul_rows_t(struct ggml_context * ctx, struct ggml_tensor * w,
                                                 struct ggml_tensor * h, struct ggml_tensor * ids, int first_id,
                                                 struct ggml_tensor * h_offset);
// A decode step's whole FFN over gathered neurons (one token, CPU):
//   gate, up [K, R], down_t [E, R] (the three weights of the same neurons, rows first_id on),
//   x [K, 1] F32, ids [n] I32, prev [E, 1] F32 or NULL (zeros) -> [E, 1] F32,
//   out = prev + sum_j (glu(g_j, up[r_j] . x) - h_offset[r_j]) * down_t[r_j, :],  r_j = ids[j] - first_id
//   g_j = gate_values[r_j] where given ([R] F32: a gate already computed over every row, as a
//   step that chooses by it has; gate may then be NULL, and is not read), else gate[r_j] . x;
//   h_offset [R] F32 or NULL (zeros): the dropped-neuron compensation's nu, as in ggml_si_mul_rows_t.
// glu: GGML_GLU_OP_SWIGLU or GGML_GLU_OP_GEGLU, as ggml_swiglu_split / ggml_geglu_split. The
// same values as ggml_si_mul_rows (gate and up), the GLU op and ggml_si_mul_rows_t, added to prev:
// one graph node where those are five (seven with gate_values: the chosen gate values' get_rows).
GGML_API struct ggml_tensor * ggml_si_ffn_rows(struct ggml_context * ctx, struct ggml_tensor * gate,
                                               struct ggml_tensor * up, struct ggml_tensor * down_t,
                                               struct ggml_tensor * x, struct ggml_tensor * ids, int first_id,
                                               enum ggml_glu_op glu, struct ggml_tensor * prev,
                                               struct ggml_tensor * gate_values, struct ggml_tensor * h_offset);
// A prompt's neuron selection is two ops, so that a prompt evaluated in several batches selects
// from all of its tokens: each batch adds its counts to the previous batches' (a per-layer tensor
// the graph copies the result back into), and the selection reads the running counts.
//
// Counting: act [n_load, T] F32, prev [n_load] F32 or NULL (zeros) -> [n_load] F32,
//   out[i] = prev[i] + number of tokens t with neuron i among t's top k, k = round(alpha * mean
//   number of positive activations per token of this batch), ranking a token's neurons by value
//   (or |value| with by_magnitude); ties to the lower row; NaN ranks below every number.
//   act_rest [n_rest, T] F32 or NULL: the neurons act [n_first, T] is followed by (n_load = n_first
//   + n_rest), as a prompt's static and gathered activations come, so that they are not copied
//   into one tensor first (CPU only).
GGML_API struct ggml_tensor * ggml_si_count(struct ggml_context * ctx, struct ggml_tensor * act,
                                            struct ggml_tensor * act_rest, struct ggml_tensor * prev, float alpha,
                                            bool by_magnitude);

// Selection: counts [n_load] F32 -> [n_static + n_dynamic] I32: rows 0..n_static-1 (the static
// neurons, stored first), then the n_dynamic non-static rows with the highest score(counts),
// ties to the lower row (stored in ranking order, so the better-ranked neuron); ascending.
// score: the counts themselves, or |act(x)| of gate values x (a decode step's per-token choice,
// the activation applied in the op: si_rule::score_of), times scale[i] of non-static row
// n_static + i where scale [n_load - n_static] F32 is given (NULL: 1; a step weighs each
// neuron's gate by its up projection's root mean square, si_rule::scaled_score).
enum ggml_si_score { GGML_SI_SCORE_VALUE = 0, GGML_SI_SCORE_ABS_SILU = 1, GGML_SI_SCORE_ABS_GELU = 2 };
GGML_API struct ggml_tensor * ggml_si_select(struct ggml_context * ctx, struct ggml_tensor * counts, int n_static,
                                             int n_dynamic, enum ggml_si_score score, struct ggml_tensor * scale);

// The node the model loader asks each device about for a weight that op (GGML_OP_SI_MUL_ROWS or
// _ROWS_T) reads (llama.cpp's weight_buft_supported, ggml-patches/0007): a gathered weight is
// placed where the sparse ops run on it, in VRAM where the CUDA kernels take its type.
GGML_API struct ggml_tensor * ggml_si_weight_op(struct ggml_context * ctx, struct ggml_tensor * w, enum ggml_op op);

// Op parameter slots (ggml_set_op_params_*).
enum ggml_si_mul_rows_param { GGML_SI_MUL_ROWS_FIRST_ID = 0 };  // the three row ops
enum ggml_si_ffn_rows_param { GGML_SI_FFN_ROWS_GLU = 1 };
enum ggml_si_count_param { GGML_SI_COUNT_ALPHA = 0, GGML_SI_COUNT_BY_MAGNITUDE = 1 };
enum ggml_si_select_param { GGML_SI_SELECT_N_STATIC = 0, GGML_SI_SELECT_N_DYNAMIC = 1, GGML_SI_SELECT_SCORE = 2 };

// CPU kernels (sparse_ffn_cpu.cpp), called from ggml-cpu's ggml_compute_forward.
struct ggml_compute_params;
void ggml_si_compute_forward_mul_rows(const struct ggml_compute_params * params, struct ggml_tensor * dst);
void ggml_si_compute_forward_mul_rows_t(const struct ggml_compute_params * params, struct ggml_tensor * dst);
void ggml_si_compute_forward_ffn_rows(const struct ggml_compute_params * params, struct ggml_tensor * dst);
void ggml_si_compute_forward_count(const struct ggml_compute_params * params, struct ggml_tensor * dst);
void ggml_si_compute_forward_select(const struct ggml_compute_params * params, struct ggml_tensor * dst);
// The weight types the row ops have a fused loop for, on every CPU (converting in registers,
// several rows in flight; other types go through ggml's per-row conversion): one list for the
// kernels' dispatch (sparse_ffn_cpu.cpp) and for the query below.
#define GGML_SI_FUSED_TYPES(X) X(F32) X(F16) X(BF16) X(Q8_0) X(Q4_0) X(Q4_1) X(Q5_0) X(Q5_1) X(Q4_K) X(Q5_K) X(Q6_K)
GGML_API bool ggml_si_has_fused_loop(enum ggml_type type);
// The weight types whose several-token ggml_si_mul_rows runs upstream's repacked GEMM on a CPU
// built with AVX2 (the rows repacked as it goes, in upstream's Q4_0x8 layout; Q4_1's offsets
// added after).
#define GGML_SI_REPACKED_GEMM_TYPES(X) X(Q4_0) X(Q4_1)
GGML_API bool ggml_si_has_repacked_gemm(enum ggml_type type);
// The weight types whose one-token ggml_si_mul_rows dots eight rows at a time in integers on a CPU
// built with AVX2 and F16C (block_loops.h): over every row, Q4_0, Q4_1 and the K-quants faster than
// upstream's plain-buffer mul_mat, Q8_0 as fast. (Q5_0 and Q5_1: the gate and up of K-quant files
// whose rows are not whole 256-value super-blocks, e.g. Gemma-3-270M's 640.)
#define GGML_SI_INT_DOT_TYPES(X) X(Q8_0) X(Q4_0) X(Q4_1) X(Q5_0) X(Q5_1) X(Q4_K) X(Q5_K) X(Q6_K)
GGML_API bool ggml_si_has_int_dots(enum ggml_type type);
// The weight types whose prompt row ops (several tokens) run on AMX bf16 tiles on a CPU built
// with AMX and AVX512-BF16: quantized and BF16 weights, whose upstream matmuls round the
// activations to 8 bits or to bf16 (F32 and F16 keep exact F32 products). ggml_si_mul_rows takes
// them for rows of whole 32-value steps, faster than upstream's plain-buffer mul_mat.
GGML_API bool ggml_si_has_bf16_tiles(enum ggml_type type);
// Whether the CPU backend's ggml_si_mul_rows(w, x) over every row of w runs a kernel of its own
// (AMX bf16 tiles, the repacked GEMM, integer dots for one token) that beats upstream's mul_mat
// there, as its dispatch decides it (AMX permission included). A graph builder asks the CPU
// backend for it by name (ggml_backend_reg_get_proc_address), which works where the backend is a
// module loaded at run time.
#define GGML_SI_MUL_ROWS_BEATS_MUL_MAT "ggml_si_mul_rows_beats_mul_mat"
typedef bool (*ggml_si_mul_rows_beats_mul_mat_t)(const struct ggml_tensor * w, const struct ggml_tensor * x);
bool ggml_si_mul_rows_beats_mul_mat(const struct ggml_tensor * w, const struct ggml_tensor * x);
// Work-buffer bytes an op needs with n_tasks threads (ggml_graph_plan).
size_t ggml_si_work_size(const struct ggml_tensor * node, int n_tasks);

#ifdef __cplusplus
}
#endif
