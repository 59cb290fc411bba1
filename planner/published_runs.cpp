#include "planner/published_runs.hpp"

#include <fstream>
#include <map>
#include <sstream>

#include "hwmodels/builtin.hpp"
#include "hwmodels/json_view.hpp"
#include "planner/run_fields.hpp"

namespace hbmsim {

namespace {

constexpr const char* kBuiltin = "reference/published_runs.csv";

// RFC 4180 records: fields split on commas, double-quoted fields may hold commas, quotes ("") and newlines.
std::vector<std::vector<std::string>> csv_records(const std::string& text) {
  std::vector<std::vector<std::string>> out;
  std::vector<std::string> rec;
  std::string field;
  bool quoted = false, any = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char ch = text[i];
    if (quoted) {
      if (ch == '"' && i + 1 < text.size() && text[i + 1] == '"') field += '"', ++i;
      else if (ch == '"') quoted = false;
      else field += ch;
    } else if (ch == '"') {
      quoted = any = true;
    } else if (ch == ',') {
      rec.push_back(std::move(field));
      field.clear();
      any = true;
    } else if (ch == '\n' || ch == '\r') {
      if (ch == '\r' && i + 1 < text.size() && text[i + 1] == '\n') ++i;
      if (any || !field.empty()) rec.push_back(std::move(field));
      if (!rec.empty()) out.push_back(std::move(rec));
      rec.clear();
      field.clear();
      any = false;
    } else {
      field += ch;
      any = true;
    }
  }
  if (any || !field.empty()) rec.push_back(std::move(field));
  if (!rec.empty()) out.push_back(std::move(rec));
  return out;
}

class RowReader {
 public:
  RowReader(const std::string& origin, int row, const std::map<std::string, std::size_t>& cols, const std::vector<std::string>& cells)
      : origin_(origin), row_(row), cols_(cols), cells_(cells) {}
  std::string text(const std::string& col) const {
    auto it = cols_.find(col);
    if (it == cols_.end() || it->second >= cells_.size()) return "";
    return trim(cells_[it->second]);
  }
  [[noreturn]] void fail(const std::string& col, const std::string& value, const std::string& why) const {
    throw InputError(origin_ + ": row " + std::to_string(row_) + ", column " + col + " = " + quote(value) + " (" + why + ")");
  }
  std::int64_t integer(const std::string& col) const {
    auto v = text(col);
    std::int64_t n = 0;
    try {
      n = parse_int_text(v, col);
    } catch (const InputError&) {
      fail(col, v, v.empty() ? "empty; expected a whole number" : "expected a whole number");
    }
    if (n <= 0) fail(col, v, "must be > 0");
    return n;
  }
  // A parallel degree: '-' or empty is 1.
  std::int64_t degree(const std::string& col) const {
    auto v = text(col);
    if (v == "-" || v.empty()) return 1;
    return integer(col);
  }
  std::optional<double> number(const std::string& col) const {
    auto v = text(col);
    if (v.empty() || v == "-") return std::nullopt;
    double d = 0;
    try {
      d = parse_double_text(v, col);
    } catch (const InputError&) {
      fail(col, v, "expected a number");
    }
    if (!(d > 0)) fail(col, v, "must be > 0");
    return d;
  }

 private:
  const std::string& origin_;
  int row_;
  const std::map<std::string, std::size_t>& cols_;
  const std::vector<std::string>& cells_;
};

}  // namespace

std::string published_runs_origin(const std::string& path) { return path.empty() ? std::string("builtin:") + kBuiltin : path; }

