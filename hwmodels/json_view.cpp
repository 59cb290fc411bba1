#include "hwmodels/json_view.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>
#include <vector>

namespace hbmsim {

std::string escape_control_characters(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char ch : text) {
    auto c = static_cast<unsigned char>(ch);
    if (c >= 0x20 && c != 0x7f) {
      out += ch;
      continue;
    }
    switch (c) {
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default: {
        char buf[8];
        std::snprintf(buf, sizeof buf, "\\u%04x", c);
        out += buf;
      }
    }
  }
  return out;
}

std::string str(std::int64_t value) { return std::to_string(value); }

std::string trim(const std::string& text) {
  const auto b = text.find_first_not_of(" \t");
  if (b == std::string::npos) return "";
  return text.substr(b, text.find_last_not_of(" \t") - b + 1);
}

std::string quote(std::string_view text) {
  std::string out = "\"";
  for (char ch : text) out += ch == '"' ? std::string("\\\"") : std::string(1, ch);
  return escape_control_characters(out + "\"");
}

std::string format_number(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, value);  // shortest round-trip form, locale-free
  return ec == std::errc() ? std::string(buf, end) : std::string("?");
}

std::string dump_json(const nlohmann::json& value, int indent) {
  return value.dump(indent, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::uintmax_t require_regular_file(const std::string& path, std::uintmax_t max_bytes, std::string_view what) {
  namespace fs = std::filesystem;
  std::error_code ec;
  auto status = fs::status(path, ec);
  if (!fs::exists(status)) throw InputError(path + ": file does not exist");
  if (fs::is_directory(status)) throw InputError(path + ": is a directory, expected " + std::string(what));
  if (!fs::is_regular_file(status))
    throw InputError(path + ": is not a regular file (a device, pipe or socket), expected " + std::string(what));
  auto size = fs::file_size(path, ec);
  if (ec) throw InputError(path + ": cannot be read (" + ec.message() + ")");
  if (size > max_bytes)
    throw InputError(path + ": is " + std::to_string(size) + " bytes, above the " + std::to_string(max_bytes >> 20) +
                     " MiB limit for " + std::string(what));
  return size;
}

namespace {

// Where the parser is, as JsonView names paths (a.b[2].c), to name a key an object repeats: nlohmann keeps the last
// value of a repeated key, so {"batch": 1, "batch": 4} would run batch 4 without a word.
class KeyTracker {
 public:
  explicit KeyTracker(const std::string& origin) : origin_(origin) {}

  bool operator()(int /*depth*/, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    using E = nlohmann::json::parse_event_t;
    switch (event) {
      case E::object_start:
      case E::array_start:
        element_starts();
        frames_.push_back(Frame{event == E::object_start, {}, {}, 0});
        break;
      case E::object_end:
      case E::array_end:
        frames_.pop_back();
        break;
      case E::key: {
        Frame& f = frames_.back();
        f.key = parsed.get<std::string>();
        if (!f.keys.insert(f.key).second)
          throw InputError(origin_ + ": " + path() + " (the key is given twice in one object; only the last value would be read)");
        break;
      }
      case E::value:
        element_starts();
        break;
    }
    return true;
  }

 private:
  struct Frame {
    bool object;
    std::set<std::string> keys;
    std::string key;      // an object's current key
    std::size_t count;    // an array's elements so far
  };
  void element_starts() {
    if (!frames_.empty() && !frames_.back().object) ++frames_.back().count;
  }
  std::string path() const {
    std::string out;
    for (const Frame& f : frames_)
      out += f.object ? (out.empty() ? f.key : "." + f.key) : "[" + std::to_string(f.count - 1) + "]";
    return out;
  }
  const std::string& origin_;
  std::vector<Frame> frames_;
};

}  // namespace

nlohmann::json parse_json_text(std::string_view text, const std::string& origin) {
  try {
    return nlohmann::json::parse(text.begin(), text.end(), KeyTracker(origin));
  } catch (const nlohmann::json::exception& e) {  // parse errors, and numbers out of range (1e999)
    std::string what = e.what();
    // nlohmann prefixes "[json.exception.parse_error.101] "; keep the human part.
    auto pos = what.find("] ");
    throw InputError(origin + ": malformed JSON (" + (pos == std::string::npos ? what : what.substr(pos + 2)) +
                     ")");
  }
}

nlohmann::json parse_json_file(const std::string& path) {
  auto size = require_regular_file(path, kMaxJsonFileBytes, "a JSON file");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(path + ": cannot be opened for reading");
  // Read one byte more than the size checked: a file that grew since then is refused, never read on.
  std::string text(static_cast<std::size_t>(size) + 1, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  if (in.bad()) throw InputError(path + ": read failed");
  text.resize(static_cast<std::size_t>(in.gcount()));
  if (text.size() > size) throw InputError(path + ": changed while being read");
  return parse_json_text(text, path);
}

std::string describe_json_value(const nlohmann::json& value) {
  std::string s = dump_json(value);
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
  allow_only(std::vector<std::string_view>(allowed));
}

namespace {

// Edits (insert, delete, replace, case ignored) from a to b: a misspelt key is named with its likely meaning.
std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diagonal = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const bool same = std::tolower(static_cast<unsigned char>(a[i - 1])) == std::tolower(static_cast<unsigned char>(b[j - 1]));
      const std::size_t next = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (same ? 0 : 1)});
      diagonal = row[j];
      row[j] = next;
    }
  }
  return row[b.size()];
}

// The allowed key nearest to `key`, if one is within a third of its length (at least 1 edit, at most 3).
std::string_view nearest_key(std::string_view key, const std::vector<std::string_view>& allowed) {
  std::string_view best;
  std::size_t best_distance = std::clamp<std::size_t>(key.size() / 3, 1, 3) + 1;
  for (auto a : allowed)
    if (const std::size_t d = edit_distance(key, a); d < best_distance) {
      best = a;
      best_distance = d;
    }
  return best;
}

}  // namespace

void JsonView::allow_only(const std::vector<std::string_view>& allowed) const {
  expect_object();
  for (const auto& item : node_->items()) {
    bool known = false;
    for (auto a : allowed) known = known || (item.key() == a);
    if (!known) {
      std::string list;
      for (auto a : allowed) list += (list.empty() ? "" : ", ") + std::string(a);
      const std::string_view near = nearest_key(item.key(), allowed);
      JsonView(item.value(), origin_, path_.empty() ? item.key() : path_ + "." + item.key())
          .fail(near.empty() ? "unknown key; allowed: " + list : "unknown key: did you mean " + std::string(near) + "? Allowed: " + list);
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

std::string hardware_bounds_problem(double v, double max, std::string_view unit) {
  if (v > max) return "implausibly large, max " + format_number(max) + " " + std::string(unit);
  const bool rate = unit.size() >= 2 && unit.substr(unit.size() - 2) == "/s";
  if (rate && v < kMinHardwareRate) return "implausibly small, min " + format_number(kMinHardwareRate) + " " + std::string(unit);
  return "";
}

double JsonView::positive_at_most(double max, std::string_view unit) const {
  double v = positive();
  if (const std::string why = hardware_bounds_problem(v, max, unit); !why.empty()) fail(why);
  return v;
}

double JsonView::sourced_positive(double max, std::string_view unit) const {
  allow_only({"value", "source", "note"});
  auto source = at("source").string();
  if (source.empty()) at("source").fail("must name a datasheet, measurement or estimate");
  return at("value").positive_at_most(max, unit);
}

}  // namespace hbmsim
