// The threads parallel calls share (planner/worker_pool.hpp): kept from one call to the next, so a thread's
// thread-local working arrays survive; a call inside a call and a forked child still run to the end.
#include <catch2/catch.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>

#include "planner/sweep.hpp"
#include "planner/worker_pool.hpp"

using namespace hbmsim;

namespace {
thread_local int calls_on_this_thread = 0;  // what a thread-local working array would keep

// One call on the caller and `extra` threads: each thread's count of calls so far, this one included.
std::multiset<int> counts_of_a_call(int extra) {
  std::mutex m;
  std::multiset<int> seen;
  run_on_threads(extra, [&] {
    const int n = ++calls_on_this_thread;
    std::lock_guard lock(m);
    seen.insert(n);
  });
  return seen;
}
}  // namespace

TEST_CASE("parallel calls run on the caller and `extra` kept threads, whose thread-local state survives", "[sweep]") {
  counts_of_a_call(2);  // warms the pool (its threads may have run earlier tests' calls)
  const int caller_before = calls_on_this_thread;
  const auto seen = counts_of_a_call(2);
  // Three runs: the caller's, one call on from the warm-up, and two pool threads that had run at least the
  // warm-up too: a thread started for this call would count 1.
  REQUIRE(seen.size() == 3);
  CHECK(calls_on_this_thread == caller_before + 1);
  CHECK(*seen.begin() >= 2);
}

TEST_CASE("a parallel call inside another, and a sweep's failure, end as they would on threads of their own", "[sweep]") {
  std::atomic<int> inner{0}, outer{0};
  run_on_threads(1, [&] {
    ++outer;
    run_on_threads(1, [&] { ++inner; });  // the pool is busy: this call brings its own thread
  });
  CHECK(outer == 2);
  CHECK(inner == 4);
  // parallel_for hands a failed item's exception back to the caller, and the pool goes on serving.
  CHECK_THROWS_WITH(parallel_for(4, 2, [](std::size_t i) { if (i == 2) throw std::runtime_error("item 2"); }), "item 2");
  std::atomic<int> items{0};
  parallel_for(5, 3, [&](std::size_t) { ++items; });
  CHECK(items == 5);
}

TEST_CASE("a process forked after parallel calls makes its own threads for the next", "[sweep]") {
  run_on_threads(2, [] {});  // the parent's pool has its threads
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    alarm(20);  // a child waiting for the parent's threads (which it has not got) dies of SIGALRM
    std::atomic<int> ran{0};
    run_on_threads(2, [&] { ++ran; });
    _exit(ran == 3 ? 0 : 1);
  }
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}

TEST_CASE("an exception from any of a parallel call's threads reaches the caller after all of them return", "[sweep]") {
  std::atomic<int> returned{0};
  // The pool's threads throw (the caller does not), and the call still waits for every thread before it rethrows.
  const auto caller = std::this_thread::get_id();
  CHECK_THROWS_WITH(run_on_threads(2,
                                   [&] {
                                     ++returned;
                                     if (std::this_thread::get_id() != caller) throw std::runtime_error("worker failed");
                                   }),
                    "worker failed");
  CHECK(returned == 3);
  std::atomic<int> after{0};
  run_on_threads(2, [&] { ++after; });  // the pool still serves
  CHECK(after == 3);
}

TEST_CASE("threads left idle for a second go, with their thread-local state", "[sweep]") {
  counts_of_a_call(2);
  std::this_thread::sleep_for(std::chrono::milliseconds(2500));  // well past the pool's one-second idle release
  const auto seen = counts_of_a_call(2);
  // The caller's count goes on; the two helping threads are new ones, on their first call.
  REQUIRE(seen.size() == 3);
  CHECK(seen.count(1) == 2);
}
