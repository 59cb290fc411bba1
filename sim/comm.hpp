// Communication as data: a collective is {kind, mesh group, bytes}; its time and the link bandwidth it uses
// come from where the group runs on the topology (hwmodels/mesh.hpp). In the manner of Calculon's
// Network.time(op, size, group).
#pragma once
#include <algorithm>
#include <array>
#include <string>
#include <deque>
#include <utility>
#include <vector>

#include "hwmodels/mesh.hpp"
#include "hwmodels/system.hpp"
#include "workloads/step_graph.hpp"

namespace hbmsim {

// A communication's time, and the bytes this device sends over each path level (kIntraDomain,
// kInterDomain; Network::path says which link that is).
struct CommCost {
  double seconds = 0;
  std::array<double, 2> bytes{0, 0};
  double bytes_sent() const { return bytes[0] + bytes[1]; }
};

class Network {
 public:
  Network(const System& sys, const Mesh& mesh);

  const Mesh& mesh() const { return mesh_; }
  const GroupPlacement& placement(AxisSet group) const;
  const PathCost& path(int level) const { return paths_.at(level); }
  // `bytes`: the whole (gathered) buffer for all-gather, reduce-scatter and all-reduce; what each device
  // sends for all-to-all (one copy per chosen expert; `routing`, when given, deduplicates them) and
  // send/recv. A group of one costs nothing.
  CommCost cost(CommKind kind, double bytes, AxisSet group, const TokenRouting& routing = {}) const;
  // `bytes` sent from the member at index `from` along `axis` to the one at `to` (a pipeline stage to its
  // neighbour), every other coordinate alike: over the path between domains if any instance crosses one.
  CommCost point_to_point(double bytes, Axis axis, std::int64_t from, std::int64_t to) const;

 private:
  CommCost ring(double bytes, const GroupPlacement& g, double eff) const;
  CommCost all_to_all(double bytes, const GroupPlacement& g, double eff) const;
  CommCost deduplicated_all_to_all(double bytes, const GroupPlacement& g, const TokenRouting& r, double eff) const;
  // The two paths at once: `bytes` over each level, the slower setting the pace.
  CommCost both_paths(double intra_bytes, double inter_bytes, double eff) const;
  // `bytes` to one peer over the path of `level`.
  CommCost hop(double bytes, int level, double eff) const;
  // What a collective moves over the path of `level` per second at efficiency `eff` (the NIC path between
  // domains at its own extra factor, never past the path's bandwidth).
  double rate(int level, double eff) const {
    return paths_.at(level).bytes_per_s * (level == kInterDomain ? std::min(1.0, eff * scale_out_) : eff);
  }
  // Whether some instance of the pair (from, to) along `axis` crosses a domain boundary (cached).
  bool crosses_domain(Axis axis, std::int64_t from, std::int64_t to) const;

  const System& sys_;
  Mesh mesh_;
  Topology topo_;
  FabricPaths paths_;
  double scale_out_;  // the collective efficiency's extra factor between domains
  mutable std::deque<std::pair<AxisSet, GroupPlacement>> placements_;  // asked so far (stable references)
  struct Crossing {
    Axis axis;
    std::int64_t from, to;
    bool crosses;
  };
  mutable std::vector<Crossing> crossings_;  // point-to-point paths asked so far
};

}  // namespace hbmsim
