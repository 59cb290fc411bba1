// The accuracy the README states is the accuracy the code has: the reproduce tables and the claims table in
// README.md are read back and compared with a fresh reproduction, datasheet and fitted. A change that moves
// a prediction by more than 0.5% fails here until the README is updated in the same commit.
#include <catch2/catch.hpp>

#include <cmath>
#include <fstream>
#include <map>
#include <sstream>

#include "planner/reproduce.hpp"

using namespace hbmsim;

namespace {

std::string readme() {
  std::ifstream in(std::string(HBMSIM_SOURCE_DIR) + "/README.md");
  REQUIRE(in);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

std::vector<std::string> words(const std::string& line) {
  std::istringstream ss(line);
  std::vector<std::string> w;
  for (std::string x; ss >> x;) w.push_back(x);
  return w;
}

// One row of a printed reproduce table, read from the right (the policy column holds spaces).
struct PrintedRow {
  std::string predicted_tflops, predicted_hbm, predicted_host, fits;
};

// The reproduce table in the first fenced block after `marker`: run id -> its predicted columns.
std::map<std::string, PrintedRow> printed_table(const std::string& text, const std::string& marker) {
  auto at = text.find(marker);
  REQUIRE(at != std::string::npos);
  auto open = text.find("```\n", at);
  auto close = text.find("```", open + 4);
  REQUIRE(close != std::string::npos);
  std::istringstream block(text.substr(open + 4, close - open - 4));
  std::map<std::string, PrintedRow> rows;
  for (std::string line; std::getline(block, line);) {
    auto w = words(line);
    if (w.size() < 14 || w[0] == "run" || w[0].front() == '-') continue;
    const std::size_t n = w.size();
    // ... TFLOP/s rep, pred, err, HBM rep, pred, err, host rep, pred, fits rep, pred
    rows[w[0]] = {w[n - 9], w[n - 6], w[n - 3], w[n - 1]};
  }
  return rows;
}

// "909.7" must be `value` within 0.5% plus half its last printed digit; "-" means not printed.
void check_figure(const std::string& printed, double value, const std::string& what) {
  INFO(what << ": README " << printed << ", now " << value);
  REQUIRE(printed != "-");
  const double p = std::stod(printed);
  const auto dot = printed.find('.');
  const double half_digit = dot == std::string::npos ? 0.5 : 0.5 * std::pow(10.0, -double(printed.size() - dot - 1));
  CHECK(std::fabs(value - p) <= 0.005 * std::fabs(p) + half_digit);
}

void check_table(const std::string& marker, const std::string& calibration) {
  const auto printed = printed_table(readme(), marker);
  const auto rows = reproduce(load_reference_runs(), calibration);
  REQUIRE(printed.size() == rows.size());
  for (const auto& r : rows) {
    INFO("run " << r.run.id << " (" << (calibration.empty() ? "datasheet" : calibration) << ")");
    REQUIRE(printed.count(r.run.id) == 1);
    const auto& p = printed.at(r.run.id);
    check_figure(p.predicted_tflops, r.predicted.tflops_per_device, "TFLOP/s");
    check_figure(p.predicted_hbm, r.predicted.hbm_peak_bytes / 1073741824.0, "HBM GiB");
    check_figure(p.predicted_host, r.predicted.host_peak_bytes / 1073741824.0, "host GiB");
    CHECK(p.fits == (r.predicted.fits ? "yes" : "OOM"));
  }
}

// "+33.2%" -> 33.2, "yes" -> 1, "no" -> 0 (how the README prints ratios and orderings).
double claim_value(const std::string& cell) {
  if (cell == "yes") return 1;
  if (cell == "no") return 0;
  return std::stod(cell);
}

}  // namespace

TEST_CASE("the README's datasheet reproduce table is what reproduce predicts today", "[accuracy]") {
  check_table("With datasheet figures alone (`hbmsim reproduce`):", "");
}

TEST_CASE("the README's fitted reproduce table is what reproduce --calibration gb200-fitted predicts today", "[accuracy]") {
  check_table("`hbmsim reproduce --calibration gb200-fitted`:", "gb200-fitted");
}

TEST_CASE("the README's claims table gives today's claimed ratios and verdicts, datasheet and fitted", "[accuracy]") {
  const std::string text = readme();
  const std::string header = "| claim | reported | datasheet | holds | fitted | holds |";
  auto at = text.find(header);
  REQUIRE(at != std::string::npos);
  std::istringstream table(text.substr(at));
  std::map<std::string, std::vector<std::string>> printed;  // claim -> cells
  std::string line;
  std::getline(table, line);  // header
  std::getline(table, line);  // |---|
  while (std::getline(table, line) && line.rfind("|", 0) == 0) {
    std::vector<std::string> cells;
    std::istringstream ss(line.substr(1));
    for (std::string c; std::getline(ss, c, '|');) cells.push_back(trim(c));
    REQUIRE(cells.size() == 6);
    printed[cells[0]] = cells;
  }
  const auto datasheet = check_claims(reproduce(load_reference_runs(), ""));
  const auto fitted = check_claims(reproduce(load_reference_runs(), "gb200-fitted"));
  REQUIRE(datasheet.size() == printed.size());
  for (std::size_t k = 0; k < datasheet.size(); ++k) {
    INFO(datasheet[k].claim);
    REQUIRE(printed.count(datasheet[k].claim) == 1);
    const auto& cells = printed.at(datasheet[k].claim);
    CHECK(claim_value(cells[1]) == Approx(datasheet[k].reported).margin(0.05));
    CHECK(std::fabs(claim_value(cells[2]) - datasheet[k].predicted) <= 0.5 + 0.05);
    CHECK(cells[3] == (datasheet[k].holds ? "yes" : "NO"));
    CHECK(std::fabs(claim_value(cells[4]) - fitted[k].predicted) <= 0.5 + 0.05);
    CHECK(cells[5] == (fitted[k].holds ? "yes" : "NO"));
  }
}
