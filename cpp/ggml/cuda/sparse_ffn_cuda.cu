// CUDA kernels of selectinfer's ops (sparse_ffn_ops.h). The per-type dequantization
// (row_decode.h) and the selection rule (selection_rule.h) are shared with the host, where the
// CPU tests check them; what is CUDA-only here is how the work is spread over threads.
//   mul_rows    a warp per (neuron, token): lanes take the row's 32-value groups in turn, then
//               the warp sums its lanes.
//   mul_rows_t  one token: a thread per 32-column group accumulates a slice of the neurons in
//               registers and adds it to the output with atomics (the output is zeroed first);
//               several tokens: the rows gathered to F32 in chunks, then a cuBLAS GEMM each.
//   count       a block per token: the k-th largest key by radix select over the key bits, then
//               the votes (ties to the lower row by an ordered prefix count); k is read from a
//               device counter of positives, so nothing waits for the host.
//   select      one block: the same top-k over the non-static neurons' counts, written ascending.
// Row ids outside the weight's rows add nothing (the CPU kernels abort on them; the graph never
// makes them: ids come from ggml_si_select over the loaded rows).
#include "sparse_ffn_cuda.cuh"

#include "common.cuh"
#include "row_decode.h"
#include "selection_rule.h"
#include "sparse_ffn_ops.h"

#include <algorithm>

namespace {

constexpr int GROUP_VALUES = 32;  // values decoded at once (row_decode.h)

// A weight whose rows are the op's neurons: neuron j's row is ids[j] - first_id (or j without ids).
struct WeightRows {
    const uint8_t * data;
    int64_t row_bytes;
    int64_t n_rows;     // rows the weight holds
    const int32_t * ids;
    int64_t first_id;
    int64_t n;          // neurons
    int64_t n_groups;   // 32-value groups per row

