#include "sim/simulator.hpp"

#include "sim/chrome_trace.hpp"

namespace hbmsim {

StepReport simulate(const StepGraph& g, const System& sys, const Policy& policy, const SimOptions& opt) {
  std::vector<std::string> names;
  // Reused per thread: sweeps simulate thousands of steps, and a fresh program each time costs page faults.
  thread_local sim::Program program;
  build_program(g, sys, policy, opt, opt.record_trace ? &names : nullptr, program);
  auto r = sim::run_program(program, opt.record_trace, opt.fast_forward, opt.stop_above_hbm_bytes);
  StepReport rep = make_report(g, sys, policy.name(), program, r);
  if (r.stopped_over_hbm) {
    rep.stopped = true;
    rep.fits_reason += " (the run stopped there)";
  }
  if (opt.record_trace) {
    auto lists = peak_buffers(program, r, names);
    for (auto& st : rep.stages) st.peak_buffers = std::move(lists[static_cast<std::size_t>(st.stage)]);
    rep.timeline = r.timeline;
    rep.trace = chrome_trace(program, r, names);
  }
  return rep;
}

}  // namespace hbmsim
