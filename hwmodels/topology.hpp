// The cluster as a Boost.Graph: GPUs, host CPUs, NVLink switches, NICs and the scale-out network. Edges are
// links with per-direction bandwidth, latency and a sharing policy; which links a communication group
// crosses, and at what bandwidth, are paths in this graph (hwmodels/mesh.hpp asks it).
#pragma once
#include <cstdint>
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
  double latency_s;                  // this edge's share of the end-to-end latency the data file gives
  LinkSharing sharing;
  int sharers;  // GPUs whose traffic crosses this link at once in an SPMD step
};

using TopologyGraph = boost::adjacency_list<boost::vecS, boost::vecS, boost::undirectedS, TopoNode, TopoLink>;

struct PathCost {
  double bytes_per_s = 0;  // bottleneck per-GPU share along the path, one direction
  double latency_s = 0;    // sum of link latencies
  std::vector<std::string> links;
  std::string bottleneck;  // name of the link that sets bytes_per_s
};

class Topology {
 public:
  Topology(const System& system, int gpus);

  const System& system() const { return *system_; }
  int gpus() const { return gpus_; }
  // GPUs of the job in one scale-up domain: the most, up to the domain's size, that divides the GPU count.
  int domain_gpus() const { return domain_gpus_; }
  // The graph holds the GPUs of the first two scale-up domains (every domain is built alike, so a path from
  // rank 0 to any GPU has the links and bandwidth of a path to one of these).
  int window_gpus() const { return window_; }
  const TopologyGraph& graph() const { ensure_graph(); return graph_; }

  std::size_t gpu_vertex(int rank) const;
  std::size_t cpu_vertex_of_gpu(int rank) const;
  // The scale-up domain a GPU's rank sits in (its NVSwitch vertex inside the window).
  std::int64_t domain_of(std::int64_t rank) const;

  // Widest path (largest bottleneck share), ties broken by the lower summed latency, with every link's
  // per-GPU share applied.
  PathCost path(std::size_t from, std::size_t to) const;

 private:
  // The graph is built on the first query: a sweep builds a Topology per step and reuses cached answers.
  void ensure_graph() const;

  const System* system_;
  int gpus_;
  int domain_gpus_;
  int window_;
  mutable bool built_ = false;
  mutable TopologyGraph graph_;
  mutable std::vector<std::size_t> gpu_vertex_;
  mutable std::vector<std::size_t> cpu_vertex_;
};

}  // namespace hbmsim
