#include "sim/comm.hpp"

#include <algorithm>

namespace hbmsim {

Network::Network(const System& sys, const Mesh& mesh)
    : sys_(sys), mesh_(mesh), topo_(sys, static_cast<int>(std::min<std::int64_t>(mesh.devices(), 1 << 30))) {}

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
  if (g.per_domain > 1) {
    c.links[0] = {g.intra.bottleneck, g.intra.bytes_per_s, bytes * (D - 1) / D};
    c.seconds += c.links[0].bytes / (g.intra.bytes_per_s * eff) + (D - 1) * g.intra.latency_s;
  }
  if (g.domains > 1) {
    c.links[1] = {g.inter.bottleneck, g.inter.bytes_per_s, bytes * (K - 1) / G};
    c.seconds += c.links[1].bytes / (g.inter.bytes_per_s * eff) + (K - 1) * g.inter.latency_s;
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
      for (auto& l : c.links) l.bytes *= 2;
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
        c.links[0] = {g.intra.bottleneck, g.intra.bytes_per_s, leave - out};
        t_in = c.links[0].bytes / (g.intra.bytes_per_s * eff) + g.intra.latency_s;
      }
      if (out > 0) {
        c.links[1] = {g.inter.bottleneck, g.inter.bytes_per_s, out};
        t_out = c.links[1].bytes / (g.inter.bytes_per_s * eff) + g.inter.latency_s;
      }
      c.seconds = std::max(t_in, t_out);
      return c;
    }
    case CommKind::send_recv: {  // to the next member of the group (a ring step; the slowest hop sets the pace)
      CommCost c;
      const bool near = g.local == g.size;
      const PathCost& p = near ? g.intra : g.inter;
      c.links[near ? 0 : 1] = {p.bottleneck, p.bytes_per_s, bytes};
      c.seconds = bytes / (p.bytes_per_s * eff) + p.latency_s;
      return c;
    }
    case CommKind::none: break;
  }
  return {};
}

}  // namespace hbmsim
