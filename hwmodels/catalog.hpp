// Finding systems by built-in id or file path, and applying calibration profiles.
#pragma once
#include <string>
#include <vector>

#include "hwmodels/system.hpp"

namespace hbmsim {

std::vector<std::string> builtin_system_ids();
System builtin_system(const std::string& id);
// An existing file path is loaded; otherwise the name must be a built-in id.
System resolve_system(const std::string& name_or_path);

}  // namespace hbmsim