    __device__ int64_t row_index(int64_t j) const { return ids ? (int64_t) ids[j] - first_id : j; }
    __device__ const uint8_t * row(int64_t j) const {
        const int64_t r = row_index(j);
        return r >= 0 && r < n_rows ? data + r * row_bytes : nullptr;
    }
};

static WeightRows weight_rows(const ggml_tensor * dst) {
    const ggml_tensor * w = dst->src[0];
    const ggml_tensor * ids = dst->src[2];
    const ggml_tensor * act = dst->src[1];
    return {(const uint8_t *) w->data, (int64_t) w->nb[1], w->ne[1], ids ? (const int32_t *) ids->data : nullptr,
            ggml_get_op_params_i32(dst, GGML_SI_MUL_ROWS_FIRST_ID),
            dst->op == GGML_OP_SI_MUL_ROWS ? dst->ne[0] : act->ne[0], w->ne[0] / GROUP_VALUES};
}

// --- mul_rows: out[j, t] = w[row j] . x[:, t] --------------------------------------------------

constexpr int MUL_ROWS_WARPS = 8;

template <ggml_type T>
__global__ void mul_rows_kernel(WeightRows w, const float * x, int64_t x_stride, float * out, int64_t out_stride) {
    const int64_t j = (int64_t) blockIdx.x * MUL_ROWS_WARPS + threadIdx.y;
    const int64_t t = blockIdx.y;
    if (j >= w.n) return;  // a whole warp: threadIdx.y is the warp
    const uint8_t * row = w.row(j);
    const float * xt = x + t * x_stride;
    float sum = 0.0f;
    if (row) {
        for (int64_t g = threadIdx.x; g < w.n_groups; g += WARP_SIZE) {
            float v[GROUP_VALUES];
            si_decode::row_group<T>(row, g, v);
            const float * xg = xt + GROUP_VALUES * g;
#pragma unroll
            for (int i = 0; i < GROUP_VALUES; ++i) sum += v[i] * xg[i];
        }
    }
    sum = warp_reduce_sum(sum);
    if (threadIdx.x == 0) out[t * out_stride + j] = sum;
}

template <ggml_type T> struct MulRows {
    static void launch(const WeightRows & w, const ggml_tensor * x, ggml_tensor * dst, cudaStream_t stream) {
        const dim3 block(WARP_SIZE, MUL_ROWS_WARPS);
        const dim3 grid((unsigned) ((w.n + MUL_ROWS_WARPS - 1) / MUL_ROWS_WARPS), (unsigned) x->ne[1]);
        mul_rows_kernel<T><<<grid, block, 0, stream>>>(w, (const float *) x->data, x->nb[1] / sizeof(float),
                                                       (float *) dst->data, dst->nb[1] / sizeof(float));
    }
};

// --- mul_rows_t, one token: out[:] = sum_j (h[j] - h_offset[row j]) * w[row j][:] ------------------

constexpr int GROUPS_PER_BLOCK = 128;

template <ggml_type T>
__global__ void mul_rows_t_one_token_kernel(WeightRows w, const float * h, const float * h_offset, int64_t rows_per_block,
                                            float * out) {
    const int64_t g = (int64_t) blockIdx.x * GROUPS_PER_BLOCK + threadIdx.x;
    if (g >= w.n_groups) return;
    const int64_t j0 = (int64_t) blockIdx.y * rows_per_block;
    const int64_t j1 = j0 + rows_per_block < w.n ? j0 + rows_per_block : w.n;
    float acc[GROUP_VALUES] = {};
    for (int64_t j = j0; j < j1; ++j) {
        const uint8_t * row = w.row(j);
        if (!row) continue;
        const float hj = h_offset ? h[j] - h_offset[w.row_index(j)] : h[j];
        if (hj == 0.0f) continue;
        float v[GROUP_VALUES];
        si_decode::row_group<T>(row, g, v);
#pragma unroll
        for (int i = 0; i < GROUP_VALUES; ++i) acc[i] += hj * v[i];
    }
    float * o = out + GROUP_VALUES * g;
#pragma unroll
    for (int i = 0; i < GROUP_VALUES; ++i) atomicAdd(o + i, acc[i]);
}

template <ggml_type T> struct MulRowsTOneToken {
    static void launch(const WeightRows & w, const float * h, const float * h_offset, float * out, int n_sm,
                       cudaStream_t stream) {
        // enough blocks for every multiprocessor twice over, and at least 8 rows per atomic add
        const int64_t rows_per_block = std::max<int64_t>(8, (w.n + 2 * n_sm - 1) / (2 * n_sm));
        const dim3 grid((unsigned) ((w.n_groups + GROUPS_PER_BLOCK - 1) / GROUPS_PER_BLOCK),
                        (unsigned) ((w.n + rows_per_block - 1) / rows_per_block));
        mul_rows_t_one_token_kernel<T><<<grid, GROUPS_PER_BLOCK, 0, stream>>>(w, h, h_offset, rows_per_block, out);
    }
};

// --- mul_rows_t, several tokens: rows [j0, j0 + n_rows) to F32, then a GEMM ---------------------

template <ggml_type T>
__global__ void rows_to_float_kernel(WeightRows w, int64_t j0, float * out) {
    const int64_t g = (int64_t) blockIdx.x * GROUPS_PER_BLOCK + threadIdx.x;
    if (g >= w.n_groups) return;
    const int64_t j = j0 + blockIdx.y;
    float * o = out + (int64_t) blockIdx.y * w.n_groups * GROUP_VALUES + GROUP_VALUES * g;
    const uint8_t * row = w.row(j);
    float v[GROUP_VALUES];
    if (row) {
        si_decode::row_group<T>(row, g, v);
    } else {
#pragma unroll
        for (int i = 0; i < GROUP_VALUES; ++i) v[i] = 0.0f;
    }
#pragma unroll
    for (int i = 0; i < GROUP_VALUES; ++i) o[i] = v[i];
}

template <ggml_type T> struct RowsToFloat {
    static void launch(const WeightRows & w, int64_t j0, int64_t n_rows, float * out, cudaStream_t stream) {
        const dim3 grid((unsigned) ((w.n_groups + GROUPS_PER_BLOCK - 1) / GROUPS_PER_BLOCK), (unsigned) n_rows);
        rows_to_float_kernel<T><<<grid, GROUPS_PER_BLOCK, 0, stream>>>(w, j0, out);
    }
};

// Each kernel template for the weight's type: the types of GGML_SI_FUSED_TYPES (row_decode.h).
template <template <ggml_type> class K, typename... A> void with_type(ggml_type type, A &&... args) {
    switch (type) {
#define SI_CASE(T) case GGML_TYPE_##T: K<GGML_TYPE_##T>::launch(std::forward<A>(args)...); break;
        GGML_SI_FUSED_TYPES(SI_CASE)
#undef SI_CASE
        default: GGML_ABORT("selectinfer CUDA: no kernel for weight type %s", ggml_type_name(type));
    }
}

static void mul_rows(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    const WeightRows w = weight_rows(dst);
    if (w.n == 0) return;
    with_type<MulRows>(dst->src[0]->type, w, dst->src[1], dst, ctx.stream());
}

// The F32 rows of one GEMM chunk: bounds the scratch at 64 MiB whatever the layer's width.
constexpr int64_t GEMM_CHUNK_FLOATS = 16 * 1024 * 1024;

static void mul_rows_t(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    const ggml_tensor * hs = dst->src[1];
    const WeightRows w = weight_rows(dst);
    const int64_t E = dst->ne[0], T = hs->ne[1];
    cudaStream_t stream = ctx.stream();
    if (w.n == 0) {
        CUDA_CHECK(cudaMemsetAsync(dst->data, 0, ggml_nbytes(dst), stream));
        return;
    }
    if (T == 1) {
        CUDA_CHECK(cudaMemsetAsync(dst->data, 0, E * sizeof(float), stream));
        const int n_sm = ggml_cuda_info().devices[ctx.device].nsm;
        const float * h_offset = dst->src[3] ? (const float *) dst->src[3]->data : nullptr;
        with_type<MulRowsTOneToken>(dst->src[0]->type, w, (const float *) hs->data, h_offset, (float *) dst->data, n_sm,
                                    stream);
        return;
    }
    // out [E, T] (column-major E x T) = W^T h: the gathered rows, row-major [n, E], are the
    // column-major E x n matrix; h [n, T] is column-major n x T
    const int64_t chunk_rows = std::min<int64_t>(std::min<int64_t>(w.n, 65535), std::max<int64_t>(1, GEMM_CHUNK_FLOATS / E));
    ggml_cuda_pool_alloc<float> rows(ctx.pool(), chunk_rows * E);
    cublasHandle_t handle = ctx.cublas_handle();
    const float one = 1.0f, zero = 0.0f;
    const int64_t h_ld = hs->nb[1] / sizeof(float), out_ld = dst->nb[1] / sizeof(float);
    for (int64_t j0 = 0; j0 < w.n; j0 += chunk_rows) {
        const int64_t n_rows = std::min(chunk_rows, w.n - j0);
        with_type<RowsToFloat>(dst->src[0]->type, w, j0, n_rows, rows.get(), stream);
        CUBLAS_CHECK(cublasSgemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, (int) E, (int) T, (int) n_rows, &one, rows.get(),
                                 (int) E, (const float *) hs->data + j0, (int) h_ld, j0 == 0 ? &zero : &one,
                                 (float *) dst->data, (int) out_ld));
    }
}

