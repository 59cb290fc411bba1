// A parallel call made after the worker pool has stopped at exit (planner/worker_pool.hpp) runs to the end on
// threads of its own. The order cannot be reached from the Catch2 suite: the pool's exit handler must be
// registered after the handler that makes the call (handlers run in reverse), so the call must come before the
// process's first parallel call, and a forked child inherits its parent's handlers.
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>

#include "planner/worker_pool.hpp"

namespace {

std::atomic<int> at_exit_runs{0};

// Runs after the pool's own exit handler has stopped its threads.
void parallel_call_at_exit() {
  hbmsim::run_on_threads(2, [] { ++at_exit_runs; });
  std::printf("worker_pool_exit: the call at exit ran %d times (3 expected)\n", at_exit_runs.load());
  std::fflush(stdout);
  if (at_exit_runs.load() != 3) std::_Exit(1);
}

}  // namespace

int main() {
  alarm(30);  // a call waiting for the stopped pool's threads would wait for ever: SIGALRM ends it
  std::atexit(parallel_call_at_exit);
  std::atomic<int> runs{0};
  hbmsim::run_on_threads(2, [&] { ++runs; });  // starts the pool, which registers its exit handler now
  return runs.load() == 3 ? 0 : 1;
}
