#include "sim/engine.hpp"

#include <algorithm>
#include <limits>
#include <stdexcept>

namespace hbmsim::sim {

const char* stream_name(int s) {
  static const char* names[] = {"compute", "collective", "expert_a2a", "d2h", "h2d"};
  return (s >= 0 && s < stream_count) ? names[s] : "?";
}

const char* to_string(MemCategory c) {
  static const char* names[] = {"parameters", "optimizer_state", "gradients", "gathered_weights",
                                "saved_activations", "offload_buffers", "collective_buffers", "workspace",
                                "runtime_reserve"};
  int i = static_cast<int>(c);
  return (i >= 0 && i < kMemCategories) ? names[i] : "?";
}

namespace {

bool is_pool(int stream) { return stream == d2h || stream == h2d; }

// Per-thread working arrays, kept between runs: a sweep simulates thousands of steps per thread, and
// fresh arrays each time cost more in page faults than the simulation itself.
struct Scratch {
  std::vector<int> unmet, succ_start, succ, refs, fill, active, finished;
  std::vector<double> remaining, rate, start, end;
  std::array<std::vector<int>, stream_count> queues;
};
Scratch& scratch() {
  thread_local Scratch s;
  return s;
}

class Engine {
 public:
  Engine(const Program& p, bool timeline) : p_(p), record_(timeline) {
    const auto n = p.ops.size();
    unmet_.resize(n);
    succ_start_.assign(n + 1, 0);
    for (std::size_t i = 0; i < n; ++i) {
      unmet_[i] = static_cast<int>(p.ops[i].deps.size());
      for (int d : p.ops[i].deps) {
        if (d < 0 || static_cast<std::size_t>(d) >= i)
          throw std::logic_error("program op " + std::to_string(i) + " depends on a later op");
        ++succ_start_[static_cast<std::size_t>(d) + 1];
      }
    }
    for (std::size_t i = 0; i < n; ++i) succ_start_[i + 1] += succ_start_[i];
    succ_.resize(succ_start_[n]);
    auto& fill = scratch().fill;
    fill.assign(succ_start_.begin(), succ_start_.end() - 1);
    for (std::size_t i = 0; i < n; ++i)
      for (int d : p.ops[i].deps) succ_[static_cast<std::size_t>(fill[static_cast<std::size_t>(d)]++)] = static_cast<int>(i);
    refs_.assign(p.buffers.size(), 0);
    for (auto& op : p.ops)
      for (int b : op.releases) ++refs_[static_cast<std::size_t>(b)];
    for (std::size_t s = 0; s < stream_count; ++s) {
      queue_pos_[s] = 0;
      queues_[s].clear();
    }
    active_.clear();
    for (std::size_t i = 0; i < n; ++i) queues_[static_cast<std::size_t>(p.ops[i].stream)].push_back(static_cast<int>(i));
    if (record_) {
      r_.buffer_alloc_s.assign(p.buffers.size(), -1);
      r_.buffer_free_s.assign(p.buffers.size(), -1);
    }
    start_.assign(n, -1);
    end_.assign(n, -1);
    remaining_.assign(n, 0);
    rate_.assign(n, 0);
    last_done_stream_ = compute;
  }

  EngineResult run() {
    for (int b : p_.resident) alloc(b);
    sample();
    const std::size_t n = p_.ops.size();
    start_ready();
    while (done_ < n) {
      if (active_.empty() && !force_gated()) throw std::logic_error("simulation deadlock at op " + std::to_string(first_unstarted()));
      update_rates();
      double dt = std::numeric_limits<double>::infinity();
      for (int i : active_)
        if (rate_[static_cast<std::size_t>(i)] > 0)
          dt = std::min(dt, remaining_[static_cast<std::size_t>(i)] / rate_[static_cast<std::size_t>(i)]);
      now_ += dt;
      ++r_.events;
      // Complete every op that finishes now (within rounding), in sequence order.
      auto& finished = finished_;
      finished.clear();
      for (int i : active_) {
        auto k = static_cast<std::size_t>(i);
        remaining_[k] -= rate_[k] * dt;
        if (rate_[k] > 0 && remaining_[k] <= 1e-12 * std::max(1.0, p_.ops[k].amount)) finished.push_back(i);
      }
      if (finished.size() > 1) std::sort(finished.begin(), finished.end());
      for (int i : finished) {
        *std::find(active_.begin(), active_.end(), i) = active_.back();  // order in active_ is irrelevant
        active_.pop_back();
        complete(i);
      }
      start_ready();
    }
    r_.end_time_s = now_;
    sample();
    if (record_) {
      r_.start_s = start_;
      r_.end_s = end_;
    }
    return std::move(r_);
  }