// --- selection: the top k of n keys, ties to the lower index -----------------------------------

constexpr int SELECT_THREADS = 1024;

// The exclusive count of the threads before this one whose flag is set, and the block's total.
static __device__ __forceinline__ int block_prefix_count(bool flag, int & total) {
    __shared__ int warp_counts[SELECT_THREADS / WARP_SIZE];
    const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE, n_warps = blockDim.x / WARP_SIZE;
    const unsigned ballot = __ballot_sync(0xffffffffu, flag);
    if (lane == 0) warp_counts[warp] = __popc(ballot);
    __syncthreads();
    int before = 0;
    total = 0;
    for (int i = 0; i < n_warps; ++i) {
        before += i < warp ? warp_counts[i] : 0;
        total += warp_counts[i];
    }
    __syncthreads();
    return before + __popc(ballot & ((1u << lane) - 1u));
}

// Calls take(i, place) for the k largest of keys key_at(0 .. n) (si_rule::order_bits), ties to the
// lower index, in ascending order of i, place counting from 0. Every thread of the block calls it.
template <typename KeyAt, typename Take> __device__ void block_top_k(KeyAt key_at, int64_t n, int64_t k, Take take) {
    __shared__ int hist[256];
    __shared__ int digit;
    __shared__ long long wanted_shared;
    if (k <= 0) return;
    // the k-th largest key, eight bits a pass (si_rule::kth_largest, in parallel)
    uint32_t prefix = 0, mask = 0;
    int64_t wanted = k;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int d = threadIdx.x; d < 256; d += blockDim.x) hist[d] = 0;
        __syncthreads();
        for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
            const uint32_t u = key_at(i);
            if ((u & mask) == prefix) atomicAdd(&hist[(u >> shift) & 255], 1);
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            int64_t left = wanted;
            digit = si_rule::next_digit(hist, left);
            wanted_shared = left;
        }
        __syncthreads();
        prefix |= (uint32_t) digit << shift;
        mask |= 255u << shift;
        wanted = wanted_shared;
        __syncthreads();
    }
    // everything above it, and the first `wanted` equal to it, in index order
    const uint32_t kth = prefix;
    int64_t equal_before = 0, taken_before = 0;
    for (int64_t c = 0; c < n; c += blockDim.x) {
        const int64_t i = c + threadIdx.x;
        const uint32_t u = i < n ? key_at(i) : 0;
        const bool above = i < n && u > kth, equal = i < n && u == kth;
        int n_equal, n_taken;
        const int equal_rank = block_prefix_count(equal, n_equal);
        const bool taken = above || (equal && equal_before + equal_rank < wanted);
        const int place = block_prefix_count(taken, n_taken);
        if (taken) take(i, taken_before + place);
        equal_before += n_equal;
        taken_before += n_taken;
    }
}

