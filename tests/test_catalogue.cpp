// The bad-input catalogue (tests/bad_inputs/catalogue.json): every case runs the hbmsim binary on a broken
// file or flag and must exit with status 2, print exactly one line on stderr, and name the file and JSON
// path (or the flag) and the value. Cases marked "known_bug" are skipped with a warning until the lead
// fixes them; HBMSIM_CATALOGUE_KNOWN_BUGS=1 runs them too (one marked "memory hazard" may exhaust memory).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdlib>
#include <set>
#include <string>
#include <vector>

#include "helpers.hpp"
#include "hwmodels/builtin.hpp"

namespace {

using nlohmann::json;
namespace fs = std::filesystem;

const std::vector<std::string>& categories() {
  static const std::vector<std::string> c = {"system", "model",        "hf_config", "run_config", "policy",
                                             "calibration", "measured_runs", "sweep",     "flags"};
  return c;
}

const json& catalogue() {
  static const json doc = [] {
    auto path = fs::path(HBMSIM_SOURCE_DIR) / "tests" / "bad_inputs" / "catalogue.json";
    auto text = test::slurp(path);
    if (text.empty()) throw std::runtime_error(path.string() + ": missing or empty");
    return json::parse(text);
  }();
  return doc;
}

void replace_all(std::string& s, const std::string& from, const std::string& to) {
  if (from.empty()) return;
  for (std::size_t pos = s.find(from); pos != std::string::npos; pos = s.find(from, pos + to.size()))
    s.replace(pos, from.size(), to);
}

struct Placeholders {
  std::vector<std::pair<std::string, std::string>> map;  // "{name}" -> text
  std::string apply(std::string s) const {
    for (auto& [k, v] : map) replace_all(s, k, v);
    return s;
  }
};

// One file of a case: {"text": "..."} | {"lines": [...]} | {"json": value} |
// {"builtin": "systems/x.json", "set": {ptr: value}, "remove": [ptr], "raw": {ptr: "literal JSON text"}}.
std::string file_text(const json& spec) {
  if (spec.contains("text")) return spec.at("text").get<std::string>();
  if (spec.contains("lines")) {
    std::string out;
    for (auto& l : spec.at("lines")) out += l.get<std::string>() + "\n";
    return out;
  }
  json doc;
  if (spec.contains("json")) {
    doc = spec.at("json");
  } else {
    auto name = spec.at("builtin").get<std::string>();
    auto text = hbmsim::builtin_file(name);
    if (!text) throw std::runtime_error("catalogue: no built-in data file " + name);
    doc = json::parse(*text);
  }
  if (spec.contains("remove"))
    for (auto& p : spec.at("remove")) {
      json::json_pointer ptr(p.get<std::string>());
      doc.at(ptr.parent_pointer()).erase(ptr.back());
    }
  if (spec.contains("set"))
    for (auto& [p, v] : spec.at("set").items()) doc[json::json_pointer(p)] = v;
  std::vector<std::pair<std::string, std::string>> raw;
  if (spec.contains("raw"))
    for (auto& [p, v] : spec.at("raw").items()) {
      std::string marker = "@@RAW" + std::to_string(raw.size()) + "@@";
      doc[json::json_pointer(p)] = marker;
      raw.emplace_back("\"" + marker + "\"", v.get<std::string>());
    }
  std::string out = doc.dump(2);
  for (auto& [marker, literal] : raw) replace_all(out, marker, literal);
  return out;
}

bool run_known_bugs() {
  const char* v = std::getenv("HBMSIM_CATALOGUE_KNOWN_BUGS");
  return v && std::string(v) == "1";
}

// Like test::cli, under `timeout` so that input a bug silently accepts cannot hang the suite.
test::CliResult run_cli(const std::string& args, const fs::path& dir) {
  auto out = dir / "stdout.txt", err = dir / "stderr.txt";
  std::string cmd = "timeout -k 5 120 " + std::string(HBMSIM_CLI) + " " + args + " >" + out.string() + " 2>" +
                    err.string() + " </dev/null";
  int raw = std::system(cmd.c_str());
  test::CliResult r;
  if (WIFEXITED(raw)) r.status = WEXITSTATUS(raw);
  else if (WIFSIGNALED(raw)) r.status = 128 + WTERMSIG(raw);
  r.out = test::slurp(out);
  r.err = test::slurp(err);
  return r;
}

void run_category(const std::string& category) {
  std::size_t ran = 0, skipped = 0, index = 0;
  for (auto& c : catalogue().at("cases")) {
    ++index;
    if (c.at("category") != category) continue;
    const auto id = c.at("id").get<std::string>();
    if (c.contains("known_bug") && !run_known_bugs()) {
      WARN("skipped known bug " << id << ": " << c.at("known_bug").get<std::string>());
      ++skipped;
      continue;
    }
    ++ran;
    // A neutral directory name: the case id would put the words a case expects into every path.
    auto dir = test::temp_dir() / "bad" / std::to_string(index);
    fs::remove_all(dir);
    fs::create_directories(dir);
    Placeholders ph;
    ph.map.emplace_back("{dir}", dir.string());
    ph.map.emplace_back("{missing}", (dir / "missing.json").string());
    if (c.contains("files"))
      for (auto& [name, spec] : c.at("files").items()) ph.map.emplace_back("{" + name + "}", (dir / name).string());
    if (c.contains("files"))
      for (auto& [name, spec] : c.at("files").items()) test::write(dir / name, ph.apply(file_text(spec)));
    const auto args = ph.apply(c.at("args").get<std::string>());
    INFO("case " << id << ": " << c.value("what", std::string()));
    INFO("hbmsim " << args);
    auto r = run_cli(args, dir);
    INFO("exit status " << r.status << ", stderr: " << r.err);
    CHECK(r.status == 2);
    CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
    CHECK((!r.err.empty() && r.err.back() == '\n'));
    // Substrings that name no path are looked for with the case's paths blanked out, so that a word in a
    // path cannot stand in for the message.
    std::string err_without_paths = r.err;
    auto by_length = ph.map;
    std::sort(by_length.begin(), by_length.end(), [](auto& a, auto& b) { return a.second.size() > b.second.size(); });
    for (auto& [k, v] : by_length) replace_all(err_without_paths, v, k);
    for (auto& e : c.at("expect")) {
      const auto raw = e.get<std::string>();
      bool names_path = false;
      for (auto& [k, v] : ph.map) names_path = names_path || raw.find(k) != std::string::npos;
      auto want = names_path ? ph.apply(raw) : raw;
      INFO("expected on stderr: " << want);
      CHECK((names_path ? r.err : err_without_paths).find(want) != std::string::npos);
    }
  }
  INFO(category << ": " << ran << " cases run, " << skipped << " known bugs skipped");
  CHECK(ran + skipped > 0);
}

}  // namespace