std::vector<PublishedRun> parse_published_runs(const std::string& text, const std::string& origin) {
  auto records = csv_records(text);
  if (records.empty()) throw InputError(origin + ": empty (expected a header line and one row per run)");
  std::map<std::string, std::size_t> cols;
  for (std::size_t i = 0; i < records[0].size(); ++i) cols[trim(records[0][i])] = i;
  for (const char* need : {"src", "container", "system", "gpus", "model", "prec", "seq", "mbs", "gbs", "tp", "pp", "vp", "cp",
                           "ep", "dp_fsdp", "remat_offload", "tok_s_gpu", "tflops_gpu", "step_s", "notes"})
    if (!cols.count(need)) throw InputError(origin + ": missing column " + quote(need) + " in the header line");
  std::vector<PublishedRun> out;
  for (std::size_t r = 1; r < records.size(); ++r) {
    const int row = static_cast<int>(r);
    RowReader in(origin, row, cols, records[r]);
    if (records[r].size() != records[0].size())
      throw InputError(origin + ": row " + std::to_string(row) + " has " + std::to_string(records[r].size()) + " cells; the header has " +
                       std::to_string(records[0].size()));
    PublishedRun p;
    p.row = row;
    p.src = in.text("src");
    p.container = in.text("container");
    p.system = in.text("system");
    p.model = in.text("model");
    p.prec = in.text("prec");
    p.gpus = in.integer("gpus");
    p.seq = in.integer("seq");
    p.mbs = in.integer("mbs");
    p.gbs = in.integer("gbs");
    p.tp = in.degree("tp");
    p.pp = in.degree("pp");
    p.vp = in.degree("vp");
    p.cp = in.degree("cp");
    // ep: "32" or "32 (ETP1)".
    auto ep = in.text("ep");
    if (auto paren = ep.find('('); paren != std::string::npos) {
      auto inner = trim(ep.substr(paren + 1));
      if (inner.rfind("ETP", 0) != 0 || inner.back() != ')') in.fail("ep", ep, "expected a whole number, optionally with (ETPn)");
      try {
        p.etp = parse_int_text(trim(inner.substr(3, inner.size() - 4)), "ep");
      } catch (const InputError&) {
        in.fail("ep", ep, "expected a whole number, optionally with (ETPn)");
      }
      if (p.etp <= 0) in.fail("ep", ep, "ETP must be > 0");
      ep = trim(ep.substr(0, paren));
    }
    if (ep == "-" || ep.empty()) p.ep = 1;
    else {
      try {
        p.ep = parse_int_text(ep, "ep");
      } catch (const InputError&) {
        in.fail("ep", in.text("ep"), "expected a whole number, optionally with (ETPn)");
      }
      if (p.ep <= 0) in.fail("ep", in.text("ep"), "must be > 0");
    }
    p.dp_fsdp = in.text("dp_fsdp");
    p.remat_offload = in.text("remat_offload");
    p.notes = in.text("notes");
    p.tok_s_gpu = in.number("tok_s_gpu");
    p.tflops_gpu = in.number("tflops_gpu");
    p.step_s = in.number("step_s");
    out.push_back(std::move(p));
  }
  return out;
}

bool tok_s_from_step_time(const PublishedRun& r) { return !r.tok_s_gpu && r.step_s && *r.step_s > 0; }

std::optional<double> measured_tok_s_gpu(const PublishedRun& r) {
  if (r.tok_s_gpu) return r.tok_s_gpu;
  if (!tok_s_from_step_time(r)) return std::nullopt;
  return static_cast<double>(r.gbs) * static_cast<double>(r.seq) / (*r.step_s * static_cast<double>(r.gpus));
}

std::vector<PublishedRun> load_published_runs(const std::string& path) {
  if (path.empty()) {
    auto text = builtin_file(kBuiltin);
    if (!text) throw std::logic_error(std::string("missing built-in ") + kBuiltin);
    return parse_published_runs(std::string(*text), published_runs_origin(path));
  }
  std::ifstream f(path, std::ios::binary);
  if (!f) throw InputError(path + ": cannot be read");
  std::ostringstream ss;
  ss << f.rdbuf();
  return parse_published_runs(ss.str(), path);
}

std::vector<PublishedRun> select_rows(const std::vector<PublishedRun>& runs, const std::string& rows) {
  if (rows.empty()) return runs;
  const std::string field = "rows = " + quote(rows);
  const std::string malformed = field + " (expected data row numbers and ranges, such as 46,48 or 15-18)";
  if (rows.back() == ',') throw InputError(malformed);  // getline drops a trailing empty item
  const int last = runs.empty() ? 0 : runs.back().row;
  auto number = [&](const std::string& s) {
    if (s.empty() || s.size() > 6 || s.find_first_not_of("0123456789") != std::string::npos) throw InputError(malformed);
    const int n = std::stoi(s);
    if (n < 1 || n > last) throw InputError(field + " (row " + s + ": the runs file has rows 1-" + std::to_string(last) + ")");
    return n;
  };
  std::vector<bool> wanted(static_cast<std::size_t>(last) + 1, false);
  std::stringstream list(rows);
  for (std::string item; std::getline(list, item, ',');) {
    const auto dash = item.find('-');
    const int first = number(item.substr(0, dash)), end = dash == std::string::npos ? first : number(item.substr(dash + 1));
    if (end < first) throw InputError(field + " (range " + item + ": the first row is after the last)");
    for (int r = first; r <= end; ++r) wanted[static_cast<std::size_t>(r)] = true;
  }
  std::vector<PublishedRun> out;
  for (const auto& r : runs)
    if (wanted[static_cast<std::size_t>(r.row)]) out.push_back(r);
  return out;
}

}  // namespace hbmsim
