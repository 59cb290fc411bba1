#include "hwmodels/catalog.hpp"

#include <filesystem>
#include <map>
#include <mutex>

#include "hwmodels/builtin.hpp"

namespace hbmsim {

std::vector<std::string> builtin_system_ids() {
  std::vector<std::string> ids;
  for (auto& f : builtin_files("systems/")) ids.push_back(f.substr(8, f.size() - 8 - 5));
  return ids;
}

System builtin_system(const std::string& id) {
  // Parsed once per process: sweeps resolve a system for every point.
  static std::mutex mu;
  static std::map<std::string, System> cache;
  std::lock_guard lock(mu);
  if (auto it = cache.find(id); it != cache.end()) return it->second;
  auto name = "systems/" + id + ".json";
  auto text = builtin_file(name);
  if (!text) {
    std::string known;
    for (auto& k : builtin_system_ids()) known += (known.empty() ? "" : ", ") + k;
    throw InputError("system = " + quote(id) + " (no such file or built-in system; built-ins: " + known + ")");
  }
  return cache[id] = load_system(parse_json_text(*text, "builtin:" + name), "builtin:" + name);
}

System resolve_system(const std::string& name_or_path) {
  std::error_code ec;
  if (name_or_path.find('/') != std::string::npos || name_or_path.ends_with(".json") ||
      std::filesystem::exists(name_or_path, ec))
    return load_system(parse_json_file(name_or_path), name_or_path);
  return builtin_system(name_or_path);
}

}  // namespace hbmsim