TEST_CASE("The bad-input catalogue is well formed and covers every kind of input", "[catalogue]") {
  const auto& cases = catalogue().at("cases");
  REQUIRE(cases.size() >= 45);
  std::set<std::string> ids;
  for (auto& c : cases) {
    const auto id = c.at("id").get<std::string>();
    INFO(id);
    CHECK(ids.insert(id).second);
    CHECK(std::find(categories().begin(), categories().end(), c.at("category").get<std::string>()) != categories().end());
    CHECK(c.at("args").is_string());
    CHECK(c.at("expect").is_array());
    CHECK(!c.at("expect").empty());
    for (auto& [key, value] : c.items()) {
      INFO(key);
      CHECK((key == "id" || key == "category" || key == "what" || key == "args" || key == "files" || key == "expect" ||
             key == "known_bug"));
    }
    if (c.contains("files"))
      for (auto& [name, spec] : c.at("files").items()) {
        INFO(name);
        CHECK_NOTHROW(file_text(spec));
      }
  }
  for (auto& cat : categories()) {
    INFO(cat);
    CHECK(std::count_if(cases.begin(), cases.end(), [&](const json& c) { return c.at("category") == cat; }) >= 3);
  }
}

TEST_CASE("Broken system files exit 2 with one line naming the file, the JSON path and the value", "[catalogue][cli]") {
  run_category("system");
}

TEST_CASE("Broken model files exit 2 with one line naming the file, the JSON path and the value", "[catalogue][cli]") {
  run_category("model");
}

TEST_CASE("Broken HuggingFace config.json files exit 2 with one line naming the file, the key and the value",
          "[catalogue][cli]") {
  run_category("hf_config");
}

TEST_CASE("Broken run configs given to simulate --config exit 2 with one line naming the field and the value",
          "[catalogue][cli]") {
  run_category("run_config");
}

TEST_CASE("Unknown policies and impossible tensor placements exit 2 with one line naming them", "[catalogue][cli]") {
  run_category("policy");
}

TEST_CASE("Broken calibration profiles exit 2 with one line naming the file, the JSON path and the value",
          "[catalogue][cli]") {
  run_category("calibration");
}

TEST_CASE("Broken measured-run files, MaxText logs and fit parameter lists exit 2 with one line naming them",
          "[catalogue][cli]") {
  run_category("measured_runs");
}

TEST_CASE("Bad sweep axes and --where filters exit 2 with one line naming the flag and the value", "[catalogue][cli]") {
  run_category("sweep");
}

TEST_CASE("Bad command-line flags exit 2 with one line naming the flag and the value", "[catalogue][cli]") {
  run_category("flags");
}
