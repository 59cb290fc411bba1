#include "sim/comm.hpp"

#include <algorithm>
#include <cmath>

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

CommCost Network::cost(CommKind kind, double bytes, AxisSet group, const TokenRouting& routing) const {
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
    case CommKind::all_to_all:
      return routing.deduplicated() ? deduplicated_all_to_all(bytes, g, routing, eff) : all_to_all(bytes, g, eff);
    case CommKind::send_recv:  // to the next member of the group (a ring step; the slowest hop sets the pace)
      return hop(bytes, g.local == g.size ? kIntraDomain : kInterDomain, eff);
    case CommKind::none: break;
  }
  return {};
}

// Each device sends (G-1)/G of its buffer, the part for peers outside its domain over the path between
// domains. The device with the fewest peers nearby sets the pace.
CommCost Network::all_to_all(double bytes, const GroupPlacement& g, double eff) const {
  const auto G = static_cast<double>(g.size), local = static_cast<double>(g.local);
  const double leave = bytes * (G - 1) / G, out = bytes * (G - local) / G;
  return both_paths(leave - out, out, eff);
}

namespace {

// The chance that none of `per_token` experts, drawn without replacement from `experts`, is among `held`
// given ones.
double miss_probability(double experts, double per_token, double held) {
  double q = 1;
  for (double i = 0; i < per_token; ++i) q *= std::max(0.0, (experts - held - i) / (experts - i));
  return q;
}

// n choose j.
double choose(double n, double j) {
  double c = 1;
  for (double i = 0; i < j; ++i) c *= (n - i) / (j - i);
  return c;
}

// The same for `held` consecutive experts under the routing's groups: they touch m groups (whole ones, or
// part of one), h experts in each; a token picks j of those m with the hypergeometric chance of drawing
// groups_per_token of the groups, then misses the j h held among the picked groups' experts.
double miss_probability(const TokenRouting& r, double held) {
  if (r.groups <= 0) return miss_probability(r.experts, r.per_token, held);
  const double size = r.experts / r.groups, picked = r.groups_per_token;
  const double m = std::min(r.groups, std::ceil(held / size - 1e-9)), h = held / m;
  double q = 0;
  for (double j = 0; j <= std::min(m, picked); ++j) {
    if (picked - j > r.groups - m) continue;  // the picks outside the held groups do not fit
    const double chance = choose(m, j) * choose(r.groups - m, picked - j) / choose(r.groups, picked);
    q += chance * miss_probability(picked * size, r.per_token, j * h);
  }
  return q;
}

}  // namespace

// `bytes` is one copy per chosen expert, k = r.per_token copies of each token. With the experts laid evenly,
// E = X / G per member, a token reaches a given other member with p_gpu = 1 - miss(E) and a given domain of P
// members with p_dom = 1 - miss(P E) (miss under the routing's groups, if it has them). A device sends one copy to each other member of its own domain that
// holds a chosen expert, and one to each remote domain that does (to the GPU there with its own local index,
// as DeepEP's and HybridEP's RDMA kernels do); it forwards what it receives the same way (as much as it sends,
// by symmetry) to the other members of its domain that hold a chosen expert. Per copy of all its tokens:
//   inter-domain  R p_dom                          R = (G - D) / P remote domains, D the device's own members
//   intra-domain  (D - 1) p_gpu + R (P - 1) p_gpu  direct, then forwarded
// One expert per member in one domain gives (G - 1) k / G, the plain all-to-all's.
CommCost Network::deduplicated_all_to_all(double bytes, const GroupPlacement& g, const TokenRouting& r,
                                          double eff) const {
  const auto G = static_cast<double>(g.size), D = static_cast<double>(g.local), P = static_cast<double>(g.per_domain);
  const double per_copy = bytes / r.per_token, E = r.experts / G, R = (G - D) / P;
  const double p_gpu = 1 - miss_probability(r, E);
  const double p_dom = 1 - miss_probability(r, P * E);
  return both_paths(per_copy * ((D - 1) + R * (P - 1)) * p_gpu, per_copy * R * p_dom, eff);
}

CommCost Network::both_paths(double intra_bytes, double inter_bytes, double eff) const {
  CommCost c;
  double t_in = 0, t_out = 0;
  if (intra_bytes > 0) {
    c.bytes[kIntraDomain] = intra_bytes;
    t_in = intra_bytes / rate(kIntraDomain, eff) + paths_.intra.latency_s;
  }
  if (inter_bytes > 0) {
    c.bytes[kInterDomain] = inter_bytes;
    t_out = inter_bytes / rate(kInterDomain, eff) + paths_.inter.latency_s;
  }
  c.seconds = std::max(t_in, t_out);
  return c;
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
