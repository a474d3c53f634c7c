#include "compensation.h"

#include "ggml-backend.h"
#include "ggml.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>

namespace selectinfer {

namespace {

constexpr int kGrid = 401;       // points of the standard normal's grid, on [-kZmax, kZmax]
constexpr double kZmax = 6.0;
constexpr int kBisections = 40;  // of theta: far below the grid's resolution

double activation_of(double x, GatedActivation activation) {
    if (activation == GatedActivation::gelu) {  // tanh GELU, as ggml_gelu
        return 0.5 * x * (1.0 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
    }
    return x / (1.0 + std::exp(-x));
}

}  // namespace

std::vector<float> dropped_means(const GateStats & stats, int64_t n_kept, GatedActivation activation) {
    const size_t n = stats.gate_rms.size();
    const bool with_means = !stats.gate_mean.empty() || !stats.up_mean.empty();
    const bool weighted = !stats.up_rms.empty();
    if (stats.up_slope.size() != n || (with_means && (stats.gate_mean.size() != n || stats.up_mean.size() != n)) ||
        (weighted && stats.up_rms.size() != n) || n_kept < 0 || n_kept > (int64_t) n) {
        throw std::invalid_argument("dropped_means: one slope (and mean, up rms) per neuron and 0 <= n_kept <= neurons");
    }
    // each neuron's gate g = mean + sd z, and E[u | g] = up_mean + slope (g - mean)
    std::vector<double> mean(n, 0.0), sd(n), up_mean(n, 0.0), slope(n);
    for (size_t j = 0; j < n; ++j) {
        const double square = (double) stats.gate_rms[j] * stats.gate_rms[j];
        if (with_means) {
            mean[j] = stats.gate_mean[j];
            up_mean[j] = stats.up_mean[j];
        }
        // (a spread under 1e-9 of the square is rounding: a constant gate, whose slope is moot)
        double variance = square - mean[j] * mean[j];
        if (variance <= 1e-9 * square) variance = 0.0;
        const double covariance = (double) stats.up_slope[j] * square - mean[j] * up_mean[j];
        sd[j] = std::sqrt(variance);
        slope[j] = variance > 0 ? covariance / variance : 0.0;
    }
    std::vector<double> z(kGrid), weight(kGrid);
    double total = 0;
    for (int i = 0; i < kGrid; ++i) {
        z[i] = -kZmax + 2 * kZmax * i / (kGrid - 1);
        weight[i] = std::exp(-0.5 * z[i] * z[i]);
        total += weight[i];
    }
    for (double & w : weight) w /= total;
    // each neuron's score on the grid, |act(gate)| (times up's rms), and its expected activation there
    std::vector<double> score(n * kGrid), moment(n * kGrid);
    double highest = 0;
    for (size_t j = 0; j < n; ++j) {
        const double scale = weighted ? (double) stats.up_rms[j] : 1.0;
        for (int i = 0; i < kGrid; ++i) {
            const double act = activation_of(mean[j] + sd[j] * z[i], activation);
            score[j * kGrid + i] = std::fabs(act) * scale;
            moment[j * kGrid + i] = act * (up_mean[j] + slope[j] * sd[j] * z[i]);
            highest = std::max(highest, score[j * kGrid + i]);
        }
    }
    // per neuron, its scores in ascending order and the grid weight at or above each
    std::vector<double> sorted(n * kGrid), above(n * kGrid + n);
    std::vector<int> order(kGrid);
    for (size_t j = 0; j < n; ++j) {
        for (int i = 0; i < kGrid; ++i) order[i] = i;
        const double * s = &score[j * kGrid];
        std::sort(order.begin(), order.end(), [s](int a, int b) { return s[a] < s[b]; });
        double * above_j = &above[j * (kGrid + 1)];
        above_j[kGrid] = 0;
        for (int i = kGrid - 1; i >= 0; --i) {
            sorted[j * kGrid + i] = s[order[i]];
            above_j[i] = above_j[i + 1] + weight[order[i]];
        }
    }
    auto expected_kept = [&](double theta) {
        double kept = 0;
        for (size_t j = 0; j < n; ++j) {
            const double * first = &sorted[j * kGrid];
            kept += above[j * (kGrid + 1) + (std::lower_bound(first, first + kGrid, theta) - first)];
        }
        return kept;
    };
    // the threshold that keeps n_kept neurons on average (the count falls as theta rises)
    double lo = 0, hi = highest * (1 + 1e-9) + 1e-30;
    if (n_kept == 0) lo = hi;
    for (int it = 0; it < kBisections && n_kept > 0; ++it) {
        const double mid = 0.5 * (lo + hi);
        (expected_kept(mid) > (double) n_kept ? lo : hi) = mid;
    }
    const double theta = 0.5 * (lo + hi);
    std::vector<float> nu(n, 0.0f);
    for (size_t j = 0; j < n; ++j) {
        double sum = 0, mass = 0;
        for (int i = 0; i < kGrid; ++i) {
            const size_t at = j * kGrid + i;
            if (score[at] < theta) {
                sum += weight[i] * moment[at];
                mass += weight[i];
            }
        }
        if (mass > 0) nu[j] = (float) (sum / mass);
    }
    return nu;
}

std::vector<float> down_rows_sum(const ggml_tensor * rows, const std::vector<float> & weights) {
    const int64_t n_per_row = rows->ne[0], n_rows = rows->ne[1];
    if ((int64_t) weights.size() != n_rows) throw std::invalid_argument("down_rows_sum: one weight per row");
    std::vector<uint8_t> bytes(ggml_nbytes(rows));
    ggml_backend_tensor_get(rows, bytes.data(), 0, bytes.size());
    const ggml_type_traits * traits = ggml_get_type_traits(rows->type);
    if (rows->type != GGML_TYPE_F32 && !traits->to_float) {
        throw std::invalid_argument(std::string("down_rows_sum: no conversion to float for ") + ggml_type_name(rows->type));
    }
    std::vector<float> row(n_per_row);
    std::vector<double> sum(n_per_row, 0.0);
    for (int64_t j = 0; j < n_rows; ++j) {
        if (weights[j] == 0.0f) continue;
        const uint8_t * data = bytes.data() + j * rows->nb[1];
        if (rows->type == GGML_TYPE_F32) {
            std::memcpy(row.data(), data, n_per_row * sizeof(float));
        } else {
            traits->to_float(data, row.data(), n_per_row);
        }
        for (int64_t i = 0; i < n_per_row; ++i) sum[i] += (double) weights[j] * row[i];
    }
    return std::vector<float>(sum.begin(), sum.end());
}

}  // namespace selectinfer
