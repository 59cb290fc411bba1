#include "planner/sweep.hpp"

#include <algorithm>
#include <atomic>
#include <charconv>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>

#include "hwmodels/json_view.hpp"
#include "planner/run_fields.hpp"
#include "planner/worker_pool.hpp"

namespace hbmsim {

SweepAxis parse_axis(const std::string& spec) {
  auto eq = spec.find('=');
  if (eq == std::string::npos || eq == 0 || eq + 1 == spec.size())
    throw InputError("--axis " + spec + " (expected FIELD=v1,v2,...)");
  SweepAxis a{spec.substr(0, eq), {}};
  std::stringstream ss(spec.substr(eq + 1));
  std::string v;
  while (std::getline(ss, v, ',')) {
    if (v.empty()) throw InputError("--axis " + spec + " (empty value)");
    a.values.push_back(v);
  }
  RunConfig probe;
  probe.set(a.field, a.values.front(), "--axis " + spec);  // unknown fields fail here, before any work
  return a;
}

std::string config_id(const RunConfig& config) {
  std::uint64_t h = 1469598103934665603ull;  // FNV-1a offset basis
  for (unsigned char ch : dump_json(config.to_json())) {  // bytes that are not UTF-8 replaced, never thrown
    h ^= ch;
    h *= 1099511628211ull;  // FNV prime
  }
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

namespace {

// Most points one sweep may have (the product of the axes' lengths).
constexpr std::size_t kMaxSweepPoints = 1'000'000;

struct Condition {
  std::string field, op, value;
  bool ordering() const { return op != "==" && op != "!="; }
};

// The whole text as a finite number ("1x" is not 1), read as a flag's number is; nullopt otherwise.
std::optional<double> number(const std::string& text) {
  try {
    return parse_double_text(text, "");
  } catch (const InputError&) {
    return std::nullopt;
  }
}

std::vector<Condition> parse_where(const std::string& where, const std::vector<SweepAxis>& axes) {
  std::vector<Condition> out;
  std::stringstream ss(where);
  std::string part;
  while (std::getline(ss, part, ',')) {
    if (part.empty()) continue;
    static const char* ops[] = {"==", "!=", "<=", ">=", "<", ">"};
    Condition c;
    for (const char* op : ops) {
      auto pos = part.find(op);
      if (pos != std::string::npos && pos > 0) {
        c = {part.substr(0, pos), op, part.substr(pos + std::string(op).size())};
        break;
      }
    }
    if (c.op.empty()) throw InputError("--where " + part + " (expected FIELD==V, FIELD!=V, FIELD<N, ...)");
    bool known = false;
    for (auto& a : axes) known = known || a.field == c.field;
    if (!known) throw InputError("--where " + part + " (\"" + c.field + "\" is not an axis)");
    if (c.value.empty()) throw InputError("--where " + part + " (no value after " + c.op + ")");
    if (c.ordering() && !number(c.value))
      throw InputError("--where " + part + " (" + c.op + " compares numbers; \"" + c.value + "\" is not one)");
    out.push_back(c);
  }
  return out;
}

bool holds(const Condition& c, const std::string& value) {
  if (c.op == "==") return value == c.value;
  if (c.op == "!=") return value != c.value;
  const auto a = number(value);
  if (!a)
    throw InputError("--where " + c.field + c.op + c.value + " (" + c.op + " compares numbers; the axis value \"" + value +
                     "\" is not one)");
  const double b = *number(c.value);  // checked by parse_where
  if (c.op == "<=") return *a <= b;
  if (c.op == ">=") return *a >= b;
  if (c.op == "<") return *a < b;
  return *a > b;
}

std::string csv_escape(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string out = "\"";
  for (char ch : s) out += ch == '"' ? std::string("\"\"") : std::string(1, ch);
  return out + "\"";
}

std::string num(double v) {
  char buf[64];
  auto [p, ec] = std::to_chars(buf, buf + sizeof buf, v);  // shortest round-trip form, locale-free
  return std::string(buf, p);
}

}  // namespace

std::vector<SweepPoint> expand_sweep(const RunConfig& base, const std::vector<SweepAxis>& axes, const std::string& where) {
  auto conds = parse_where(where, axes);
  std::size_t total = 1;
  std::string shape;
  for (auto& a : axes) {
    if (a.values.empty()) throw InputError("--axis " + a.field + " (no values)");
    // A field given twice would set each point twice, the later axis winning: rows that repeat one another.
    for (const SweepAxis* b = axes.data(); b != &a; ++b)
      if (b->field == a.field)
        throw InputError("--axis " + a.field + " (given twice; put all its values in one axis: " + a.field + "=v1,v2,...)");
    // A value given twice, in any spelling (1 and 1.0, on and true), would run its points twice.
    std::map<std::string, const std::string*> seen;  // config id -> the value that made it
    for (const std::string& v : a.values) {
      RunConfig probe = base;
      probe.set(a.field, v, "--axis " + a.field);
      if (const auto [same, fresh] = seen.emplace(config_id(probe), &v); !fresh)
        throw InputError("--axis " + a.field + "=" + v + " (the same value as " + *same->second +
                         ", given before it: its points would run twice)");
    }
    total *= a.values.size();
    shape += (shape.empty() ? "" : " x ") + std::to_string(a.values.size());
    // Every point (a RunConfig) is held in memory before the sweep runs, and a million simulations already
    // take minutes to hours; the product is checked before the --where filter, which visits every point.
    if (total > kMaxSweepPoints)
      throw InputError("--axis: the sweep has more than " + std::to_string(kMaxSweepPoints) + " points (" + shape +
                       (&a == &axes.back() ? "" : " x ...") + "); narrow the axes or split the sweep into several runs");
  }
  std::vector<SweepPoint> points;
  for (std::size_t i = 0; i < total; ++i) {
    SweepPoint p{i, {}, base};
    std::size_t rest = i;
    p.values.resize(axes.size());
    for (std::size_t k = axes.size(); k-- > 0;) {
      p.values[k] = axes[k].values[rest % axes[k].values.size()];
      rest /= axes[k].values.size();
    }
    bool keep = true;
    for (auto& c : conds)
      for (std::size_t k = 0; k < axes.size(); ++k)
        if (axes[k].field == c.field) keep = keep && holds(c, p.values[k]);
    if (!keep) continue;
    for (std::size_t k = 0; k < axes.size(); ++k) p.config.set(axes[k].field, p.values[k], "--axis " + axes[k].field);
    points.push_back(std::move(p));
  }
  return points;
}

void check_jobs(int jobs, const std::string& flag) {
  constexpr int kMaxJobs = 1024;
  if (jobs < 1) throw InputError(flag + " = " + std::to_string(jobs) + " (must be >= 1)");
  if (jobs > kMaxJobs) throw InputError(flag + " = " + std::to_string(jobs) + " (at most " + std::to_string(kMaxJobs) + " threads)");
}

void parallel_for(std::size_t n, int jobs, const std::function<void(std::size_t)>& work) {
  std::vector<std::exception_ptr> errors(n);
  std::atomic<std::size_t> next{0};
  auto worker = [&] {
    for (std::size_t i; (i = next++) < n;) {
      try {
        work(i);
      } catch (...) {
        errors[i] = std::current_exception();
      }
    }
  };
  run_on_threads(static_cast<int>(std::min<std::size_t>(static_cast<std::size_t>(jobs), n)) - 1, worker);  // no items: none
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

void run_sweep(const std::vector<SweepPoint>& points, int jobs, const std::function<void(const SweepRow&)>& on_row,
               const std::set<std::size_t>& skip, const std::function<StepReport(const RunConfig&)>& simulate) {
  check_jobs(jobs);
  std::atomic<std::size_t> next{0};
  std::mutex emit;
  std::exception_ptr failure;
  auto worker = [&] {
    for (;;) {
      std::size_t i = next.fetch_add(1);
      if (i >= points.size()) return;
      const auto& p = points[i];
      if (skip.count(p.index)) continue;
      SweepRow row{p.index, config_id(p.config), p.values, std::nullopt, ""};
      try {
        row.report = simulate ? simulate(p.config) : run_simulation(p.config);
      } catch (const InputError& e) {
        row.error = e.what();
      } catch (...) {
        std::lock_guard lock(emit);
        if (!failure) failure = std::current_exception();
        next = points.size();
        return;
      }
      std::lock_guard lock(emit);
      if (failure) return;
      try {
        on_row(row);  // may throw (a write error, a row that cannot be formatted): end the sweep, never the process
      } catch (...) {
        failure = std::current_exception();
        next = points.size();
        return;
      }
    }
  };
  run_on_threads(jobs - 1, worker);
  if (failure) std::rethrow_exception(failure);
}

std::vector<std::string> sweep_columns(const std::vector<SweepAxis>& axes) {
  std::vector<std::string> cols = {"index"};
  for (auto& a : axes) cols.push_back(a.field);
  for (auto c : {"step_time_s", "tflops_per_device", "mfu", "tokens_per_s_per_device", "fits", "hbm_peak_bytes",
                 "host_peak_bytes"})
    cols.push_back(c);
  for (const auto& q : report_queues())
    if (q != "compute") cols.push_back("exposed_" + q + "_s");
  for (const auto& phase : report_phases()) cols.push_back("compute_" + phase + "_s");
  cols.push_back("error");
  cols.push_back("config_id");
  return cols;
}

std::string sweep_csv_header(const std::vector<SweepAxis>& axes) {
  std::string out;
  for (auto& c : sweep_columns(axes)) {
    if (!out.empty()) out += ',';
    out += csv_escape(c);
  }
  return out + "\n";
}

std::string sweep_csv_line(const SweepRow& row) {
  std::string out = std::to_string(row.index);
  for (auto& v : row.values) {
    out += ',';
    out += csv_escape(v);
  }
  if (row.report) {
    const auto& r = *row.report;
    for (double v : {r.step_time_s, r.tflops_per_device, r.mfu, r.tokens_per_s_per_device}) {
      out += ',';
      out += num(v);
    }
    out += r.fits ? ",true" : ",false";
    for (double v : {r.hbm_peak_bytes, r.host_peak_bytes}) {
      out += ',';
      out += num(v);
    }
    for (const auto& q : report_queues())
      if (q != "compute") out += "," + num(r.exposed_s.at(q));
    for (const auto& phase : report_phases()) out += "," + num(r.compute_s.at(phase));
    out += ",";
  } else {
    out += std::string(sweep_columns({}).size() - 2, ',');  // every report column empty, then the error
    out += csv_escape(row.error);
  }
  return out + "," + row.config_id + "\n";
}

namespace {

// A row as a JSON object (keys sorted in nlohmann::json, in column order in nlohmann::ordered_json).
template <class Json>
Json row_object(const std::vector<SweepAxis>& axes, const SweepRow& row) {
  Json j = {{"index", row.index}};
  for (std::size_t k = 0; k < axes.size(); ++k) j[axes[k].field] = row.values[k];
  if (row.report) j["result"] = row.report->to_json();
  else j["error"] = row.error;
  j["config_id"] = row.config_id;
  return j;
}

// A header's axis names (the columns between "index" and the first report column) and its report columns.
void read_csv_header(const std::string& header, SweepFile& f) {
  std::vector<std::string> cols;
  std::stringstream ss(header);
  std::string c;
  while (std::getline(ss, c, ',')) cols.push_back(c);
  std::size_t k = 1;
  for (; k < cols.size() && cols[k] != "step_time_s"; ++k) f.axes.push_back(cols[k]);
  f.foreign = cols.empty() || cols[0] != "index" || k == cols.size();
  f.report_columns.assign(cols.begin() + static_cast<std::ptrdiff_t>(std::min(k, cols.size())), cols.end());
}

}  // namespace

nlohmann::json sweep_row_json(const std::vector<SweepAxis>& axes, const SweepRow& row) {
  return row_object<nlohmann::json>(axes, row);
}

std::string sweep_jsonl_line(const std::vector<SweepAxis>& axes, const SweepRow& row) {
  return row_object<nlohmann::ordered_json>(axes, row).dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n";
}

SweepFile read_sweep_file(const std::string& path) {
  SweepFile f;
  std::ifstream in(path, std::ios::binary);
  if (!in) return f;
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  bool csv_has_ids = false, first = true;
  std::size_t start = 0;
  while (start < text.size()) {
    auto end = text.find('\n', start);
    if (end == std::string::npos) break;  // a torn last line is not a finished row
    std::string line = text.substr(start, end - start);
    start = end + 1;
    if (line.empty()) continue;
    if (line.front() == '{') {
      nlohmann::ordered_json j;  // keys in the order written: the axes' order
      try {
        j = nlohmann::ordered_json::parse(line);
      } catch (const std::exception&) {
        continue;
      }
      if (!j.is_object()) continue;
      f.format = "jsonl";
      if (f.rows++ == 0)
        for (auto& item : j.items())
          if (item.key() != "index" && item.key() != "result" && item.key() != "error" && item.key() != "config_id")
            f.axes.push_back(item.key());
      auto id = j.find("config_id");
      auto index = j.find("index");
      if (id != j.end() && id->is_string() && index != j.end() && index->is_number_unsigned())
        f.index_by_id[id->get<std::string>()] = index->get<std::size_t>();
      else
        ++f.rows_without_id;
    } else if (first && !std::isdigit(static_cast<unsigned char>(line.front()))) {
      read_csv_header(line, f);
      f.format = "csv";
      csv_has_ids = line.size() >= 10 && line.compare(line.size() - 10, 10, ",config_id") == 0;
    } else {
      f.foreign = f.foreign || first;  // rows with no header above them
      ++f.rows;
      const auto comma = line.rfind(',');
      std::size_t index = 0;
      auto [p, ec] = std::from_chars(line.data(), line.data() + line.size(), index);
      if (csv_has_ids && comma != std::string::npos && ec == std::errc() && *p == ',')
        f.index_by_id[line.substr(comma + 1)] = index;
      else
        ++f.rows_without_id;
    }
    first = false;
  }
  return f;
}

std::set<std::size_t> resume_skip(const std::string& path, const SweepFile& file, const std::vector<SweepAxis>& axes,
                                  const std::vector<SweepPoint>& points) {
  auto names = [](const std::vector<std::string>& v) {
    std::string s;
    for (auto& x : v) s += (s.empty() ? "" : ", ") + x;
    return s.empty() ? std::string("none") : s;
  };
  if (file.foreign)
    throw InputError(path + ": not a sweep's output (a sweep's CSV starts with its header, index, the axes, step_time_s, ...; "
                     "its JSON lines are objects); write to a new --out, or run without --resume to overwrite it");
  std::vector<std::string> ours;
  for (auto& a : axes) ours.push_back(a.field);
  if (file.rows > 0 && ours != file.axes)
    throw InputError(path + ": written by a sweep over the axes " + names(file.axes) + ", not " + names(ours) +
                     "; resume with the same axes, or write to a new --out");
  if (file.rows_without_id > 0)
    throw InputError(path + ": " + std::to_string(file.rows_without_id) +
                     " rows have no config_id (written by an older hbmsim), so they cannot be matched to this "
                     "sweep's points; run it again without --resume");
  // Rows appended under another header would not line up with it (a file from an hbmsim with other columns).
  if (file.format == "csv") {
    const auto cols = sweep_columns({});
    const std::vector<std::string> report(cols.begin() + 1, cols.end());
    if (file.report_columns != report)
      throw InputError(path + ": its report columns are " + names(file.report_columns) + ", not " + names(report) +
                       " (written by another hbmsim version); run it again without --resume, or write to a new --out");
  }
  std::map<std::string, std::size_t> index_of;
  for (auto& p : points) index_of[config_id(p.config)] = p.index;
  std::set<std::size_t> skip;
  for (auto& [id, index] : file.index_by_id) {
    auto it = index_of.find(id);
    if (it == index_of.end() || it->second != index)
      throw InputError(path + ": row " + std::to_string(index) + " (config_id " + id + ") is not point " +
                       std::to_string(index) + " of this sweep: the base configuration, the axis values or --where "
                       "differ from the run that wrote the file; resume with the same ones, or write to a new --out");
    skip.insert(index);
  }
  return skip;
}

}  // namespace hbmsim
