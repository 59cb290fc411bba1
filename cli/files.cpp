#include "cli/files.hpp"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "hwmodels/json_view.hpp"

namespace hbmsim::cli {

void check_writable(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) throw InputError(path + ": is a directory (expected a file path)");
  // The temporary file the write goes through, created and removed: its directory exists and takes files.
  const std::string tmp = path + ".tmp";
  const bool existed = std::filesystem::exists(tmp, ec);
  {
    std::ofstream probe(tmp, std::ios::binary | std::ios::app);
    if (!probe) throw InputError(path + ": cannot be written (" + std::strerror(errno) + ")");
  }
  if (!existed) std::filesystem::remove(tmp, ec);
}

void write_file_atomically(const std::string& path, const std::string& text) {
  check_writable(path);
  const std::string tmp = path + ".tmp";
  std::error_code ec;
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw InputError(path + ": cannot be written (" + std::strerror(errno) + ")");
    out << text;
    out.flush();
    if (!out) {
      out.close();
      std::filesystem::remove(tmp, ec);
      throw InputError(path + ": write failed");
    }
  }
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    const std::string why = ec.message();
    std::filesystem::remove(tmp, ec);  // nothing half-done left beside it
    throw InputError(path + ": cannot be replaced (" + why + ")");
  }
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
