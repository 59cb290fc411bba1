#include "hwmodels/json_view.hpp"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

namespace hbmsim {

nlohmann::json parse_json_text(std::string_view text, const std::string& origin) {
  try {
    return nlohmann::json::parse(text.begin(), text.end());
  } catch (const nlohmann::json::exception& e) {  // parse errors, and numbers out of range (1e999)
    std::string what = e.what();
    // nlohmann prefixes "[json.exception.parse_error.101] "; keep the human part.
    auto pos = what.find("] ");
    throw InputError(origin + ": malformed JSON (" + (pos == std::string::npos ? what : what.substr(pos + 2)) +
                     ")");
  }
}

nlohmann::json parse_json_file(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::exists(path, ec)) throw InputError(path + ": file does not exist");
  if (fs::is_directory(path, ec)) throw InputError(path + ": is a directory, expected a JSON file");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(path + ": cannot be opened for reading");
  std::ostringstream buffer;
  buffer << in.rdbuf();
  return parse_json_text(buffer.str(), path);
}

std::string describe_json_value(const nlohmann::json& value) {
  std::string s = value.dump();
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s;
}

std::string JsonView::where() const { return origin_ + ": " + (path_.empty() ? std::string("(root)") : path_); }

void JsonView::fail(std::string_view why) const {
  throw InputError(where() + " = " + describe_json_value(*node_) + " (" + std::string(why) + ")");
}

void JsonView::expect_object() const {
  if (!node_->is_object()) fail("must be an object");
}

void JsonView::allow_only(std::initializer_list<std::string_view> allowed) const {
  expect_object();
  for (const auto& item : node_->items()) {
    bool known = false;
    for (auto a : allowed) known = known || (item.key() == a);
    if (!known) {
      std::string list;
      for (auto a : allowed) list += (list.empty() ? "" : ", ") + std::string(a);
      JsonView(item.value(), origin_, path_.empty() ? item.key() : path_ + "." + item.key())
          .fail("unknown key; allowed: " + list);
    }
  }
}

bool JsonView::has(std::string_view key) const { return node_->is_object() && node_->contains(key); }

JsonView JsonView::at(std::string_view key) const {
  expect_object();
  auto it = node_->find(key);
  std::string child = path_.empty() ? std::string(key) : path_ + "." + std::string(key);
  if (it == node_->end()) throw InputError(origin_ + ": " + child + " is missing (required)");
  return JsonView(*it, origin_, child);
}

std::optional<JsonView> JsonView::find(std::string_view key) const {
  expect_object();
  auto it = node_->find(key);
  if (it == node_->end()) return std::nullopt;
  return JsonView(*it, origin_, path_.empty() ? std::string(key) : path_ + "." + std::string(key));
}

void JsonView::expect_array() const {
  if (!node_->is_array()) fail("must be an array");
}

std::size_t JsonView::size() const {
  expect_array();
  return node_->size();
}

JsonView JsonView::operator[](std::size_t index) const {
  expect_array();
  return JsonView((*node_)[index], origin_, path_ + "[" + std::to_string(index) + "]");
}

double JsonView::number() const {
  if (!node_->is_number()) fail("must be a number");
  double v = node_->get<double>();
  if (!std::isfinite(v)) fail("must be finite");
  return v;
}

double JsonView::positive() const {
  double v = number();
  if (!(v > 0)) fail("must be > 0");
  return v;
}

double JsonView::non_negative() const {
  double v = number();
  if (v < 0) fail("must be >= 0");
  return v;
}

double JsonView::fraction() const {
  double v = number();
  if (!(v > 0 && v <= 1)) fail("must be in (0, 1]");
  return v;
}

std::int64_t JsonView::integer() const {
  if (node_->is_number_integer()) {
    if (node_->is_number_unsigned() &&
        node_->get<std::uint64_t>() > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
      fail("must be below 2^63");
    return node_->get<std::int64_t>();
  }
  if (node_->is_number_float()) {
    double v = node_->get<double>();
    if (!std::isfinite(v) || std::floor(v) != v) fail("must be an integer");
    if (std::fabs(v) >= 9.2e18) fail("must be below 2^63");
    return static_cast<std::int64_t>(v);
  }
  fail("must be an integer");
}

std::int64_t JsonView::positive_integer() const {
  auto v = integer();
  if (v <= 0) fail("must be > 0");
  return v;
}

std::string JsonView::string() const {
  if (!node_->is_string()) fail("must be a string");
  return node_->get<std::string>();
}

bool JsonView::boolean() const {
  if (!node_->is_boolean()) fail("must be true or false");
  return node_->get<bool>();
}

double JsonView::sourced_positive() const {
  allow_only({"value", "source", "note"});
  auto source = at("source").string();
  if (source.empty()) at("source").fail("must name a datasheet, measurement or estimate");
  return at("value").positive();
}

}  // namespace hbmsim
