#include "hwmodels/topology.hpp"

#include <algorithm>
#include <limits>
#include <queue>
#include <tuple>

#include "hwmodels/json_view.hpp"

namespace hbmsim {

Topology::Topology(const System& system, int gpus) : system_(&system), gpus_(gpus) {
  if (gpus <= 0) throw InputError("gpus = " + std::to_string(gpus) + " (must be > 0)");
  // A job fills every scale-up domain it uses with the same number of GPUs, the most that divides its GPU
  // count (128 GPUs on NVL72 racks: 64 per rack, whole compute trays, as large GB200 jobs are laid out).
  domain_gpus_ = std::min(gpus, system.scale_up.domain_gpus);
  while (gpus % domain_gpus_ != 0) --domain_gpus_;
  const int per_cpu = std::max(1, system.host_cpu.gpus_per_cpu);
  const long long two_domains = 2LL * domain_gpus_;
  window_ = static_cast<int>(std::min<long long>(gpus, (two_domains + per_cpu - 1) / per_cpu * per_cpu));
}

void Topology::ensure_graph() const {
  if (built_) return;
  built_ = true;
  const System& system = *system_;
  const int gpus = window_;
  const int per_cpu = std::max(1, system.host_cpu.gpus_per_cpu);
  const int cpus = (gpus + per_cpu - 1) / per_cpu;
  const int domains = (gpus + domain_gpus_ - 1) / domain_gpus_;

  auto net = boost::add_vertex(TopoNode{NodeKind::network, 0, "scale-out network"}, graph_);
  std::vector<std::size_t> switches;
  for (int d = 0; d < domains; ++d)
    switches.push_back(boost::add_vertex(TopoNode{NodeKind::nvswitch, d, "nvlink-domain" + std::to_string(d)}, graph_));
  for (int c = 0; c < cpus; ++c)
    cpu_vertex_.push_back(boost::add_vertex(TopoNode{NodeKind::cpu, c, system.host_cpu.name + std::to_string(c)}, graph_));

  const auto& hl = system.host_link;
  const auto& up = system.scale_up;
  const auto& out = system.scale_out;
  const double inf = std::numeric_limits<double>::infinity();
  // The data files give end-to-end latencies (GPU to GPU through one switch); a path crosses two edges to
  // reach the other GPU, so each edge carries half.
  for (int r = 0; r < gpus; ++r) {
    auto v = boost::add_vertex(TopoNode{NodeKind::gpu, r, "gpu" + std::to_string(r)}, graph_);
    gpu_vertex_.push_back(v);
    // A shared host link carries every sharer's traffic at once: each GPU's edge records the capacity and
    // how many GPUs split it.
    boost::add_edge(v, cpu_vertex_[static_cast<std::size_t>(r / per_cpu)],
                    TopoLink{hl.name, hl.per_direction_bytes_per_s, hl.latency_s, hl.sharing, hl.gpus_sharing}, graph_);
    boost::add_edge(v, switches[static_cast<std::size_t>(r / domain_gpus_)],
                    TopoLink{up.name, up.per_gpu_bytes_per_s_per_direction, up.latency_s / 2, LinkSharing::dedicated, 1},
                    graph_);
    auto nic = boost::add_vertex(TopoNode{NodeKind::nic, r, "nic" + std::to_string(r)}, graph_);
    boost::add_edge(v, nic, TopoLink{"pcie-nic", inf, 0.0, LinkSharing::dedicated, 1}, graph_);
    boost::add_edge(nic, net,
                    TopoLink{out.name, out.per_gpu_bytes_per_s_per_direction, out.latency_s / 2, LinkSharing::dedicated, 1},
                    graph_);
  }
}

std::size_t Topology::gpu_vertex(int rank) const {
  ensure_graph();
  if (rank < 0 || rank >= window_)
    throw std::out_of_range("gpu rank " + std::to_string(rank) + " outside the topology window of " + std::to_string(window_));
  return gpu_vertex_[static_cast<std::size_t>(rank)];
}

std::size_t Topology::cpu_vertex_of_gpu(int rank) const {
  ensure_graph();
  return cpu_vertex_.at(static_cast<std::size_t>(rank / std::max(1, system_->host_cpu.gpus_per_cpu)));
}

std::int64_t Topology::domain_of(std::int64_t rank) const {
  // Inside the window this is the NVSwitch the GPU's vertex hangs off; beyond it the same rule repeats.
  if (rank < window_) {
    const auto v = gpu_vertex(static_cast<int>(rank));
    for (auto [e, end] = boost::out_edges(v, graph_); e != end; ++e) {
      const auto& node = graph_[boost::target(*e, graph_)];
      if (node.kind == NodeKind::nvswitch) return node.index;
    }
  }
  return rank / domain_gpus_;
}

namespace {
double share_of(const TopoLink& l) {
  double share = l.per_direction_bytes_per_s / std::max(1, l.sharers);
  return l.sharing == LinkSharing::half_duplex ? share / 2 : share;
}
}  // namespace

PathCost Topology::path(std::size_t from, std::size_t to) const {
  ensure_graph();
  // Widest path, ties by the lower summed latency: Dijkstra on (width, -latency), since the bottleneck only
  // shrinks and the latency only grows along a path.
  const auto n = boost::num_vertices(graph_);
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<double> width(n, -1), latency(n, inf);
  std::vector<std::size_t> pred(n, n);
  std::vector<bool> done(n, false);
  using Label = std::tuple<double, double, std::size_t>;  // width, -latency, vertex: largest first
  std::priority_queue<Label> heap;
  width[from] = inf;
  latency[from] = 0;
  heap.emplace(inf, 0.0, from);
  while (!heap.empty()) {
    auto [w_u, neg_lat, u] = heap.top();
    heap.pop();
    if (done[u]) continue;
    done[u] = true;
    if (u == to) break;
    for (auto [e, end] = boost::out_edges(u, graph_); e != end; ++e) {
      auto v = boost::target(*e, graph_);
      const auto& l = graph_[*e];
      double w = std::min(width[u], share_of(l)), lat = latency[u] + l.latency_s;
      if (!done[v] && (w > width[v] || (w == width[v] && lat < latency[v]))) {
        width[v] = w;
        latency[v] = lat;
        pred[v] = u;
        heap.emplace(w, -lat, v);
      }
    }
  }
  if (from != to && pred[to] == n) return PathCost{};
  PathCost cost{width[to], latency[to], {}, {}};
  double narrowest = inf;
  for (auto v = to; v != from; v = pred[v]) {
    auto [e, ok] = boost::edge(pred[v], v, graph_);
    cost.links.insert(cost.links.begin(), graph_[e].name);
    if (share_of(graph_[e]) < narrowest) {
      narrowest = share_of(graph_[e]);
      cost.bottleneck = graph_[e].name;
    }
  }
  return cost;
}

}  // namespace hbmsim
