// Strict, path-aware reading of JSON input: every error names the file, the JSON path and the value.
#pragma once
#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace hbmsim {

// Control characters (NUL, newline, ...) written as JSON escapes (\u0000, \n), so that a message stays one
// line and a C-string reader (what(), printf %s) sees all of it. Other bytes are kept as they are.
std::string escape_control_characters(std::string_view text);
// `text` as a double-quoted string for a message, control characters escaped: "a\u0000b".
std::string quote(std::string_view text);
// A number for a message: shortest round-trip form (1e-300, 0.5, 1e+15, nan), never std::to_string's
// fixed six decimals (which print 1e-300 as 0.000000).
std::string format_number(double value);
// A whole number for a message.
std::string str(std::int64_t value);
// `text` without the spaces and tabs at either end (a CSV cell, an item of a notes column).
std::string trim(const std::string& text);
// JSON text that never throws: bytes that are not UTF-8 (a path from the command line) become U+FFFD.
std::string dump_json(const nlohmann::json& value, int indent = -1);
// The first element equal to one before it, or the end: where a list of inputs names one thing twice.
template <class List>
auto first_repeat(const List& list) {
  for (auto i = list.begin(); i != list.end(); ++i)
    if (std::find(list.begin(), i, *i) != i) return i;
  return list.end();
}

// Bad user input. Carries a one-line message "FILE: PATH = VALUE (why)" (control characters escaped). Maps to
// exit status 2 in the CLI and to ValueError in Python.
class InputError : public std::invalid_argument {
 public:
  explicit InputError(const std::string& message) : std::invalid_argument(escape_control_characters(message)) {}
};

// Input files are read whole, so they must be regular files (not a directory, FIFO or device such as
// /dev/zero, which never ends) of at most `max_bytes`; checked before anything is read. `what` names the
// expected content for the messages ("a JSON file"). Returns the size.
std::uintmax_t require_regular_file(const std::string& path, std::uintmax_t max_bytes, std::string_view what);
// JSON inputs (systems, models, configs, profiles, measured runs) are kilobytes; 64 MiB is far above any.
inline constexpr std::uintmax_t kMaxJsonFileBytes = std::uintmax_t{64} << 20;

// Reads a whole file and parses it; a missing file, a directory, a device, a file above kMaxJsonFileBytes
// or malformed JSON is an InputError.
nlohmann::json parse_json_file(const std::string& path);
nlohmann::json parse_json_text(std::string_view text, const std::string& origin);

// Shortens a JSON value for error messages.
std::string describe_json_value(const nlohmann::json& value);

// Upper bounds for sourced hardware figures. Each is orders of magnitude above any part shipped or announced
// (HBM per GPU ~3e11 bytes, host memory per CPU ~2e12 bytes, HBM bandwidth ~1.3e13 B/s, dense FP4 peak
// ~3.5e16 FLOP/s, interconnect latency ~1e-6 s), so they only refuse typos and overflowed values (2^64
// bytes of HBM), never a real or future system.
inline constexpr double kMaxHardwareBytes = 1e15;            // 1 PB
inline constexpr double kMaxHardwareBytesPerSecond = 1e15;   // 1 PB/s
inline constexpr double kMaxHardwareFlopsPerSecond = 1e18;   // 1 EFLOP/s per GPU
inline constexpr double kMaxHardwareSeconds = 1;             // latencies and launch overheads
// A lower bound for rates (bytes/s, FLOP/s): below one per second a step's op times overflow (1 GB at 1e-300
// bytes/s is infinite) and the simulation cannot advance. Any real or what-if part is far above it.
inline constexpr double kMinHardwareRate = 1;
// The bounds' message for `v` in `unit` ("implausibly large, max 1e+15 bytes/s"); empty when within them.
std::string hardware_bounds_problem(double v, double max, std::string_view unit);

class JsonView {
 public:
  JsonView(const nlohmann::json& node, std::string origin, std::string path = "")
      : node_(&node), origin_(std::move(origin)), path_(std::move(path)) {}

  const nlohmann::json& raw() const { return *node_; }
  const std::string& origin() const { return origin_; }
  const std::string& path() const { return path_; }
  std::string where() const;

  [[noreturn]] void fail(std::string_view why) const;

  // Objects.
  void expect_object() const;
  // Every key must be one of `allowed`; the first other key is an error.
  void allow_only(std::initializer_list<std::string_view> allowed) const;
  void allow_only(const std::vector<std::string_view>& allowed) const;
  bool has(std::string_view key) const;
  JsonView at(std::string_view key) const;  // required key
  std::optional<JsonView> find(std::string_view key) const;

  // Arrays.
  void expect_array() const;
  std::size_t size() const;
  JsonView operator[](std::size_t index) const;

  // Scalars.
  double number() const;           // finite
  double positive() const;         // finite, > 0
  double non_negative() const;     // finite, >= 0
  double fraction() const;         // in (0, 1]
  std::int64_t integer() const;    // integral, within int64
  std::int64_t positive_integer() const;
  std::string string() const;
  bool boolean() const;

  // A hardware figure written as {"value": x, "source": "..."}: returns x (> 0 and <= max, and a rate at least
  // kMinHardwareRate), requires a source. `unit` names max's unit in the message ("bytes", "bytes/s").
  double sourced_positive(double max, std::string_view unit) const;
  // number() in (0, max] (a rate, `unit` ending in /s: in [kMinHardwareRate, max]).
  double positive_at_most(double max, std::string_view unit) const;

 private:
  const nlohmann::json* node_;
  std::string origin_;
  std::string path_;
};

}  // namespace hbmsim
