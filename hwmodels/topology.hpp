// The cluster as a Boost.Graph: GPUs, host CPUs, NVLink switches, NICs and the scale-out network.
// Edges are links with per-direction bandwidth, latency and a sharing policy; copy and collective costs
// are derived from paths in this graph, not from constants.
#pragma once
#include <string>
#include <vector>

#include <boost/graph/adjacency_list.hpp>

#include "hwmodels/system.hpp"

namespace hbmsim {

enum class NodeKind { gpu, cpu, nvswitch, nic, network };

struct TopoNode {
  NodeKind kind;
  int index;  // GPU rank, CPU index, domain index, NIC index
  std::string label;
};

struct TopoLink {
  std::string name;
  double per_direction_bytes_per_s;  // capacity of the whole link, one direction
  double latency_s;
  LinkSharing sharing;
  int sharers;  // GPUs whose traffic crosses this link at once in an SPMD step
};

using TopologyGraph = boost::adjacency_list<boost::vecS, boost::vecS, boost::undirectedS, TopoNode, TopoLink>;

struct PathCost {
  double bytes_per_s = 0;  // bottleneck per-GPU share along the path, one direction
  double latency_s = 0;    // sum of link latencies
  std::vector<std::string> links;
};

class Topology {
 public:
  Topology(const System& system, int gpus);

  int gpus() const { return gpus_; }
  int domain_gpus() const { return domain_gpus_; }
  const TopologyGraph& graph() const { ensure_graph(); return graph_; }

  std::size_t gpu_vertex(int rank) const { ensure_graph(); return gpu_vertex_.at(static_cast<std::size_t>(rank)); }
  std::size_t cpu_vertex_of_gpu(int rank) const;

  // Cheapest-latency path between two vertices, with every link's per-GPU share applied.
  PathCost path(std::size_t from, std::size_t to) const;

  // Collective time over a group of `group_gpus` ranks spaced `stride` apart (one per GPU, SPMD; stride 1:
  // consecutive ranks, the innermost mesh axis), bandwidth terms scaled by `efficiency`. Hierarchical:
  // inside an NVLink domain over scale-up, between domains over scale-out NICs. `bytes` is the full
  // (gathered) buffer size for all-gather / reduce-scatter, and the bytes each GPU sends for all-to-all.
  double all_gather_s(double bytes, int group_gpus, double efficiency, int stride = 1) const;
  double reduce_scatter_s(double bytes, int group_gpus, double efficiency, int stride = 1) const;
  double all_to_all_s(double bytes, int group_gpus, double efficiency, int stride = 1) const;

 private:
  double ring_s(double bytes, int group_gpus, double efficiency, int stride) const;
  int members_per_domain(int group, int stride) const;
  // The graph is built on the first path query: collective costs need only the fabric figures, and the
  // simulator builds a Topology for every step.
  void ensure_graph() const;

  const System* system_;
  int gpus_;
  int domain_gpus_;
  mutable bool built_ = false;
  mutable TopologyGraph graph_;
  mutable std::vector<std::size_t> gpu_vertex_;
  mutable std::vector<std::size_t> cpu_vertex_;
};

}  // namespace hbmsim
