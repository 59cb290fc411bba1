// libFuzzer harness: run configs (hbmsim simulate --config FILE), then the checks prepare_run does
// before a simulation (system, model, policy, dtypes, training shape).
#include "fuzz_common.hpp"
#include "hwmodels/builtin.hpp"
#include "planner/run_config.hpp"

namespace {

// Only built-in systems, models and profiles: a fuzzed path must not read arbitrary files.
bool builtin(const std::string& dir, const std::string& name) {
  return name.find('/') == std::string::npos && hbmsim::builtin_file(dir + name + ".json").has_value();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    auto doc = hbmsim::parse_json_text(fuzz::text(data, size), "fuzz-run.json");
    auto c = hbmsim::RunConfig::from_json(doc, "fuzz-run.json");
    auto j = c.to_json();
    (void)j.dump();
    // sweep and plan write configs back as JSON (runnable_settings): they must load again.
    try {
      auto again = hbmsim::RunConfig::from_json(j, "fuzz-run.json (round trip)");
      fuzz::require(again.to_json() == j, "run config round trip");
    } catch (const hbmsim::InputError& e) {
      std::fprintf(stderr, "an accepted run config does not reload: %s\n", e.what());
      fuzz::require(false, "run config round trip");
    }
    if (!builtin("systems/", c.system)) c.system = "h200-hgx";
    if (!builtin("models/", c.model)) c.model = "llama3.1-8b";
    if (!c.calibration.empty() && !builtin("profiles/", c.calibration)) c.calibration = "";
    (void)hbmsim::prepare_run(c);
  } catch (const hbmsim::InputError&) {
  }
  return 0;
}
