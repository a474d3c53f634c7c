// Dropped-neuron compensation for the strategies whose decode steps choose their own neurons
// (gate-guided, predicted). A step computes k of a layer's gathered neurons and drops the others,
// whose activations are small but not zero on average: their expected sum is a fixed vector per
// layer and k. The step adds it, and subtracts each computed neuron's share of it:
//
//     out = sum_{j computed} (a_j - nu_j) d_j + V,   V = sum_{j gathered} nu_j d_j
//
// with d_j the neuron's down projection and nu_j = E[a_j | j dropped]. nu comes from two numbers
// per neuron that the converter derives from the profile's FFN input moments C = E[h h^T]:
// the gate's root mean square s_j = sqrt(w_g C w_g^T) and the slope of up on gate,
// b_j = (w_g C w_u^T) / s_j^2. With the gate g_j ~ N(0, s_j^2) and E[u_j | g_j] = b_j g_j, a step
// drops the neurons with |act(g_j)| under one threshold theta, set so that k neurons are kept on
// average, and
//
//     nu_j = b_j E[act(g_j) g_j | |act(g_j)| < theta].
#pragma once

#include "si_gguf.h"

#include <cstdint>
#include <vector>

struct ggml_tensor;

namespace selectinfer {

// nu_j of each neuron given its gate_rms s_j and up_slope b_j, for steps that keep n_kept of them
// (0 <= n_kept <= n); expectations on a grid of the standard normal. n_kept = 0: every neuron dropped.
std::vector<float> dropped_means(const std::vector<float> & gate_rms, const std::vector<float> & up_slope,
                                 int64_t n_kept, GatedActivation activation);

// sum_j weights[j] * row j of `rows` (a 2-D weight tensor of any type ggml converts to float, on
// any backend: its bytes are copied to the host once), as floats [rows->ne[0]].
std::vector<float> down_rows_sum(const ggml_tensor * rows, const std::vector<float> & weights);

}  // namespace selectinfer
