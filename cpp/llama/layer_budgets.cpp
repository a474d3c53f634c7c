#include "layer_budgets.h"

#include <algorithm>
#include <cmath>
#include <queue>
#include <stdexcept>

namespace selectinfer {

const char * const kLayerBudgetNames = "uniform or profile";

const char * layer_budgets_name(LayerBudgets budgets) {
    return budgets == LayerBudgets::profile ? "profile" : "uniform";
}

std::optional<LayerBudgets> layer_budgets_named(const std::string & name) {
    if (name == "uniform") return LayerBudgets::uniform;
    if (name == "profile") return LayerBudgets::profile;
    return std::nullopt;
}

namespace {

int64_t uniform_size(const LayerBudgetInput & l, float compute_ratio, int64_t n_original) {
    const int64_t wanted = std::lround(compute_ratio * (float) n_original);  // float32, as files state phi
    return std::max(std::min(l.n_min, l.n_load), std::min(l.n_load, wanted));
}

// The next neuron a layer could take: its share per byte.
struct Candidate {
    double share_per_byte;
    size_t layer;
    bool operator<(const Candidate & o) const {  // the queue's top: the largest, then the first layer
        return share_per_byte != o.share_per_byte ? share_per_byte < o.share_per_byte : layer > o.layer;
    }
};

}  // namespace

std::vector<int64_t> layer_budget_sizes(const std::vector<LayerBudgetInput> & layers, float compute_ratio,
                                        int64_t n_original, LayerBudgets budgets) {
    std::vector<int64_t> sizes;
    double budget_bytes = 0;
    for (const LayerBudgetInput & l : layers) {
        sizes.push_back(uniform_size(l, compute_ratio, n_original));
        budget_bytes += (double) sizes.back() * l.neuron_bytes;
    }
    if (budgets == LayerBudgets::uniform) return sizes;

    std::priority_queue<Candidate> next;
    double spent_bytes = 0;
    for (size_t i = 0; i < layers.size(); ++i) {
        const LayerBudgetInput & l = layers[i];
        if ((int64_t) l.shares.size() != l.n_load) {
            throw std::invalid_argument("per-layer budgets need each layer's neuron shares (the file's profile)");
        }
        sizes[i] = std::min(l.n_min, l.n_load);
        spent_bytes += (double) sizes[i] * l.neuron_bytes;
        if (sizes[i] < l.n_load) next.push({l.shares[sizes[i]] / l.neuron_bytes, i});
    }
    const double slack = 1e-9 * budget_bytes;  // the sums above in another order
    while (!next.empty()) {
        const size_t i = next.top().layer;
        next.pop();
        const LayerBudgetInput & l = layers[i];
        // a layer whose next neuron does not fit is done: its later ones cost as much, and spent only grows
        if (spent_bytes + l.neuron_bytes > budget_bytes + slack) continue;
        spent_bytes += l.neuron_bytes;
        if (++sizes[i] < l.n_load) next.push({l.shares[sizes[i]] / l.neuron_bytes, i});
    }
    return sizes;
}

}  // namespace selectinfer
