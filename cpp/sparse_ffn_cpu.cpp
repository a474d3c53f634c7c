// CPU kernels of selectinfer's ops (compiled into ggml-cpu). They reuse ggml's per-type
// machinery instead of new SIMD: vec_dot with the type's vec_dot_type (the activation is
// quantized once), to_float for a row chunk, ggml_vec_mad_f32 for the accumulation.
#include "sparse_ffn_ops.h"

#include "ggml-cpu-impl.h"
#include "ggml-cpu.h"
#include "ggml-impl.h"
#include "vec.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

namespace {

int64_t row_of(const ggml_tensor * ids, int64_t j) {
    return ids ? (int64_t) ((const int32_t *) ids->data)[j] : j;
}

// Columns [c0, c1) of output element range handled by thread ith: whole blocks of the weight type.
void column_range(const ggml_tensor * w, int ith, int nth, int64_t & c0, int64_t & c1) {
    const int64_t blck = ggml_blck_size(w->type);
    const int64_t n_blocks = w->ne[0] / blck;
    const int64_t per = (n_blocks + nth - 1) / nth;
    c0 = std::min(n_blocks, per * ith) * blck;
    c1 = std::min(n_blocks, per * (ith + 1)) * blck;
}

// y[0..n) += v * row[0..n) for one quantized row chunk, dequantizing block by block in
// registers (decode: each weight is used once, so no dequantized copy is worth writing).
// Returns false for types without a fused loop (the caller dequantizes a chunk instead).
bool mad_row(ggml_type type, const void * row, int64_t n, float v, float * y) {
    switch (type) {
        case GGML_TYPE_Q8_0: {
            const auto * b = (const uint8_t *) row;
            for (int64_t i = 0; i < n; i += 32, b += 34) {
                ggml_fp16_t d;
                std::memcpy(&d, b, 2);
                const float dv = v * GGML_CPU_FP16_TO_FP32(d);
                const int8_t * q = (const int8_t *) (b + 2);
                for (int j = 0; j < 32; ++j) y[i + j] += dv * (float) q[j];
            }
            return true;
        }
        case GGML_TYPE_Q4_0: {
            const auto * b = (const uint8_t *) row;
            for (int64_t i = 0; i < n; i += 32, b += 18) {
                ggml_fp16_t d;
                std::memcpy(&d, b, 2);
                const float dv = v * GGML_CPU_FP16_TO_FP32(d);
                const uint8_t * q = b + 2;
                for (int j = 0; j < 16; ++j) {
                    y[i + j]      += dv * (float) ((q[j] & 0x0F) - 8);
                    y[i + j + 16] += dv * (float) ((q[j] >> 4) - 8);
                }
            }
            return true;
        }
        case GGML_TYPE_Q4_1: {
            const auto * b = (const uint8_t *) row;
            for (int64_t i = 0; i < n; i += 32, b += 20) {
                ggml_fp16_t d, m;
                std::memcpy(&d, b, 2);
                std::memcpy(&m, b + 2, 2);
                const float dv = v * GGML_CPU_FP16_TO_FP32(d), mv = v * GGML_CPU_FP16_TO_FP32(m);
                const uint8_t * q = b + 4;
                for (int j = 0; j < 16; ++j) {
                    y[i + j]      += dv * (float) (q[j] & 0x0F) + mv;
                    y[i + j + 16] += dv * (float) (q[j] >> 4) + mv;
                }
            }
            return true;
        }
        default:
            return false;
    }
}

}  // namespace

