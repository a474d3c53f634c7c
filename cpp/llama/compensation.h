// Dropped-neuron compensation for the strategies whose decode steps choose their own neurons
// (gate-guided, predicted). A step computes k of a layer's gathered neurons and drops the others,
// whose activations are small but not zero on average: their expected sum is a fixed vector per
// layer and k. The step adds it, and subtracts each computed neuron's share of it:
//
//     out = sum_{j computed} (a_j - nu_j) d_j + V,   V = sum_{j gathered} nu_j d_j
//
// with d_j the neuron's down projection and nu_j = E[a_j | j dropped]. nu comes from numbers per
// neuron that the converter derives from the profile's FFN input moments C = E[h h^T] and, where
// the profile has them, means m = E[h]: the gate's root mean square sqrt(w_g C w_g^T), up's slope
// on the gate (w_g C w_u^T) / (w_g C w_g^T), and the means mu_g = w_g m, mu_u = w_u m (else 0).
// With the gate g_j ~ N(mu_g, sigma_j^2), sigma_j^2 = E[g^2] - mu_g^2, and E[u_j | g_j] =
// mu_u + b_j (g_j - mu_g), b_j = Cov(g, u) / sigma_j^2, a step drops the neurons whose score
// |act(g_j)| (times up's root mean square r_j where the file has it: the step's own score) is
// under one threshold theta, set so that k neurons are kept on average, and
//
//     nu_j = E[act(g_j) (mu_u + b_j (g_j - mu_g)) | |act(g_j)| r_j < theta].
//
// The gate's mean matters: the residual stream's FFN inputs are not centered, and on SmolLM2 the
// zero-mean model's nu are about half those measured on calibration text (0.89-1.08x with means).
#pragma once

#include "si_gguf.h"

#include <cstdint>
#include <vector>

struct ggml_tensor;

namespace selectinfer {

// nu_j of each neuron of `stats` for steps that keep n_kept of them (0 <= n_kept <= n);
// expectations on a grid of the standard normal. n_kept = 0: every neuron dropped.
std::vector<float> dropped_means(const GateStats & stats, int64_t n_kept, GatedActivation activation);

// sum_j weights[j] * row j of `rows` (a 2-D weight tensor of any type ggml converts to float, on
// any backend: its bytes are copied to the host once), as floats [rows->ne[0]].
std::vector<float> down_rows_sum(const ggml_tensor * rows, const std::vector<float> & weights);

}  // namespace selectinfer
