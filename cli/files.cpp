#include "cli/files.hpp"

#include <filesystem>
#include <fstream>
#include <iterator>

#include "hwmodels/json_view.hpp"

namespace hbmsim::cli {

void write_file_atomically(const std::string& path, const std::string& text) {
  std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw InputError(path + ": cannot be written");
    out << text;
    out.flush();
    if (!out) throw InputError(path + ": write failed");
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) throw InputError(path + ": rename failed (" + ec.message() + ")");
}

void truncate_to_last_newline(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return;
  std::ifstream in(path, std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto last = text.find_last_of('\n');
  std::size_t keep = last == std::string::npos ? 0 : last + 1;
  if (keep != text.size()) std::filesystem::resize_file(path, keep, ec);
  if (ec) throw InputError(path + ": cannot be truncated (" + ec.message() + ")");
}

bool file_has_content(const std::string& path) {
  std::error_code ec;
  return std::filesystem::is_regular_file(path, ec) && std::filesystem::file_size(path, ec) > 0;
}

}  // namespace hbmsim::cli
