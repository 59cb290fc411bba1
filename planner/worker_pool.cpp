#include "planner/worker_pool.hpp"

#include <pthread.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace hbmsim {

namespace {

// A thread kept idle this long goes, taking its thread-local arrays with it: back-to-back calls (a search's slices,
// a fit's evaluations) reuse the threads, while a process that has finished its sweeps does not hold their memory.
constexpr std::chrono::milliseconds kIdleRelease{1000};

// Threads waiting for the next call's work. The pool is never destroyed (a forked child leaves its parent's be);
// at exit its threads are told to go and joined, so that their thread-local arrays are freed before the process
// ends (a leak checker would otherwise find them unreachable).
class Pool {
 public:
  // False: a call is running, or the pool has stopped at exit (a later exit handler's call: its threads are
  // gone), so this one must bring its own threads.
  bool run(int extra, const std::function<void()>& work) {
    std::unique_lock busy(busy_, std::try_to_lock);
    if (!busy.owns_lock()) return false;
    {
      std::lock_guard lock(m_);
      if (stop_) return false;
      for (; started_ < extra; ++started_) {
        const auto index = static_cast<std::size_t>(started_);
        if (index == threads_.size()) threads_.emplace_back();
        if (threads_[index].joinable()) threads_[index].join();  // one that went idle: it has returned
        threads_[index] = std::thread([this, i = started_, seen = generation_] { loop(i, seen); });
      }
      work_ = &work;
      wanted_ = extra;
      pending_ = extra;
      ++generation_;
    }
    wake_.notify_all();
    work();
    std::unique_lock lock(m_);
    done_.wait(lock, [&] { return pending_ == 0; });
    work_ = nullptr;
    idle_since_ = Clock::now();
    lock.unlock();
    wake_.notify_all();  // the idle clock starts now
    return true;
  }

  // At exit: every thread goes once it is idle, and is joined (not the calling thread, should it be one).
  void stop() {
    {
      std::lock_guard lock(m_);
      stop_ = true;
    }
    wake_.notify_all();
    for (auto& t : threads_)
      if (t.joinable() && t.get_id() != std::this_thread::get_id()) t.join();
  }

 private:
  using Clock = std::chrono::steady_clock;

  // Thread `index` runs every call that wants more than `index` threads. Only the last thread goes when idle, so
  // the threads left are always 0 .. started_ - 1.
  void loop(int index, std::uint64_t seen) {
    for (;;) {
      const std::function<void()>* work = nullptr;
      {
        std::unique_lock lock(m_);
        while (generation_ == seen) {
          if (stop_) return;
          if (work_ || index != started_ - 1) {  // a call runs, or a thread above this one is still there
            wake_.wait(lock);
            continue;
          }
          const auto release = idle_since_ + kIdleRelease;
          if (Clock::now() >= release) {
            --started_;
            wake_.notify_all();  // the one below may go too
            return;
          }
          wake_.wait_until(lock, release);
        }
        seen = generation_;
        if (index >= wanted_) continue;
        work = work_;
      }
      (*work)();
      std::lock_guard lock(m_);
      if (--pending_ == 0) done_.notify_one();
    }
  }

  std::mutex busy_, m_;
  std::condition_variable wake_, done_;
  std::vector<std::thread> threads_;  // thread i serves calls wanting more than i threads; gone ones not yet joined
  const std::function<void()>* work_ = nullptr;
  bool stop_ = false;
  int started_ = 0, wanted_ = 0, pending_ = 0;
  std::uint64_t generation_ = 0;
  Clock::time_point idle_since_ = Clock::now();
};

std::atomic<Pool*> the_pool{nullptr};

Pool& pool() {
  // A forked child has none of the parent's threads: it forgets the parent's pool (leaving it be) and makes its own.
  // At exit the pool of this process stops (atexit handlers run before a leak checker's, registered earlier).
  static const bool registered = [] {
    pthread_atfork(nullptr, nullptr, [] { the_pool.store(nullptr); });
    std::atexit([] {
      if (Pool* p = the_pool.load()) p->stop();
    });
    return true;
  }();
  (void)registered;
  Pool* p = the_pool.load();
  if (p) return *p;
  auto* fresh = new Pool;
  if (the_pool.compare_exchange_strong(p, fresh)) return *fresh;
  delete fresh;  // another thread made one first
  return *p;
}

}  // namespace

void run_on_threads(int extra, const std::function<void()>& work) {
  if (extra <= 0) {
    work();
    return;
  }
  // Every thread returns before the first exception (if any) goes on to the caller: none may outlive `work`.
  std::mutex m;
  std::exception_ptr failure;
  const std::function<void()> guarded = [&] {
    try {
      work();
    } catch (...) {
      std::lock_guard lock(m);
      if (!failure) failure = std::current_exception();
    }
  };
  if (!pool().run(extra, guarded)) {
    std::vector<std::thread> threads;
    for (int j = 0; j < extra; ++j) threads.emplace_back(guarded);
    guarded();
    for (auto& t : threads) t.join();
  }
  if (failure) std::rethrow_exception(failure);
}

}  // namespace hbmsim
