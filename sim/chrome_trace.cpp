#include "sim/chrome_trace.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>

namespace hbmsim {

namespace {

// Appends JSON values to a string: numbers in their shortest round-trip form, strings escaped.
class JsonText {
 public:
  explicit JsonText(std::string& out) : out_(out) {}
  JsonText& raw(std::string_view s) {
    out_ += s;
    return *this;
  }
  JsonText& number(double v) {
    if (!std::isfinite(v)) return raw("null");  // as nlohmann's dump writes them
    char buf[32];
    auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
    out_.append(buf, end);
    return *this;
  }
  JsonText& integer(long long v) {
    char buf[24];
    auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
    out_.append(buf, end);
    return *this;
  }
  JsonText& string(std::string_view s) {
    out_ += '"';
    for (char ch : s) {
      const auto c = static_cast<unsigned char>(ch);
      if (c == '"' || c == '\\') {
        out_ += '\\';
        out_ += ch;
      } else if (c < 0x20) {
        static constexpr char hex[] = "0123456789abcdef";
        out_ += "\\u00";
        out_ += hex[c >> 4];
        out_ += hex[c & 15];
      } else {
        out_ += ch;
      }
    }
    out_ += '"';
    return *this;
  }

 private:
  std::string& out_;
};

constexpr double kGiB = 1073741824.0;

// A queue can have several ops in flight (copies sharing a link, transfers beside one another), but a trace
// track's slices must not overlap (Perfetto nests or drops them): each queue's ops are laid out in lanes, the
// first free one at each op's start, and every lane is a track of its own.
struct Lanes {
  std::vector<int> of_op;        // the op's lane in its queue
  std::vector<int> per_queue;    // how many lanes each queue needed
  int stride = 1;                // track id = queue x stride + lane
};

Lanes lay_out_lanes(const sim::Program& program, const sim::EngineResult& r) {
  Lanes l;
  l.of_op.assign(program.ops.size(), 0);
  l.per_queue.assign(program.queues.size(), 1);
  std::vector<std::vector<std::size_t>> by_queue(program.queues.size());
  for (std::size_t i = 0; i < program.ops.size(); ++i) by_queue[static_cast<std::size_t>(program.ops[i].queue)].push_back(i);
  for (std::size_t q = 0; q < by_queue.size(); ++q) {
    auto& ops = by_queue[q];
    std::stable_sort(ops.begin(), ops.end(), [&](std::size_t a, std::size_t b) { return r.start_s[a] < r.start_s[b]; });
    std::vector<double> lane_end;  // when each lane's last op ends
    for (std::size_t i : ops) {
      auto free = std::find_if(lane_end.begin(), lane_end.end(), [&](double end) { return end <= r.start_s[i]; });
      if (free == lane_end.end()) free = lane_end.insert(lane_end.end(), 0.0);
      *free = r.end_s[i];
      l.of_op[i] = static_cast<int>(free - lane_end.begin());
    }
    l.per_queue[q] = std::max<int>(1, static_cast<int>(lane_end.size()));
    l.stride = std::max(l.stride, l.per_queue[q]);
  }
  return l;
}

}  // namespace

std::string chrome_trace(const sim::Program& program, const sim::EngineResult& r, const std::vector<std::string>& names) {
  std::string out;
  out.reserve(200 * program.ops.size() + 450 * r.timeline.size() + 1024);  // about what each event takes
  JsonText j(out);
  bool first = true;
  auto next = [&] {
    j.raw(first ? "\n" : ",\n");
    first = false;
  };
  j.raw("{\"displayTimeUnit\":\"ms\",\"traceEvents\":[");
  for (int d = 0; d < program.devices(); ++d) {
    next();
    const std::string name = program.devices() > 1 ? "hbmsim stage " + std::to_string(d) : "hbmsim device 0";
    j.raw("{\"args\":{\"name\":").string(name).raw("},\"name\":\"process_name\",\"ph\":\"M\",\"pid\":").integer(d).raw("}");
  }
  const Lanes lanes = lay_out_lanes(program, r);
  auto track = [&](std::size_t queue, int lane) { return static_cast<long long>(queue) * lanes.stride + lane; };
  for (std::size_t q = 0; q < program.queues.size(); ++q) {
    if (program.queues[q].marks) continue;
    for (int lane = 0; lane < lanes.per_queue[q]; ++lane) {
      const std::string name = program.queues[q].name + (lane == 0 ? "" : " #" + std::to_string(lane + 1));
      next();
      j.raw("{\"args\":{\"name\":").string(name).raw(",\"queue\":").string(program.queues[q].name);
      j.raw("},\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":");
      j.integer(program.queues[q].device).raw(",\"tid\":").integer(track(q, lane)).raw("}");
      next();  // lanes beside their queue, in queue order
      j.raw("{\"args\":{\"sort_index\":").integer(track(q, lane)).raw("},\"name\":\"thread_sort_index\",\"ph\":\"M\",\"pid\":");
      j.integer(program.queues[q].device).raw(",\"tid\":").integer(track(q, lane)).raw("}");
    }
  }
  for (std::size_t i = 0; i < program.ops.size(); ++i) {
    const auto& o = program.ops[i];
    if (program.queues[static_cast<std::size_t>(o.queue)].marks) continue;
    next();
    j.raw("{\"args\":{");
    if (o.bytes_sent > 0) j.raw("\"bytes_sent\":").number(o.bytes_sent).raw(",");
    j.raw("\"layer\":").integer(o.layer).raw(",\"phase\":").string(std::string_view(&o.phase, 1)).raw("},\"dur\":");
    j.number((r.end_s[i] - r.start_s[i]) * 1e6).raw(",\"name\":").string(names[i]).raw(",\"ph\":\"X\",\"pid\":");
    j.integer(program.queues[static_cast<std::size_t>(o.queue)].device).raw(",\"tid\":").integer(track(static_cast<std::size_t>(o.queue), lanes.of_op[i]));
    j.raw(",\"ts\":").number(r.start_s[i] * 1e6).raw("}");
  }
  for (const auto& m : r.timeline) {
    next();
    j.raw("{\"args\":{\"hbm\":").number(m.hbm_bytes / kGiB).raw(",\"host\":").number(m.host_bytes / kGiB);
    j.raw("},\"name\":\"memory GiB\",\"ph\":\"C\",\"pid\":").integer(m.device).raw(",\"ts\":").number(m.time_s * 1e6).raw("}");
    next();
    j.raw("{\"args\":{");
    for (int c = 0; c < sim::kMemCategories; ++c) {
      if (c > 0) j.raw(",");
      j.string(sim::to_string(static_cast<sim::MemCategory>(c))).raw(":").number(m.hbm_by_category[static_cast<std::size_t>(c)] / kGiB);
    }
    j.raw("},\"name\":\"HBM by category GiB\",\"ph\":\"C\",\"pid\":").integer(m.device).raw(",\"ts\":").number(m.time_s * 1e6).raw("}");
  }
  j.raw("\n]}\n");
  return out;
}

}  // namespace hbmsim
