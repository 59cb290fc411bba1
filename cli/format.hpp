// Plain-text tables for the terminal.
#pragma once
#include <string>
#include <vector>

namespace hbmsim::cli {

struct Table {
  std::vector<std::string> header;
  std::vector<std::vector<std::string>> rows;
  // The last column is prose (a reason, a meaning, a note): left-aligned and not padded to its longest cell,
  // so that one long sentence does not widen every other row.
  bool text_last = false;
  std::string render() const;
};

std::string fixed(double v, int digits);
std::string gib(double bytes, int digits = 1);
// Progress lines go to stderr only when a person watches it (--progress auto).
bool stderr_is_terminal();
// --progress of a long command (sweep, plan layout): auto, on or off.
inline constexpr const char* kProgressHelp = "auto (when stderr is a terminal), on, off";
// Whether that command prints progress lines; an InputError for a value other than auto, on or off.
bool progress_wanted(const std::string& progress);

}  // namespace hbmsim::cli
