// Threads kept from one parallel call to the next. A simulating thread keeps thread-local working arrays (the
// engine's, sized by the largest step it ran); a thread started per call allocates them and faults them in anew,
// and `plan layout` runs a sweep per slice of 16 candidates, a calibration fit one per evaluation.
#pragma once
#include <functional>

namespace hbmsim {

// Runs `work` on the calling thread and on `extra` threads besides it; returns when every call has returned, then
// rethrows the first exception one of them threw. A call while another runs (from a pool thread, or from another
// thread) starts threads of its own, as does one made at exit after the pool stopped; a forked process starts a pool
// of its own.
void run_on_threads(int extra, const std::function<void()>& work);

}  // namespace hbmsim