 private:
  // When nothing runs, a prefetch held back by the memory limit would wait forever: XLA would issue it
  // anyway (and the step then needs that memory), so start the first one that is otherwise ready.
  bool force_gated() {
    for (int s : {d2h, h2d}) {
      auto& q = queues_[static_cast<std::size_t>(s)];
      auto& pos = queue_pos_[static_cast<std::size_t>(s)];
      if (pos < q.size() && unmet_[static_cast<std::size_t>(q[pos])] == 0) {
        start(q[pos++]);
        start_ready();
        return true;
      }
    }
    return false;
  }

  int first_unstarted() const {
    for (std::size_t i = 0; i < p_.ops.size(); ++i)
      if (start_[i] < 0) return static_cast<int>(i);
    return -1;
  }

  void alloc(int b) {
    const auto& buf = p_.buffers[static_cast<std::size_t>(b)];
    if (record_) r_.buffer_alloc_s[static_cast<std::size_t>(b)] = now_;
    if (buf.host) {
      host_live_ += buf.bytes;
      r_.host_peak_bytes = std::max(r_.host_peak_bytes, host_live_);
    } else {
      hbm_live_ += buf.bytes;
      by_cat_[static_cast<std::size_t>(buf.category)] += buf.bytes;
      if (hbm_live_ > r_.hbm_peak_bytes) {
        r_.hbm_peak_bytes = hbm_live_;
        r_.hbm_peak_time_s = now_;
        r_.hbm_at_peak = by_cat_;
      }
    }
  }

  void release(int b) {
    if (--refs_[static_cast<std::size_t>(b)] > 0) return;
    const auto& buf = p_.buffers[static_cast<std::size_t>(b)];
    if (record_) r_.buffer_free_s[static_cast<std::size_t>(b)] = now_;
    if (buf.host) {
      host_live_ -= buf.bytes;
    } else {
      hbm_live_ -= buf.bytes;
      by_cat_[static_cast<std::size_t>(buf.category)] -= buf.bytes;
    }
  }

  void sample() {
    if (record_) r_.timeline.push_back(MemorySample{now_, hbm_live_, host_live_, by_cat_});
  }

  bool can_start(int i) const {
    const auto& op = p_.ops[static_cast<std::size_t>(i)];
    if (unmet_[static_cast<std::size_t>(i)] != 0) return false;
    return op.gate_bytes <= 0 || hbm_live_ + op.gate_bytes <= p_.hbm_limit_bytes;
  }

  void start(int i) {
    auto k = static_cast<std::size_t>(i);
    const auto& op = p_.ops[k];
    if (op.stream == compute && compute_idle_since_ >= 0) {
      double gap = now_ - compute_idle_since_;
      if (gap > 0) r_.exposed_s[static_cast<std::size_t>(blame_stream(i))] += gap;
      compute_idle_since_ = -1;
    }
    start_[k] = now_;
    remaining_[k] = op.amount;
    for (int b : op.allocs) alloc(b);
    if (is_pool(op.stream)) ++pool_active_[static_cast<std::size_t>(op.stream)];
    else busy_[static_cast<std::size_t>(op.stream)] = true;
    active_.push_back(i);
    if (op.amount <= 0) {
      remaining_[k] = 0;
      ++zero_active_;
    }
    sample();
  }

  // The dependency that finished last is what the compute stream was waiting for.
  int blame_stream(int i) const {
    double latest = -1;
    int stream = compute;
    for (int d : p_.ops[static_cast<std::size_t>(i)].deps) {
      double e = end_[static_cast<std::size_t>(d)];
      if (e > latest) {
        latest = e;
        stream = p_.ops[static_cast<std::size_t>(d)].stream;
      }
    }
    return stream;
  }

  void complete(int i) {
    auto k = static_cast<std::size_t>(i);
    const auto& op = p_.ops[k];
    end_[k] = now_;
    ++done_;
    r_.busy_s[static_cast<std::size_t>(op.stream)] += now_ - start_[k];
    r_.executed_flops += op.executed_flops;
    if (is_pool(op.stream)) --pool_active_[static_cast<std::size_t>(op.stream)];
    else busy_[static_cast<std::size_t>(op.stream)] = false;
    if (op.stream == compute) compute_idle_since_ = now_;
    for (int b : op.releases) release(b);
    for (int s = succ_start_[k]; s < succ_start_[k + 1]; ++s) --unmet_[static_cast<std::size_t>(succ_[static_cast<std::size_t>(s)])];
    sample();
  }

