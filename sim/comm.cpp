#include "sim/comm.hpp"

#include <algorithm>

namespace hbmsim {

Network::Network(const System& sys, const Mesh& mesh)
    : sys_(sys), mesh_(mesh), topo_(sys, static_cast<int>(std::min<std::int64_t>(mesh.devices(), 1 << 30))),
      paths_(fabric_paths(topo_)), scale_out_(sys.efficiency.scale_out_collective_factor) {}

const GroupPlacement& Network::placement(AxisSet group) const {
  for (const auto& [g, p] : placements_)
    if (g == group) return p;
  placements_.emplace_back(group, place_group(topo_, mesh_, group));
  return placements_.back().second;
}

// Hierarchical ring over a buffer of `bytes`: inside each domain over the scale-up path, each device
// passing (D-1)/D of its domain's buffer; between domains only each device's own slice, (K-1)/G of the
// buffer, over the path between domains. One latency per ring step.
CommCost Network::ring(double bytes, const GroupPlacement& g, double eff) const {
  CommCost c;
  const auto D = static_cast<double>(g.per_domain), K = static_cast<double>(g.domains), G = static_cast<double>(g.size);
  const PathCost &intra = paths_.intra, &inter = paths_.inter;
  if (g.per_domain > 1) {
    c.bytes[kIntraDomain] = bytes * (D - 1) / D;
    c.seconds += c.bytes[kIntraDomain] / rate(kIntraDomain, eff) + (D - 1) * intra.latency_s;
  }
  if (g.domains > 1) {
    c.bytes[kInterDomain] = bytes * (K - 1) / G;
    c.seconds += c.bytes[kInterDomain] / rate(kInterDomain, eff) + (K - 1) * inter.latency_s;
  }
  return c;
}

CommCost Network::cost(CommKind kind, double bytes, AxisSet group) const {
  const auto& g = placement(group);
  if (g.size <= 1 || bytes <= 0 || kind == CommKind::none) return {};
  const double eff = sys_.efficiency.collective.at(std::max(bytes, 1.0));
  switch (kind) {
    case CommKind::all_gather:
    case CommKind::reduce_scatter: return ring(bytes, g, eff);
    case CommKind::all_reduce: {  // reduce-scatter then all-gather
      CommCost c = ring(bytes, g, eff);
      c.seconds *= 2;
      for (double& b : c.bytes) b *= 2;
      return c;
    }
    case CommKind::all_to_all: {
      // Each device sends (G-1)/G of its buffer, the part for peers outside its domain over the path
      // between domains; the two paths run at once. The device with the fewest peers nearby sets the pace.
      CommCost c;
      const double leave = bytes * static_cast<double>(g.size - 1) / static_cast<double>(g.size);
      const double out = bytes * static_cast<double>(g.size - g.local) / static_cast<double>(g.size);
      double t_in = 0, t_out = 0;
      if (leave - out > 0) {
        c.bytes[kIntraDomain] = leave - out;
        t_in = c.bytes[kIntraDomain] / rate(kIntraDomain, eff) + paths_.intra.latency_s;
      }
      if (out > 0) {
        c.bytes[kInterDomain] = out;
        t_out = c.bytes[kInterDomain] / rate(kInterDomain, eff) + paths_.inter.latency_s;
      }
      c.seconds = std::max(t_in, t_out);
      return c;
    }
    case CommKind::send_recv:  // to the next member of the group (a ring step; the slowest hop sets the pace)
      return hop(bytes, g.local == g.size ? kIntraDomain : kInterDomain, eff);
    case CommKind::none: break;
  }
  return {};
}

CommCost Network::hop(double bytes, int level, double eff) const {
  CommCost c;
  const PathCost& p = paths_.at(level);
  c.bytes[static_cast<std::size_t>(level)] = bytes;
  c.seconds = bytes / rate(level, eff) + p.latency_s;
  return c;
}

bool Network::crosses_domain(Axis axis, std::int64_t from, std::int64_t to) const {
  auto known = std::find_if(crossings_.begin(), crossings_.end(),
                            [&](const Crossing& x) { return x.axis == axis && x.from == from && x.to == to; });
  if (known != crossings_.end()) return known->crosses;
  // Every rank whose index along the axis is 0 starts an instance; the layout repeats, so the first million
  // instances decide.
  const std::int64_t stride = mesh_.stride(axis), size = mesh_.size(axis), devices = mesh_.devices();
  bool crosses = false;
  std::int64_t seen = 0;
  for (std::int64_t r = 0; r < devices && !crosses && seen < (1 << 20); ++r) {
    if ((r / stride) % size != 0) continue;
    ++seen;
    crosses = topo_.domain_of(r + from * stride) != topo_.domain_of(r + to * stride);
  }
  crossings_.push_back({axis, from, to, crosses});
  return crosses;
}

CommCost Network::point_to_point(double bytes, Axis axis, std::int64_t from, std::int64_t to) const {
  if (bytes <= 0 || from == to) return {};
  return hop(bytes, crosses_domain(axis, from, to) ? kInterDomain : kIntraDomain,
             sys_.efficiency.collective.at(std::max(bytes, 1.0)));
}

}  // namespace hbmsim
