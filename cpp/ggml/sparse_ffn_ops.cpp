// Graph constructors of selectinfer's ops (compiled into ggml-base).
#include "sparse_ffn_ops.h"

#include "ggml-impl.h"


// A contiguous F32 tensor of one value per row of w.
static bool one_value_per_row(const struct ggml_tensor * t, const struct ggml_tensor * w) {
    return t->type == GGML_TYPE_F32 && ggml_is_contiguous(t) && ggml_nelements(t) == w->ne[1];
}

extern "C" {

struct ggml_tensor * ggml_si_mul_rows(struct ggml_context * ctx, struct ggml_tensor * w, struct ggml_tensor * x,
                                      struct ggml_tensor * ids, int first_id) {
    GGML_ASSERT(w->ne[0] == x->ne[0] && ggml_n_dims(w) <= 2 && ggml_n_dims(x) <= 2);
    GGML_ASSERT(x->type == GGML_TYPE_F32 && ggml_is_contiguous(x) && ggml_is_contiguous_rows(w) && first_id >= 0);
    GGML_ASSERT(!ids || (ids->type == GGML_TYPE_I32 && ggml_is_vector(ids) && ggml_is_contiguous(ids)));
    GGML_ASSERT(ids || first_id == 0);
    struct ggml_tensor * out = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, ids ? ids->ne[0] : w->ne[1], x->ne[1]);
    ggml_set_op_params_i32(out, GGML_SI_MUL_ROWS_FIRST_ID, first_id);
    out->op     = GGML_OP_SI_MUL_ROWS;
    out->src[0] = w;
    out->src[1] = x;
    out->src[2] = ids;
    return out;
}

struct ggml_tensor * ggml_si_mul_rows_t(struct ggml_context * ctx, struct ggml_tensor * w, struct ggml_tensor * h,
                                        struct ggml_tensor * ids, int first_id, struct ggml_tensor * h_offset) {
    GGML_ASSERT(ggml_n_dims(w) <= 2 && ggml_n_dims(h) <= 2 && h->type == GGML_TYPE_F32 && ggml_is_contiguous(h));
    GGML_ASSERT(ggml_is_contiguous_rows(w) && first_id >= 0 && (ids || first_id == 0));
    if (ids) {
        GGML_ASSERT(ids->type == GGML_TYPE_I32 && ggml_is_vector(ids) && ids->ne[0] == h->ne[0]);
    } else {
        GGML_ASSERT(h->ne[0] <= w->ne[1]);
    }
    struct ggml_tensor * out = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, w->ne[0], h->ne[1]);
    ggml_set_op_params_i32(out, GGML_SI_MUL_ROWS_FIRST_ID, first_id);
    if (h_offset) {
        GGML_ASSERT(h_offset->type == GGML_TYPE_F32 && ggml_is_vector(h_offset) && ggml_is_contiguous(h_offset));
        GGML_ASSERT(h_offset->ne[0] == w->ne[1] && h->ne[1] == 1);
    }
    out->op     = GGML_OP_SI_MUL_ROWS_T;
    out->src[0] = w;
    out->src[1] = h;
    out->src[2] = ids;
    out->src[3] = h_offset;
    return out;
}

struct ggml_tensor * ggml_si_ffn_rows(struct ggml_context * ctx, struct ggml_tensor * gate, struct ggml_tensor * up,
                                      struct ggml_tensor * down_t, struct ggml_tensor * x, struct ggml_tensor * ids,
                                      int first_id, enum ggml_glu_op glu, struct ggml_tensor * prev,
                                      struct ggml_tensor * gate_values, struct ggml_tensor * h_offset) {
    GGML_ASSERT(gate || gate_values);
    GGML_ASSERT(!gate || (ggml_are_same_shape(gate, up) && gate->type == up->type && ggml_is_contiguous_rows(gate)));
    GGML_ASSERT(ggml_n_dims(up) <= 2 && ggml_n_dims(down_t) <= 2);
    GGML_ASSERT(down_t->ne[1] == up->ne[1] && ggml_is_contiguous_rows(up) && ggml_is_contiguous_rows(down_t));
    GGML_ASSERT(x->type == GGML_TYPE_F32 && ggml_is_vector(x) && ggml_is_contiguous(x) && x->ne[0] == up->ne[0]);
    GGML_ASSERT(ids->type == GGML_TYPE_I32 && ggml_is_vector(ids) && ggml_is_contiguous(ids) && first_id >= 0);
    GGML_ASSERT(glu == GGML_GLU_OP_SWIGLU || glu == GGML_GLU_OP_GEGLU);
    GGML_ASSERT(!prev || (prev->type == GGML_TYPE_F32 && ggml_is_contiguous(prev) && ggml_nelements(prev) == down_t->ne[0]));
    GGML_ASSERT(!gate_values || one_value_per_row(gate_values, up));
    GGML_ASSERT(!h_offset || one_value_per_row(h_offset, up));
    struct ggml_tensor * out = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, down_t->ne[0], 1);
    ggml_set_op_params_i32(out, GGML_SI_MUL_ROWS_FIRST_ID, first_id);
    ggml_set_op_params_i32(out, GGML_SI_FFN_ROWS_GLU, glu);
    out->op     = GGML_OP_SI_FFN_ROWS;
    out->src[0] = gate;
    out->src[1] = up;
    out->src[2] = down_t;
    out->src[3] = x;
    out->src[4] = ids;
    out->src[5] = prev;
    out->src[6] = gate_values;
    out->src[7] = h_offset;
    return out;
}

