// `hbmsim validate` outputs: JSON, CSV and the Markdown report (docs/validation.md), and the texts they share.
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "planner/validation.hpp"

namespace hbmsim {

// "datasheet figures (no calibration)" or "calibration NAME".
std::string calibration_label(const std::string& calibration);
// "tp4 pp16 vp4 cp1 ep1 dp4" (and "fsdp64" when FSDP): the mapped layout, or the CSV's when not expressed.
std::string validation_layout(const ValidationRow& row);
// What the last column says: the reason a row is not expressed, "no measured tokens/s", remarks; "" otherwise.
std::string validation_note(const ValidationRow& row);
// The mapping rules, one Markdown bullet each (docs/validation.md).
const std::vector<std::string>& validation_rules();

nlohmann::json validation_json(const std::vector<ValidationRow>& rows, const ValidationSummary& summary,
                               const std::string& calibration, const std::string& origin);
std::string validation_csv(const std::vector<ValidationRow>& rows);
std::string validation_markdown(const std::vector<ValidationRow>& rows, const ValidationSummary& summary,
                                const std::string& calibration, const std::string& origin);

}  // namespace hbmsim
