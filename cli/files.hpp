// Output files that are never left half-written.
#pragma once
#include <string>

namespace hbmsim::cli {

// Refuses a path that cannot be written (a directory, a missing directory, no permission), before the work whose
// result goes there: a long fit or simulation must not end in nowhere to put it.
void check_writable(const std::string& path);
// Writes PATH.tmp, then renames it over PATH (PATH.tmp removed when that fails).
void write_file_atomically(const std::string& path, const std::string& text);
// Cuts a file back to its last newline (a torn last line from a killed writer); no-op when absent.
void truncate_to_last_newline(const std::string& path);
bool file_has_content(const std::string& path);

}  // namespace hbmsim::cli