  void start_ready() {
    // Starting an op never makes another ready (only completions and frees do), so one pass suffices,
    // unless a zero-length op completes on the spot and releases its successors.
    for (;;) {
      for (int s = 0; s < stream_count; ++s) {
        auto& q = queues_[static_cast<std::size_t>(s)];
        auto& pos = queue_pos_[static_cast<std::size_t>(s)];
        if (is_pool(s)) {
          // Copies start in program order as soon as they are ready; a gated one holds the ones behind it.
          while (pos < q.size() && can_start(q[pos])) start(q[pos++]);
        } else if (!busy_[static_cast<std::size_t>(s)] && pos < q.size() && can_start(q[pos])) {
          start(q[pos++]);
        }
      }
      if (zero_active_ == 0) return;
      for (std::size_t a = 0; a < active_.size();) {
        int i = active_[a];
        if (p_.ops[static_cast<std::size_t>(i)].amount <= 0) {
          active_.erase(active_.begin() + static_cast<long>(a));
          complete(i);
        } else {
          ++a;
        }
      }
      zero_active_ = 0;
    }
  }

  void update_rates() {
    int copies[stream_count] = {0, 0, 0, 0, 0};
    int best[stream_count] = {0, 0, 0, 0, 0};
    bool copy_active = false;
    for (int i : active_) {
      const auto& op = p_.ops[static_cast<std::size_t>(i)];
      if (is_pool(op.stream) && (!copies[op.stream] || op.priority < best[op.stream])) {
        best[op.stream] = op.priority;
        copies[op.stream] = 0;
      }
      if (is_pool(op.stream) && op.priority == best[op.stream]) ++copies[op.stream];
      copy_active = copy_active || is_pool(op.stream);
    }
    // Both directions together may be capped below the sum of the two (bidirectional limit).
    double dir_scale = 1.0;
    if (p_.bidirectional_total_bytes_per_s > 0 && copies[d2h] > 0 && copies[h2d] > 0) {
      double want = 0;
      for (int i : active_) {
        const auto& op = p_.ops[static_cast<std::size_t>(i)];
        if (is_pool(op.stream) && op.priority == best[op.stream]) want += op.rate_cap / copies[op.stream];
      }
      if (want > p_.bidirectional_total_bytes_per_s) dir_scale = p_.bidirectional_total_bytes_per_s / want;
    }
    for (int i : active_) {
      auto k = static_cast<std::size_t>(i);
      const auto& op = p_.ops[k];
      double r = op.rate_cap;
      if (is_pool(op.stream))  // equal split of one direction within the most urgent class
        r = op.priority == best[op.stream] ? op.rate_cap / copies[op.stream] * dir_scale : 0.0;
      else if (op.stream == collective || op.stream == expert_a2a)
        r = 1.0;  // each stream runs one op at a time; the two use different links (EP group vs FSDP group)
      else if (op.memory_bound && copy_active) r = 1.0 - p_.copy_interference;
      rate_[k] = r;
    }
  }

  const Program& p_;
  bool record_;
  EngineResult r_;
  double now_ = 0;
  double hbm_live_ = 0, host_live_ = 0;
  std::array<double, kMemCategories> by_cat_{};
  std::vector<int>&unmet_ = scratch().unmet, &succ_start_ = scratch().succ_start, &succ_ = scratch().succ,
                  &refs_ = scratch().refs;
  std::array<std::vector<int>, stream_count>& queues_ = scratch().queues;
  std::array<std::size_t, stream_count> queue_pos_{};
  std::array<bool, stream_count> busy_{};
  std::array<int, stream_count> pool_active_{};
  std::vector<int>&active_ = scratch().active, &finished_ = scratch().finished;
  std::vector<double>&remaining_ = scratch().remaining, &rate_ = scratch().rate, &start_ = scratch().start,
                     &end_ = scratch().end;
  double compute_idle_since_ = 0;
  int last_done_stream_;
  std::size_t done_ = 0;
  int zero_active_ = 0;
};

}  // namespace

EngineResult run_program(const Program& program, bool record_timeline) {
  return Engine(program, record_timeline).run();
}

}  // namespace hbmsim::sim
