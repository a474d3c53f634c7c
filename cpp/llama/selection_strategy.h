// The selection strategies by name: one definition for the file's key, the environment,
// Model(...), the CLI and the op parameters (the names are defined in neuron_selection.cpp).
#pragma once

#include <optional>
#include <string>

namespace selectinfer {

// How the neurons a decode step computes (besides the static ones) are chosen:
//   frequency      by the prompt, the method's: the neurons most often among a token's top k (alpha)
//   sum_magnitude  by the prompt: the largest sum over its tokens of |a|
//   fixed          no choice: the best-ranked loaded neurons (stored first), the same for every prompt
//   gate_guided    by each decode step: gate over every loaded neuron, then up and down only for
//                  the ones with the largest |act(gate)| (no prompt choice)
//   predicted      by each decode step: the file's low-rank gate predictor scores every loaded
//                  neuron, then gate, up and down only for the ones with the largest |act(score)|
enum class Strategy { frequency, sum_magnitude, fixed, gate_guided, predicted };
constexpr Strategy kStrategies[] = {Strategy::frequency, Strategy::sum_magnitude, Strategy::fixed, Strategy::gate_guided,
                                    Strategy::predicted};
const char * strategy_name(Strategy strategy);  // "frequency", "sum-magnitude", "fixed", "gate-guided", "predicted"
std::optional<Strategy> strategy_named(const std::string & name);
extern const char * const kStrategyNames;       // "frequency, sum-magnitude, fixed, gate-guided or predicted"
// Whether the prompt chooses the neurons (frequency, sum_magnitude).
inline bool prompt_chooses(Strategy s) { return s == Strategy::frequency || s == Strategy::sum_magnitude; }
// Whether each decode step chooses its own neurons (gate_guided, predicted).
inline bool step_chooses(Strategy s) { return s == Strategy::gate_guided || s == Strategy::predicted; }

}  // namespace selectinfer
