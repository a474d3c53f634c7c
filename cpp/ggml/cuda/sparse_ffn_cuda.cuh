// CUDA kernels of selectinfer's ops (step 3, selective computation on NVIDIA GPUs), compiled into
// ggml-cuda and called from its dispatch (ggml-patches/0007-cuda-sparse-ffn-ops.patch).
#pragma once

#include "ggml.h"

struct ggml_backend_cuda_context;

// Computes dst, one of GGML_OP_SI_MUL_ROWS, _ROWS_T, _COUNT, _SELECT, on ctx's stream.
void ggml_si_cuda_compute_forward(ggml_backend_cuda_context & ctx, ggml_tensor * dst);

// Whether the CUDA kernels take this node: the row ops for the weight types of
// GGML_SI_FUSED_TYPES with rows of whole 32-value groups; the selection ops always.
bool ggml_si_cuda_supports_op(const ggml_tensor * op);
