// The settings of selective computation: one table, from which come SelectionConfig's fields,
// SelectionOverrides' optional ones, the SELECTINFER_* environment reader, the Python bindings
// (Model's keywords) and selectinfer-cli's flags. A setting is added here and nowhere else
// (its effect aside).
#pragma once

#include "layer_budgets.h"
#include "selection_strategy.h"

#include <optional>
#include <stdexcept>
#include <string>

namespace selectinfer {

// How the frequency strategy ranks a token's neurons: by activation a, or by |a|.
enum class SelectBy { value, magnitude };

// X(field, type, default, environment variable, CLI flag, what it is)
//   strategy       how the computed neurons are chosen (selection_strategy.h)
//   compute_ratio  phi: the share of the original N a decode step computes per layer (uniform
//                  budgets), or on average at the same bytes (profile budgets); < 0: the file's
//   layer_budgets  how phi is shared out over the layers (layer_budgets.h)
//   token_ratio    alpha: a prompt token votes for its top round(alpha * positives) neurons; < 0: the file's
//   select_by      frequency: rank a token's neurons by value or by magnitude
//   dense          compute every loaded neuron (no selection); at load: the gathered rows load for
//                  upstream's matmul, which ggml may repack
//   coreinfer      CoreInfer mode: no static neurons, the prompt chooses all phi N (a gamma 1, delta 0 file)
//   compensate     gate-guided, predicted: add the dropped neurons' expected output (on by default in
//                  files with gate statistics)
#define SELECTINFER_SELECTION_SETTINGS(X)                                                                              \
    X(strategy, Strategy, Strategy::frequency, "SELECTINFER_STRATEGY", "--strategy",                                   \
      "how the computed neurons are chosen")                                                                           \
    X(compute_ratio, float, -1.0f, "SELECTINFER_COMPUTE_RATIO", "--compute-ratio",                                     \
      "phi: neurons a decode step computes, as a share of the original FFN width")                                     \
    X(layer_budgets, LayerBudgets, LayerBudgets::uniform, "SELECTINFER_LAYER_BUDGETS", "--layer-budgets",              \
      "how phi is shared out over the layers")                                                                         \
    X(token_ratio, float, -1.0f, "SELECTINFER_TOKEN_RATIO", "--token-ratio",                                           \
      "alpha: the share of a prompt token's positive neurons that vote (frequency)")                                   \
    X(select_by, SelectBy, SelectBy::value, "SELECTINFER_SELECT_BY", "--select-by",                                    \
      "rank a token's neurons by value or by magnitude (frequency)")                                                   \
    X(dense, bool, false, "SELECTINFER_DENSE", "--dense-ffn", "compute every loaded neuron, no selection")             \
    X(coreinfer, bool, false, "SELECTINFER_COREINFER", "--coreinfer",                                                  \
      "CoreInfer mode: the prompt chooses every computed neuron (a file without static neurons)")                      \
    X(compensate, bool, false, "SELECTINFER_COMPENSATE", "--compensate",                                               \
      "gate-guided, predicted: add the dropped neurons' expected output")

// How a SelectInfer model computes its FFN at decode (the file's defaults, then the
// SELECTINFER_* environment, then the caller's SelectionOverrides).
struct SelectionConfig {
#define SI_FIELD(name, type, def, env, flag, help) type name = def;
    SELECTINFER_SELECTION_SETTINGS(SI_FIELD)
#undef SI_FIELD
};

// Settings given explicitly; an unset one keeps the value it overrides. The environment is read
// into one (from_environment) and a program's own (Model(...), selectinfer-cli) applies after it.
struct SelectionOverrides {
#define SI_FIELD(name, type, def, env, flag, help) std::optional<type> name;
    SELECTINFER_SELECTION_SETTINGS(SI_FIELD)
#undef SI_FIELD

    // Whether these ask for selective computation at all (settings that only restate the default do not).
    bool ask_for_selection() const;
    SelectionConfig applied_to(SelectionConfig config) const;
    // These settings over `below`: each one set here wins.
    SelectionOverrides over(SelectionOverrides below) const;
    // Reads every setting's SELECTINFER_* variable (booleans 0 or 1); throws std::invalid_argument
    // naming a malformed variable and the values it takes.
    static SelectionOverrides from_environment();
};

// Each setting's value as text and back, for every kind the table holds: the environment, the CLI
// flags and the bindings all go through these. parse_setting returns false for text that is not a
// value (setting_values says which are).
const char * select_by_name(SelectBy by);
bool parse_setting(const std::string & text, Strategy & out);
bool parse_setting(const std::string & text, LayerBudgets & out);
bool parse_setting(const std::string & text, SelectBy & out);
bool parse_setting(const std::string & text, float & out);
bool parse_setting(const std::string & text, bool & out);
std::string setting_values(Strategy);      // "frequency, sum-magnitude, ..."
std::string setting_values(LayerBudgets);  // "uniform or profile"
std::string setting_values(SelectBy);      // "value or magnitude"
std::string setting_values(float);         // "a number"
std::string setting_values(bool);          // "0 or 1"
std::string setting_text(Strategy s);
std::string setting_text(LayerBudgets b);
std::string setting_text(SelectBy by);
std::string setting_text(float x);
std::string setting_text(bool b);

// Sets `out` from text, or throws std::invalid_argument "<where>='<text>': use <values>".
template <typename T> void parse_setting_or_throw(const std::string & where, const std::string & text, T & out) {
    if (!parse_setting(text, out)) {
        throw std::invalid_argument(where + "='" + text + "': use " + setting_values(T{}));
    }
}

}  // namespace selectinfer