__global__ void count_positives_kernel(const float * act, int64_t stride, int64_t n_load, unsigned long long * total) {
    const float * a = act + (int64_t) blockIdx.x * stride;
    int positives = 0;
    for (int64_t i = threadIdx.x; i < n_load; i += blockDim.x) positives += si_rule::is_positive(a[i]);
    positives = warp_reduce_sum(positives);
    if (threadIdx.x % WARP_SIZE == 0) atomicAdd(total, (unsigned long long) positives);
}

__global__ void count_votes_kernel(const float * act, int64_t stride, int64_t n_load, int64_t n_tokens, float alpha,
                                   bool by_magnitude, const unsigned long long * positives, int * votes) {
    const float * a = act + (int64_t) blockIdx.x * stride;
    const int64_t k = si_rule::top_k(alpha, (int64_t) *positives, n_tokens, n_load);
    block_top_k([=](int64_t i) { return si_rule::order_bits(si_rule::rank_key(a[i], by_magnitude)); }, n_load, k,
                [=](int64_t i, int64_t) { atomicAdd(votes + i, 1); });
}

__global__ void count_finish_kernel(const float * prev, const int * votes, int64_t n_load, float * out) {
    const int64_t i = (int64_t) blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n_load) out[i] = (prev ? prev[i] : 0.0f) + (float) votes[i];
}

