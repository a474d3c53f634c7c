// CPU kernels of selectinfer's ops (compiled into ggml-cpu): the entry points ggml calls, each
// choosing the kernel for its op, weight type, batch and CPU level; the kernels live in one file
// per family (sparse_ffn_cpu.h lists them; cpu_features.h says which a build has).
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
#include "sparse_ffn_cpu.h"

using namespace si_cpu;

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
    const int64_t K = x->ne[0], T = x->ne[1];
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
        mul_rows_tokens_repacked(params, dst);
        return;
    }
#endif
#if defined(SI_INT_DOTS)
    if (one_token == DotPath::int_rows) {
        mul_rows_int_one_token(params, dst);
        return;
    }
#endif
    mul_rows_vec_dot(params, dst);
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
    count_votes(params, dst);
}

void ggml_si_compute_forward_select(const struct ggml_compute_params * params, struct ggml_tensor * dst) {
    select_neurons(params, dst);
}

}  // extern "C"
