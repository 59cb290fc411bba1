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

// A per-process scratch file for loaders that take a path (libFuzzer -jobs runs several processes). It lives
// in $HBMSIM_FUZZ_TMPDIR, else /dev/shm (a file write per input on a disk costs 4x the executions), else
// $TMPDIR or /tmp, and is removed at exit.
inline std::string scratch_path(const std::string& name) {
  namespace fs = std::filesystem;
  static const fs::path dir = [] {
    std::error_code ec;
    fs::path base = "/tmp";
    if (const char* t = std::getenv("TMPDIR"); t && *t) base = t;
    if (fs::is_directory("/dev/shm", ec) && ::access("/dev/shm", W_OK) == 0) base = "/dev/shm";
    if (const char* t = std::getenv("HBMSIM_FUZZ_TMPDIR"); t && *t) base = t;
    auto d = base / ("hbmsim-fuzz-" + std::to_string(::getpid()));
    fs::create_directories(d);
    static fs::path cleanup = d;
    std::atexit([] {
      std::error_code e;
      fs::remove_all(cleanup, e);
    });
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
