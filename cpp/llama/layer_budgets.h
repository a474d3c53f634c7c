// Per-layer budgets: how many neurons each SelectInfer layer computes at a decode step.
//
// uniform  every layer computes round(phi * N) neurons (the method's), within [n_min, n_load];
// profile  the same weight bytes in all, shared out by the profile: each layer's loaded neurons
//          carry their share of the layer's profiled activation mass (selectinfer.neuron_shares.N,
//          largest first), and the budget goes, one neuron at a time, to the layer whose next
//          neuron holds the largest share per byte read. A layer whose mass is spread over many
//          neurons gets more of them than one whose mass sits in a few: the sum over layers of
//          the mass shares kept is the largest the bytes allow (the shares fall in each layer,
//          so the greedy choice is the best one).
//
// One definition for the engine (neuron_selection.cpp) and for the bytes-read count of the
// benchmarks (python/selectinfer/evaluation/bench.py, through the bindings).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace selectinfer {

enum class LayerBudgets { uniform, profile };
const char * layer_budgets_name(LayerBudgets budgets);          // "uniform", "profile"
std::optional<LayerBudgets> layer_budgets_named(const std::string & name);
extern const char * const kLayerBudgetNames;                    // "uniform or profile"

// One SelectInfer layer as the budgets see it.
struct LayerBudgetInput {
    int64_t n_load = 0;         // loaded neurons: the most it computes
    int64_t n_min = 1;          // the fewest it computes (its static neurons, and at least one)
    double neuron_bytes = 1;    // weight bytes a decode step reads per computed neuron
    std::vector<float> shares;  // profile: each loaded neuron's share of the layer's mass, largest first
};

// The neurons each layer computes at compute ratio phi (a fraction of n_original), in the order
// given. profile needs every layer's shares (n_load of them); its layers together read at most the
// bytes the uniform sizes read.
std::vector<int64_t> layer_budget_sizes(const std::vector<LayerBudgetInput> & layers, float compute_ratio,
                                        int64_t n_original, LayerBudgets budgets);

}  // namespace selectinfer
