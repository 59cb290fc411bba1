// The run fields, once: JSON key, CLI flag, help, the check a value must pass, and where it lives in a
// RunConfig. RunConfig's set/to_json/from_json, the CLI's flags and help, and the Python field table all read
// this list, so a new field is one line here.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "hwmodels/json_view.hpp"
#include "planner/run_config.hpp"

namespace hbmsim {

enum class FieldCheck { none, positive, non_negative, fraction };

struct RunField {
  using Member = std::variant<std::string RunConfig::*, std::int64_t RunConfig::*, bool RunConfig::*,
                              double RunConfig::*, std::optional<double> RunConfig::*, Switch RunConfig::*>;
  std::string_view name;  // JSON key and sweep axis
  std::string_view flag;  // CLI flag
  std::string_view help;
  Member member;
  FieldCheck check = FieldCheck::none;

  std::string type() const;           // "text", "integer", "number", "on/off"
  std::string default_text() const;   // the value of a default RunConfig, as text ("" when unset)
  // Reads the field from command-line or axis text (its form only: ranges are checked when the run is
  // prepared, so a bad sweep point is a row with its error); `where` names the flag or axis in errors.
  void set(RunConfig& c, const std::string& text, const std::string& where) const;
  // Reads it from a JSON value (a bool field also takes "on"/"off"/"true"/"false", as the CLI does).
  void read(RunConfig& c, const JsonView& v) const;
  // Why the field's value in `c` is out of its range ("must be > 0"), as read() refuses it in JSON; "" when it is in.
  std::string range_problem(const RunConfig& c) const;
  // The value as JSON; nullopt for an optional field left unset. Whole numbers print as integers.
  std::optional<nlohmann::json> json(const RunConfig& c) const;
};

const std::vector<RunField>& run_fields();
const RunField* find_run_field(std::string_view name);
// The table for people: [{name, flag, type, default, help}, ...] (CLI `hbmsim fields`, Python field_table()),
// and as Markdown (docs/run-fields.md is this text, checked by a test).
nlohmann::json run_fields_json();
std::string run_fields_markdown();

// Text parsers shared with the CLI: errors name `where`.
std::int64_t parse_int_text(const std::string& v, const std::string& where);
double parse_double_text(const std::string& v, const std::string& where);
bool parse_bool_text(const std::string& v, const std::string& where);
// An on/off field that may follow the framework: on/off as parse_bool_text, or auto.
Switch parse_switch_text(const std::string& v, const std::string& where);

}  // namespace hbmsim
