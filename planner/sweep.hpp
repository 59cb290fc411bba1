// Sweeps as data: axes over RunConfig fields, Cartesian product, an optional filter, run on a thread pool,
// rows streamed as they finish. A row whose config is bad input carries its error instead of a report.
#pragma once
#include <cstddef>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "planner/run_config.hpp"

namespace hbmsim {

struct SweepAxis {
  std::string field;  // a RunConfig field, or tensor.NAME
  std::vector<std::string> values;
};

// "batch=1,2,4" -> {batch, [1, 2, 4]}; errors name the axis.
SweepAxis parse_axis(const std::string& spec);

struct SweepPoint {
  std::size_t index = 0;          // position in the Cartesian product (stable across runs)
  std::vector<std::string> values;  // one per axis
  RunConfig config;
};

// Expands the product in row-major order (last axis fastest). `where` keeps points for which it holds:
// comma-separated conditions FIELD==V, FIELD!=V, FIELD<=N, FIELD>=N, FIELD<N, FIELD>N over axis fields.
std::vector<SweepPoint> expand_sweep(const RunConfig& base, const std::vector<SweepAxis>& axes,
                                     const std::string& where = "");

// A point's identity whatever the axis order or spelling ("lhs=on" and "lhs=true" are one point): a
// 64-bit FNV-1a hash of its resolved config's JSON, as 16 hex digits. Rows carry it so --resume matches by it.
std::string config_id(const RunConfig& config);

struct SweepRow {
  std::size_t index = 0;
  std::string config_id;
  std::vector<std::string> values;
  std::optional<StepReport> report;
  std::string error;  // bad input for this point (exit-2 class), empty when report is set
};

// A worker-thread count (--jobs): between 1 and 1024; `flag` names it in the message.
void check_jobs(int jobs, const std::string& flag = "--jobs");

// Runs every point not in `skip` on `jobs` threads and calls `on_row` once per finished point, one call at a
// time (never concurrently), in completion order.
// Calls work(i) for every i in [0, n) on up to `jobs` threads (this one included); after all have finished,
// rethrows the exception of the lowest i that threw, if any.
void parallel_for(std::size_t n, int jobs, const std::function<void(std::size_t)>& work);

// `simulate`: how a point is run (empty: run_simulation; a search may stop runs that cannot fit early).
void run_sweep(const std::vector<SweepPoint>& points, int jobs, const std::function<void(const SweepRow&)>& on_row,
               const std::set<std::size_t>& skip = {}, const std::function<StepReport(const RunConfig&)>& simulate = {});

// Row formats: CSV (header + one line per row) and JSON lines. Both start with "index" and the axis values.
std::vector<std::string> sweep_columns(const std::vector<SweepAxis>& axes);
std::string sweep_csv_header(const std::vector<SweepAxis>& axes);
std::string sweep_csv_line(const SweepRow& row);
nlohmann::json sweep_row_json(const std::vector<SweepAxis>& axes, const SweepRow& row);
// One JSON-lines row with its keys in column order (index, the axes, result or error, config_id), so that a
// resume reads the axis order back.
std::string sweep_jsonl_line(const std::vector<SweepAxis>& axes, const SweepRow& row);

// What a killed sweep left in its output (CSV or JSON lines; complete lines only): its axes in column
// order, and the config_id and index of every finished row (a file written before rows had ids has none).
struct SweepFile {
  std::string format;  // "csv" or "jsonl" ("" for an empty file)
  std::vector<std::string> axes;
  std::vector<std::string> report_columns;  // csv: the header's columns after the axes
  std::map<std::string, std::size_t> index_by_id;  // config_id -> the row's index
  std::size_t rows = 0;
  std::size_t rows_without_id = 0;
  bool foreign = false;  // lines that are not a sweep's: a CSV without its header (index, the axes, step_time_s, ...)
};
SweepFile read_sweep_file(const std::string& path);

// The points of `points` still to run after `file`, or an InputError naming `path` when the file is not an
// earlier run of this same sweep: other axes, or a row that is not the point of this sweep at its index
// (another base configuration, other axis values, another --where). `axes` must be in the file's order.
std::set<std::size_t> resume_skip(const std::string& path, const SweepFile& file, const std::vector<SweepAxis>& axes,
                                  const std::vector<SweepPoint>& points);

}  // namespace hbmsim