extern "C" {

size_t ggml_si_work_size(const struct ggml_tensor * node, int n_tasks) {
    switch (node->op) {
        case GGML_OP_SI_MUL_ROWS: {
            const ggml_type vdt = ggml_get_type_traits_cpu(node->src[0]->type)->vec_dot_type;
            return ggml_row_size(vdt, node->src[1]->ne[0]) * node->src[1]->ne[1] + 64;
        }
        case GGML_OP_SI_MUL_ROWS_T:
            // one dequantized row chunk per thread
            return (size_t) n_tasks * (node->src[0]->ne[0] + 64) * sizeof(float);
        case GGML_OP_SI_SELECT:
            // per neuron: a value, an index and a count
            return (size_t) node->src[0]->ne[0] * (sizeof(float) + 2 * sizeof(int32_t)) + 64;
        default:
            return 0;
    }
}

void ggml_si_compute_forward_mul_rows(const struct ggml_compute_params * params, struct ggml_tensor * dst) {
    const ggml_tensor * w = dst->src[0];
    const ggml_tensor * x = dst->src[1];
    const ggml_tensor * ids = dst->src[2];
    const int64_t K = x->ne[0], T = x->ne[1], n = dst->ne[0];
    const auto * traits = ggml_get_type_traits_cpu(w->type);
    const ggml_type vdt = traits->vec_dot_type;
    const size_t x_row = ggml_row_size(vdt, K);
    const int ith = params->ith, nth = params->nth;

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
    const int64_t per = (n + nth - 1) / nth;
    const int64_t j0 = std::min(n, per * ith), j1 = std::min(n, per * (ith + 1));
    for (int64_t j = j0; j < j1; ++j) {
        const char * row = (const char *) w->data + row_of(ids, j) * w->nb[1];
        for (int64_t t = 0; t < T; ++t) {
            float * out = (float *) ((char *) dst->data + t * dst->nb[1]) + j;
            traits->vec_dot((int) K, out, 0, row, 0, xq + t * x_row, 0, 1);
        }
    }
}

void ggml_si_compute_forward_mul_rows_t(const struct ggml_compute_params * params, struct ggml_tensor * dst) {
    const ggml_tensor * w = dst->src[0];
    const ggml_tensor * h = dst->src[1];
    const ggml_tensor * ids = dst->src[2];
    const int64_t n = h->ne[0], T = h->ne[1];
    int64_t c0, c1;
    column_range(w, params->ith, params->nth, c0, c1);
    for (int64_t t = 0; t < T; ++t) {
        std::memset((float *) ((char *) dst->data + t * dst->nb[1]) + c0, 0, (c1 - c0) * sizeof(float));
    }
    if (c1 <= c0) {
        return;
    }
    const int64_t width = c1 - c0;
    const size_t offset = ggml_row_size(w->type, c0);  // whole blocks
    const auto to_float = ggml_get_type_traits(w->type)->to_float;
    float * chunk = (float *) params->wdata + params->ith * (w->ne[0] + 64);
    if (T == 1 && w->type != GGML_TYPE_F32 && w->type != GGML_TYPE_F16) {
        float * y = (float *) dst->data + c0;
        const float * hv = (const float *) h->data;
        bool fused = true;
        for (int64_t j = 0; j < n && fused; ++j) {
            if (hv[j] != 0.0f) {
                fused = mad_row(w->type, (const char *) w->data + row_of(ids, j) * w->nb[1] + offset, width, hv[j], y);
            }
        }
        if (fused) {
            return;
        }
        std::memset(y, 0, width * sizeof(float));  // no fused loop for this type: start again below
    }
    // tokens in tiles: a weight chunk is read once per tile, the tile's outputs stay in cache
    const int64_t tile = 32;
    for (int64_t t0 = 0; t0 < T; t0 += tile) {
        const int64_t t1 = std::min(T, t0 + tile);
        for (int64_t j = 0; j < n; ++j) {
            const char * row = (const char *) w->data + row_of(ids, j) * w->nb[1] + offset;
            const float * src;
            if (w->type == GGML_TYPE_F32) {
                src = (const float *) row;
            } else if (w->type == GGML_TYPE_F16) {  // SIMD conversion
                ggml_cpu_fp16_to_fp32((const ggml_fp16_t *) row, chunk, width);
                src = chunk;
            } else {
                to_float(row, chunk, width);
                src = chunk;
            }
            for (int64_t t = t0; t < t1; ++t) {
                const float v = ((const float *) ((const char *) h->data + t * h->nb[1]))[j];
                if (v != 0.0f) {
                    ggml_vec_mad_f32((int) width, (float *) ((char *) dst->data + t * dst->nb[1]) + c0, src, v);
                }
            }
        }
    }
}

void ggml_si_compute_forward_select(const struct ggml_compute_params * params, struct ggml_tensor * dst) {
    if (params->ith != 0) {
        return;  // small and sequential: one thread
    }
    const ggml_tensor * act = dst->src[0];
    const int32_t n_static = ggml_get_op_params_i32(dst, 0);
    const int32_t n_dynamic = ggml_get_op_params_i32(dst, 1);
    const float alpha = ggml_get_op_params_f32(dst, 2);
    const bool by_magnitude = ggml_get_op_params_i32(dst, 3) != 0;
    const int64_t n_load = act->ne[0], T = act->ne[1];

    float * value = (float *) params->wdata;
    int32_t * order = (int32_t *) (value + n_load);
    int32_t * count = order + n_load;

    // k = round(alpha * mean number of positive activations per token)
    int64_t positives = 0;
    for (int64_t t = 0; t < T; ++t) {
        const float * a = (const float *) ((const char *) act->data + t * act->nb[1]);
        for (int64_t i = 0; i < n_load; ++i) positives += a[i] > 0.0f;
    }
    const int64_t k = std::min<int64_t>(n_load, std::llround(alpha * (double) positives / (double) T));

    std::fill(count, count + n_load, 0);
    for (int64_t t = 0; t < T && k > 0; ++t) {
        const float * a = (const float *) ((const char *) act->data + t * act->nb[1]);
        for (int64_t i = 0; i < n_load; ++i) value[i] = by_magnitude ? std::fabs(a[i]) : a[i];
        std::iota(order, order + n_load, 0);
        auto higher = [value](int32_t x, int32_t y) { return value[x] > value[y] || (value[x] == value[y] && x < y); };
        std::nth_element(order, order + (k - 1), order + n_load, higher);
        for (int64_t r = 0; r < k; ++r) count[order[r]] += 1;
    }
    // the n_dynamic most frequent non-static neurons; ties to the lower row
    const int64_t n_candidates = n_load - n_static;
    std::iota(order, order + n_candidates, n_static);
    auto more = [count](int32_t x, int32_t y) { return count[x] > count[y] || (count[x] == count[y] && x < y); };
    std::partial_sort(order, order + n_dynamic, order + n_candidates, more);
    std::sort(order, order + n_dynamic);

    int32_t * out = (int32_t *) dst->data;
    for (int32_t i = 0; i < n_static; ++i) out[i] = i;
    std::copy(order, order + n_dynamic, out + n_static);
}

}  // extern "C"
