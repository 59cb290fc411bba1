// Data files shipped with hbmsim (data/), compiled into the library so the binary and the Python module
// need no install path. Names are relative to data/, e.g. "systems/gb200-nvl72.json".
#pragma once
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace hbmsim {

std::optional<std::string_view> builtin_file(const std::string& name);
// Names under `prefix` (e.g. "systems/"), sorted.
std::vector<std::string> builtin_files(std::string_view prefix);

}  // namespace hbmsim
