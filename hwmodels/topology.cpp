#include "hwmodels/topology.hpp"

#include <algorithm>
#include <cmath>
#include <limits>


namespace hbmsim {

Topology::Topology(const System& system, int gpus) : system_(&system), gpus_(gpus) {
  if (gpus <= 0) throw InputError("gpus = " + std::to_string(gpus) + " (must be > 0)");
  domain_gpus_ = std::min(gpus, system.scale_up.domain_gpus);
}

void Topology::ensure_graph() const {
  if (built_) return;
  built_ = true;
  const System& system = *system_;
  const int gpus = gpus_;
  const int cpus = (gpus + system.host_cpu.gpus_per_cpu - 1) / system.host_cpu.gpus_per_cpu;
  const int domains = (gpus + domain_gpus_ - 1) / domain_gpus_;

  auto net = boost::add_vertex(TopoNode{NodeKind::network, 0, "scale-out network"}, graph_);
  std::vector<std::size_t> switches;
  for (int d = 0; d < domains; ++d)
    switches.push_back(boost::add_vertex(TopoNode{NodeKind::nvswitch, d, "nvlink-domain" + std::to_string(d)}, graph_));
  for (int c = 0; c < cpus; ++c)
    cpu_vertex_.push_back(boost::add_vertex(TopoNode{NodeKind::cpu, c, system.host_cpu.name + std::to_string(c)}, graph_));

  const auto& hl = system.host_link;
  const double inf = std::numeric_limits<double>::infinity();
  for (int r = 0; r < gpus; ++r) {
    auto v = boost::add_vertex(TopoNode{NodeKind::gpu, r, "gpu" + std::to_string(r)}, graph_);
    gpu_vertex_.push_back(v);
    // A shared host link carries every sharer's traffic at once: each GPU's edge records the capacity and
    // how many GPUs split it.
    boost::add_edge(v, cpu_vertex_[static_cast<std::size_t>(r / system.host_cpu.gpus_per_cpu)],
                    TopoLink{hl.name, hl.per_direction_bytes_per_s, hl.latency_s, hl.sharing, hl.gpus_sharing}, graph_);
    const auto& up = system.scale_up;
    boost::add_edge(v, switches[r / domain_gpus_],
                    TopoLink{up.name, up.per_gpu_bytes_per_s_per_direction, up.latency_s, LinkSharing::dedicated, 1},
                    graph_);
    const auto& out = system.scale_out;
    auto nic = boost::add_vertex(TopoNode{NodeKind::nic, r, "nic" + std::to_string(r)}, graph_);
    boost::add_edge(v, nic, TopoLink{"pcie-nic", inf, 0.0, LinkSharing::dedicated, 1}, graph_);
    boost::add_edge(nic, net,
                    TopoLink{out.name, out.per_gpu_bytes_per_s_per_direction, out.latency_s, LinkSharing::dedicated, 1},
                    graph_);
  }
}

std::size_t Topology::cpu_vertex_of_gpu(int rank) const {
  ensure_graph();
  return cpu_vertex_.at(rank / system_->host_cpu.gpus_per_cpu);
}

namespace {
double share_of(const TopoLink& l) {
  double share = l.per_direction_bytes_per_s / std::max(1, l.sharers);
  return l.sharing == LinkSharing::half_duplex ? share / 2 : share;
}
}  // namespace

PathCost Topology::path(std::size_t from, std::size_t to) const {
  ensure_graph();
  // Widest path (largest bottleneck share), ties broken by the lower summed latency: a Dijkstra-style
  // label-setting search, since the bottleneck only shrinks along a path.
  const auto n = boost::num_vertices(graph_);
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<double> width(n, -1), latency(n, inf);
  std::vector<std::size_t> pred(n, n);
  std::vector<bool> done(n, false);
  width[from] = inf;
  latency[from] = 0;
  for (;;) {
    std::size_t u = n;
    for (std::size_t v = 0; v < n; ++v)
      if (!done[v] && width[v] >= 0 &&
          (u == n || width[v] > width[u] || (width[v] == width[u] && latency[v] < latency[u])))
        u = v;
    if (u == n || u == to) break;
    done[u] = true;
    for (auto [e, end] = boost::out_edges(u, graph_); e != end; ++e) {
      auto v = boost::target(*e, graph_);
      const auto& l = graph_[*e];
      double w = std::min(width[u], share_of(l)), lat = latency[u] + l.latency_s;
      if (!done[v] && (w > width[v] || (w == width[v] && lat < latency[v]))) {
        width[v] = w;
        latency[v] = lat;
        pred[v] = u;
      }
    }
  }
  if (from != to && pred[to] == n) return PathCost{0, 0, {}};
  PathCost cost{width[to], latency[to], {}};
  for (auto v = to; v != from; v = pred[v]) {
    auto [e, ok] = boost::edge(pred[v], v, graph_);
    cost.links.insert(cost.links.begin(), graph_[e].name);
  }
  return cost;
}

// A group whose members are `stride` ranks apart has at most domain/stride of them in one NVLink domain.
int Topology::members_per_domain(int group, int stride) const {
  const int spacing = std::max(stride, 1);
  return std::max(1, std::min(group, domain_gpus_ / spacing));
}

double Topology::ring_s(double bytes, int group, double efficiency, int stride) const {
  if (group <= 1 || bytes <= 0) return 0;
  group = std::min(group, gpus_);
  const int in_domain = members_per_domain(group, stride);
  const int domains = (group + in_domain - 1) / in_domain;
  const auto& up = system_->scale_up;
  const auto& out = system_->scale_out;
  // Intra-domain ring over NVLink: each GPU receives (D-1)/D of its domain's share of the buffer.
  double t = in_domain > 1 ? bytes * (in_domain - 1) / in_domain / (up.per_gpu_bytes_per_s_per_direction * efficiency) +
                                 (in_domain - 1) * up.latency_s
                           : 0.0;
  if (domains > 1) {
    // Between domains only each GPU's own slice travels: (K-1)/G of the buffer per GPU over its NIC.
    t += bytes * (domains - 1) / group / (out.per_gpu_bytes_per_s_per_direction * efficiency) +
         (domains - 1) * out.latency_s;
  }
  return t;
}

double Topology::all_gather_s(double bytes, int group, double efficiency, int stride) const {
  return ring_s(bytes, group, efficiency, stride);
}
double Topology::reduce_scatter_s(double bytes, int group, double efficiency, int stride) const {
  return ring_s(bytes, group, efficiency, stride);
}

double Topology::all_to_all_s(double bytes, int group, double efficiency, int stride) const {
  if (group <= 1 || bytes <= 0) return 0;
  group = std::min(group, gpus_);
  const int in_domain = members_per_domain(group, stride);
  const auto& up = system_->scale_up;
  const auto& out = system_->scale_out;
  double leave_gpu = bytes * (group - 1) / group;
  double leave_domain = bytes * (group - in_domain) / group;
  double t_up = (leave_gpu - leave_domain) / (up.per_gpu_bytes_per_s_per_direction * efficiency) + up.latency_s;
  double t_out = leave_domain > 0 ? leave_domain / (out.per_gpu_bytes_per_s_per_direction * efficiency) + out.latency_s : 0;
  return std::max(t_up, t_out);
}

}  // namespace hbmsim
