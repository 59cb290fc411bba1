#include "sim/chrome_trace.hpp"

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
  for (std::size_t q = 0; q < program.queues.size(); ++q) {
    if (program.queues[q].marks) continue;
    next();
    j.raw("{\"args\":{\"name\":").string(program.queues[q].name).raw("},\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":");
    j.integer(program.queues[q].device).raw(",\"tid\":").integer(static_cast<long long>(q)).raw("}");
  }
  for (std::size_t i = 0; i < program.ops.size(); ++i) {
    const auto& o = program.ops[i];
    if (program.queues[static_cast<std::size_t>(o.queue)].marks) continue;
    next();
    j.raw("{\"args\":{");
    if (o.bytes_sent > 0) j.raw("\"bytes_sent\":").number(o.bytes_sent).raw(",");
    j.raw("\"layer\":").integer(o.layer).raw(",\"phase\":").string(std::string_view(&o.phase, 1)).raw("},\"dur\":");
    j.number((r.end_s[i] - r.start_s[i]) * 1e6).raw(",\"name\":").string(names[i]).raw(",\"ph\":\"X\",\"pid\":");
    j.integer(program.queues[static_cast<std::size_t>(o.queue)].device).raw(",\"tid\":").integer(o.queue);
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
