#include "selection_settings.h"

#include <cmath>
#include <cstdlib>
#include <sstream>

namespace selectinfer {

const char * select_by_name(SelectBy by) {
    return by == SelectBy::magnitude ? "magnitude" : "value";
}

bool parse_setting(const std::string & text, Strategy & out) {
    const std::optional<Strategy> s = strategy_named(text);
    if (s) out = *s;
    return s.has_value();
}

bool parse_setting(const std::string & text, LayerBudgets & out) {
    const std::optional<LayerBudgets> b = layer_budgets_named(text);
    if (b) out = *b;
    return b.has_value();
}

bool parse_setting(const std::string & text, SelectBy & out) {
    for (SelectBy by : {SelectBy::value, SelectBy::magnitude}) {
        if (text == select_by_name(by)) {
            out = by;
            return true;
        }
    }
    return false;
}

bool parse_setting(const std::string & text, float & out) {
    if (text.empty()) return false;
    char * end = nullptr;
    const float x = std::strtof(text.c_str(), &end);
    if (*end != '\0' || !std::isfinite(x)) return false;
    out = x;
    return true;
}

bool parse_setting(const std::string & text, bool & out) {
    if (text != "0" && text != "1") return false;
    out = text == "1";
    return true;
}

std::string setting_values(Strategy) { return kStrategyNames; }
std::string setting_values(LayerBudgets) { return kLayerBudgetNames; }
std::string setting_values(SelectBy) { return "value or magnitude"; }
std::string setting_values(float) { return "a number"; }
std::string setting_values(bool) { return "0 or 1"; }

std::string setting_text(Strategy s) { return strategy_name(s); }
std::string setting_text(LayerBudgets b) { return layer_budgets_name(b); }
std::string setting_text(SelectBy by) { return select_by_name(by); }
std::string setting_text(bool b) { return b ? "1" : "0"; }
std::string setting_text(float x) {
    std::ostringstream out;
    out << x;
    return out.str();
}

bool SelectionOverrides::ask_for_selection() const {
    const SelectionConfig defaults;
    bool asks = false;
#define SI_ASKS(name, type, def, env, flag, help) asks = asks || (name && *name != defaults.name);
    SELECTINFER_SELECTION_SETTINGS(SI_ASKS)
#undef SI_ASKS
    return asks;
}

SelectionConfig SelectionOverrides::applied_to(SelectionConfig c) const {
#define SI_APPLY(name, type, def, env, flag, help) if (name) c.name = *name;
    SELECTINFER_SELECTION_SETTINGS(SI_APPLY)
#undef SI_APPLY
    return c;
}

SelectionOverrides SelectionOverrides::over(SelectionOverrides below) const {
#define SI_OVER(name, type, def, env, flag, help) if (name) below.name = name;
    SELECTINFER_SELECTION_SETTINGS(SI_OVER)
#undef SI_OVER
    return below;
}

SelectionOverrides SelectionOverrides::from_environment() {
    SelectionOverrides o;
#define SI_READ(name, type, def, env, flag, help)                   \
    if (const char * text = std::getenv(env); text && *text) {      \
        type value{};                                               \
        parse_setting_or_throw(env, text, value);                   \
        o.name = value;                                             \
    }
    SELECTINFER_SELECTION_SETTINGS(SI_READ)
#undef SI_READ
    return o;
}

}  // namespace selectinfer
