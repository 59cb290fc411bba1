// Strict, path-aware reading of JSON input: every error names the file, the JSON path and the value.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace hbmsim {

// Bad user input. Carries a one-line message "FILE: PATH = VALUE (why)". Maps to exit status 2 in the
// CLI and to ValueError in Python.
class InputError : public std::invalid_argument {
 public:
  explicit InputError(const std::string& message) : std::invalid_argument(message) {}
};

// Reads a whole file and parses it; a missing file, a directory or malformed JSON is an InputError.
nlohmann::json parse_json_file(const std::string& path);
nlohmann::json parse_json_text(std::string_view text, const std::string& origin);

// Shortens a JSON value for error messages.
std::string describe_json_value(const nlohmann::json& value);

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

  // A hardware figure written as {"value": x, "source": "..."}: returns x (> 0), requires a source.
  double sourced_positive() const;

 private:
  const nlohmann::json* node_;
  std::string origin_;
  std::string path_;
};

}  // namespace hbmsim