static void count(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    const ggml_tensor * act = dst->src[0];
    const ggml_tensor * prev = dst->src[1];
    const int64_t n_load = act->ne[0], T = act->ne[1];
    const float alpha = ggml_get_op_params_f32(dst, GGML_SI_COUNT_ALPHA);
    const bool by_magnitude = ggml_get_op_params_i32(dst, GGML_SI_COUNT_BY_MAGNITUDE) != 0;
    cudaStream_t stream = ctx.stream();
    ggml_cuda_pool_alloc<unsigned long long> positives(ctx.pool(), 1);
    ggml_cuda_pool_alloc<int> votes(ctx.pool(), n_load);
    CUDA_CHECK(cudaMemsetAsync(positives.get(), 0, sizeof(unsigned long long), stream));
    CUDA_CHECK(cudaMemsetAsync(votes.get(), 0, n_load * sizeof(int), stream));
    const int64_t stride = act->nb[1] / sizeof(float);
    if (T > 0) {
        count_positives_kernel<<<(unsigned) T, 256, 0, stream>>>((const float *) act->data, stride, n_load, positives.get());
        count_votes_kernel<<<(unsigned) T, SELECT_THREADS, 0, stream>>>((const float *) act->data, stride, n_load, T, alpha,
                                                                     by_magnitude, positives.get(), votes.get());
    }
    count_finish_kernel<<<(unsigned) ((n_load + 255) / 256), 256, 0, stream>>>(
        prev ? (const float *) prev->data : nullptr, votes.get(), n_load, (float *) dst->data);
}

__global__ void select_kernel(const float * counts, int64_t n_load, int n_static, int n_dynamic, int score,
                              const float * scale, int32_t * out) {
    for (int i = threadIdx.x; i < n_static; i += blockDim.x) out[i] = i;
    const float * candidates = counts + n_static;
    block_top_k([=](int64_t i) {
                    return si_rule::order_bits(si_rule::rank_key(si_rule::scaled_score(candidates[i], score, scale, i), false));
                },
                n_load - n_static, n_dynamic, [=](int64_t i, int64_t place) { out[n_static + place] = (int32_t) (n_static + i); });
}

static void select(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    const ggml_tensor * counts = dst->src[0];
    const int n_static = ggml_get_op_params_i32(dst, GGML_SI_SELECT_N_STATIC);
    const int n_dynamic = ggml_get_op_params_i32(dst, GGML_SI_SELECT_N_DYNAMIC);
    const int score = ggml_get_op_params_i32(dst, GGML_SI_SELECT_SCORE);
    const float * scale = dst->src[1] ? (const float *) dst->src[1]->data : nullptr;
    select_kernel<<<1, SELECT_THREADS, 0, ctx.stream()>>>((const float *) counts->data, counts->ne[0], n_static, n_dynamic,
                                                          score, scale, (int32_t *) dst->data);
}

}  // namespace

void ggml_si_cuda_compute_forward(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    switch (dst->op) {
        case GGML_OP_SI_MUL_ROWS:   mul_rows(ctx, dst);   break;
        case GGML_OP_SI_MUL_ROWS_T: mul_rows_t(ctx, dst); break;
        case GGML_OP_SI_COUNT:      count(ctx, dst);      break;
        case GGML_OP_SI_SELECT:     select(ctx, dst);     break;
        default: GGML_ABORT("selectinfer CUDA: %s is not one of selectinfer's ops", ggml_op_name(dst->op));
    }
}

bool ggml_si_cuda_supports_op(const ggml_tensor * op) {
    switch (op->op) {
        case GGML_OP_SI_MUL_ROWS:  // tokens along the grid's y (at most 65535)
            return ggml_si_has_fused_loop(op->src[0]->type) && op->src[0]->ne[0] % GROUP_VALUES == 0 &&
                   op->src[1]->ne[1] <= 65535;
        case GGML_OP_SI_MUL_ROWS_T:
            return ggml_si_has_fused_loop(op->src[0]->type) && op->src[0]->ne[0] % GROUP_VALUES == 0;
        case GGML_OP_SI_COUNT:  // activations in one tensor (the graph joins a prompt's two parts with a GPU present)
            return op->src[2] == nullptr;
        case GGML_OP_SI_SELECT:
            return true;
        default:
            return false;
    }
}
