// Sweeps as data: axes over RunConfig fields, Cartesian product, an optional filter, run on a thread pool,
// rows streamed as they finish. A row whose config is bad input carries its error instead of a report.
#pragma once
#include <cstddef>
#include <functional>
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

struct SweepRow {
  std::size_t index = 0;
  std::vector<std::string> values;
  std::optional<StepReport> report;
  std::string error;  // bad input for this point (exit-2 class), empty when report is set
};

// A worker-thread count (--jobs): between 1 and 1024; `flag` names it in the message.
void check_jobs(int jobs, const std::string& flag = "--jobs");

// Runs every point not in `skip` on `jobs` threads and calls `on_row` once per finished point, one call at a
// time (never concurrently), in completion order.
void run_sweep(const std::vector<SweepPoint>& points, int jobs, const std::function<void(const SweepRow&)>& on_row,
               const std::set<std::size_t>& skip = {});

// Row formats: CSV (header + one line per row) and JSON lines. Both start with "index" and the axis values.
std::vector<std::string> sweep_columns(const std::vector<SweepAxis>& axes);
std::string sweep_csv_header(const std::vector<SweepAxis>& axes);
std::string sweep_csv_line(const SweepRow& row);
nlohmann::json sweep_row_json(const std::vector<SweepAxis>& axes, const SweepRow& row);

// Indices already present in a CSV or JSON-lines output written by a killed sweep (complete lines only).
std::set<std::size_t> completed_indices(const std::string& path);

}  // namespace hbmsim
