// The published measured runs (data/reference/published_runs.csv): one training run per CSV row, as printed by
// its source. Only the reading is here; what a row means to hbmsim is planner/validation.hpp.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace hbmsim {

struct PublishedRun {
  int row = 0;  // 1-based data row (the header is not counted)
  std::string src, container, system, model, prec;
  std::int64_t gpus = 0, seq = 0, mbs = 0, gbs = 0;
  // Parallel degrees as printed: '-' means 1 and is read as 1. ep may carry "(ETPn)", the expert tensor
  // parallel degree (etp, 0 when not given).
  std::int64_t tp = 1, pp = 1, vp = 1, cp = 1, ep = 1, etp = 0;
  std::string dp_fsdp, remat_offload, notes;
  std::optional<double> tok_s_gpu, tflops_gpu, step_s;
};

// Tokens per second per GPU as measured: tok_s_gpu where the source prints it, else from its step time,
// gbs x seq / (step_s x gpus) (the dgxc-benchmarking READMEs print step time and total tokens/s, not tokens/s
// per GPU). Empty when the source gives neither.
std::optional<double> measured_tok_s_gpu(const PublishedRun& r);
// True when measured_tok_s_gpu comes from step_s.
bool tok_s_from_step_time(const PublishedRun& r);

// Parses the CSV text; `origin` names the file in errors. A missing column, or a cell that is not a number
// where one is expected, is bad input naming the file, the row, the column and the value.
std::vector<PublishedRun> parse_published_runs(const std::string& text, const std::string& origin);
// The file at `path`, or the built-in copy when `path` is empty.
std::vector<PublishedRun> load_published_runs(const std::string& path = "");
// "builtin:reference/published_runs.csv" or the path.
std::string published_runs_origin(const std::string& path);
// The runs whose data rows `rows` names ("46,48", "15-18", "1,15-18"; empty: all), in the file's order with the
// file's row numbers. A malformed list, a reversed range or a row the file lacks is bad input naming `rows`.
std::vector<PublishedRun> select_rows(const std::vector<PublishedRun>& runs, const std::string& rows);

}  // namespace hbmsim
