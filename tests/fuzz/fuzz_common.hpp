// Shared helpers for the libFuzzer harnesses: every harness feeds the fuzzed bytes to one hbmsim input
// loader and swallows hbmsim::InputError only. Anything else (another exception, a crash, a sanitizer
// report, a leak, a timeout, running out of memory) is a finding.
#pragma once
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

#include "hwmodels/json_view.hpp"

namespace fuzz {

inline std::string_view text(const std::uint8_t* data, std::size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

// A per-process scratch file for loaders that take a path (libFuzzer -jobs runs several processes).
inline std::string scratch_path(const std::string& name) {
  static const std::filesystem::path dir = [] {
    const char* tmp = std::getenv("TMPDIR");
    auto d = std::filesystem::path(tmp && *tmp ? tmp : "/tmp") / ("hbmsim-fuzz-" + std::to_string(::getpid()));
    std::filesystem::create_directories(d);
    return d;
  }();
  return (dir / name).string();
}

inline void write_file(const std::string& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) {
    std::fprintf(stderr, "fuzz harness: cannot write %s\n", path.c_str());
    std::abort();
  }
}

// A property that must hold for every input the loader accepted; a violation is a finding.
inline void require(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "fuzz harness: property violated: %s\n", what);
    std::abort();
  }
}

}  // namespace fuzz