struct ggml_tensor * ggml_si_count(struct ggml_context * ctx, struct ggml_tensor * act, struct ggml_tensor * act_rest,
                                   struct ggml_tensor * prev, float alpha, bool by_magnitude) {
    GGML_ASSERT(act->type == GGML_TYPE_F32 && ggml_n_dims(act) <= 2 && ggml_is_contiguous(act));
    GGML_ASSERT(alpha >= 0.0f && alpha <= 1.0f);
    if (act_rest) {
        GGML_ASSERT(act_rest->type == GGML_TYPE_F32 && ggml_n_dims(act_rest) <= 2 && ggml_is_contiguous(act_rest));
        GGML_ASSERT(act_rest->ne[1] == act->ne[1]);
    }
    const int64_t n_load = act->ne[0] + (act_rest ? act_rest->ne[0] : 0);
    if (prev) {
        GGML_ASSERT(prev->type == GGML_TYPE_F32 && ggml_is_vector(prev) && prev->ne[0] == n_load);
        GGML_ASSERT(ggml_is_contiguous(prev));
    }
    struct ggml_tensor * out = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, n_load);
    ggml_set_op_params_f32(out, GGML_SI_COUNT_ALPHA, alpha);
    ggml_set_op_params_i32(out, GGML_SI_COUNT_BY_MAGNITUDE, by_magnitude ? 1 : 0);
    out->op     = GGML_OP_SI_COUNT;
    out->src[0] = act;
    out->src[1] = prev;
    out->src[2] = act_rest;
    return out;
}

struct ggml_tensor * ggml_si_select(struct ggml_context * ctx, struct ggml_tensor * counts, int n_static,
                                    int n_dynamic, enum ggml_si_score score, struct ggml_tensor * scale) {
    GGML_ASSERT(counts->type == GGML_TYPE_F32 && ggml_is_vector(counts) && ggml_is_contiguous(counts));
    GGML_ASSERT(n_static >= 0 && n_dynamic >= 0 && n_static + n_dynamic > 0);
    GGML_ASSERT(n_static + n_dynamic <= counts->ne[0]);
    GGML_ASSERT(score == GGML_SI_SCORE_VALUE || score == GGML_SI_SCORE_ABS_SILU || score == GGML_SI_SCORE_ABS_GELU);
    GGML_ASSERT(!scale || (scale->type == GGML_TYPE_F32 && ggml_is_contiguous(scale) &&
                           ggml_nelements(scale) == counts->ne[0] - n_static));
    struct ggml_tensor * out = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, n_static + n_dynamic);
    ggml_set_op_params_i32(out, GGML_SI_SELECT_N_STATIC, n_static);
    ggml_set_op_params_i32(out, GGML_SI_SELECT_N_DYNAMIC, n_dynamic);
    ggml_set_op_params_i32(out, GGML_SI_SELECT_SCORE, score);
    out->op     = GGML_OP_SI_SELECT;
    out->src[0] = counts;
    out->src[1] = scale;
    return out;
}

struct ggml_tensor * ggml_si_weight_op(struct ggml_context * ctx, struct ggml_tensor * w, enum ggml_op op) {
    GGML_ASSERT(op == GGML_OP_SI_MUL_ROWS || op == GGML_OP_SI_MUL_ROWS_T);
    if (op == GGML_OP_SI_MUL_ROWS) {
        return ggml_si_mul_rows(ctx, w, ggml_new_tensor_1d(ctx, GGML_TYPE_F32, w->ne[0]),
                                ggml_new_tensor_1d(ctx, GGML_TYPE_I32, 1), 0);
    }
    return ggml_si_mul_rows_t(ctx, w, ggml_new_tensor_1d(ctx, GGML_TYPE_F32, w->ne[1]), nullptr, 0, nullptr);
}

// Whether a type is on one of the type lists of sparse_ffn_ops.h.
#define GGML_SI_CASE(T) case GGML_TYPE_##T:
#define GGML_SI_LIST_HAS(LIST, type) \
    switch (type) {                  \
        LIST(GGML_SI_CASE)           \
        return true;                 \
        default:                     \
            return false;            \
    }

bool ggml_si_has_fused_loop(enum ggml_type type) { GGML_SI_LIST_HAS(GGML_SI_FUSED_TYPES, type) }
bool ggml_si_has_repacked_gemm(enum ggml_type type) { GGML_SI_LIST_HAS(GGML_SI_REPACKED_GEMM_TYPES, type) }
bool ggml_si_has_int_dots(enum ggml_type type) { GGML_SI_LIST_HAS(GGML_SI_INT_DOT_TYPES, type) }

bool ggml_si_has_bf16_tiles(enum ggml_type type) { return ggml_is_quantized(type) || type == GGML_TYPE_BF16; }

#undef GGML_SI_LIST_HAS
#undef GGML_SI_CASE

}  // extern "C"
