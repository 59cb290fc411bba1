#include "cli/format.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "hwmodels/json_view.hpp"

namespace hbmsim::cli {

bool stderr_is_terminal() { return isatty(fileno(stderr)) != 0; }

bool progress_wanted(const std::string& progress) {
  if (progress != "auto" && progress != "on" && progress != "off")
    throw InputError("--progress = " + quote(progress) + " (expected auto, on or off)");
  return progress == "on" || (progress == "auto" && stderr_is_terminal());
}

std::string Table::render() const {
  std::vector<std::size_t> w(header.size(), 0);
  for (std::size_t i = 0; i < header.size(); ++i) w[i] = header[i].size();
  for (auto& r : rows)
    for (std::size_t i = 0; i < r.size() && i < w.size(); ++i) w[i] = std::max(w[i], r[i].size());
  const auto prose = [&](std::size_t i) { return text_last && i + 1 == w.size(); };
  auto line = [&](const std::vector<std::string>& cells) {
    std::string out;
    for (std::size_t i = 0; i < w.size(); ++i) {
      std::string c = i < cells.size() ? cells[i] : "";
      // Left-align the first column (names) and a prose last one, right-align the rest (numbers).
      if (i == 0 || prose(i)) out += c + std::string(w[i] - c.size(), ' ');
      else out += std::string(w[i] - c.size(), ' ') + c;
      if (i + 1 < w.size()) out += "  ";
    }
    while (!out.empty() && out.back() == ' ') out.pop_back();
    return out + "\n";
  };
  std::string out = line(header);
  std::size_t total = 0;
  for (std::size_t i = 0; i < w.size(); ++i) total += (prose(i) ? header[i].size() : w[i]) + 2;
  out += std::string(total > 2 ? total - 2 : 0, '-') + "\n";
  for (auto& r : rows) out += line(r);
  return out;
}

std::string fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

std::string gib(double bytes, int digits) { return fixed(bytes / 1073741824.0, digits); }

}  // namespace hbmsim::cli
