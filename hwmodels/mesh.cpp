#include "hwmodels/mesh.hpp"

#include <algorithm>
#include <map>
#include <tuple>
#include <vector>

#include "hwmodels/json_view.hpp"

namespace hbmsim {

const char* to_string(Axis a) {
  switch (a) {
    case Axis::dp: return "dp";
    case Axis::pp: return "pp";
    case Axis::fsdp: return "fsdp";
    case Axis::ep: return "ep";
    case Axis::cp: return "cp";
    case Axis::tp: return "tp";
  }
  return "?";
}

std::string AxisSet::name() const {
  std::string out;
  for (Axis a : kAllAxes)
    if (has(a)) out += (out.empty() ? "" : "+") + std::string(to_string(a));
  return out.empty() ? "none" : out;
}

MeshOrder maxtext_mesh_order() { return {Axis::dp, Axis::pp, Axis::fsdp, Axis::cp, Axis::tp, Axis::ep}; }
MeshOrder megatron_mesh_order() { return {Axis::pp, Axis::dp, Axis::fsdp, Axis::ep, Axis::cp, Axis::tp}; }

MeshOrder parse_mesh_order(const std::string& text, const std::string& where) {
  if (text == "maxtext") return maxtext_mesh_order();
  if (text == "megatron") return megatron_mesh_order();
  MeshOrder order{};
  std::vector<bool> seen(kAxisCount, false);
  std::size_t pos = 0, n = 0;
  auto fail = [&](const std::string& why) {
    throw InputError(where + " = " + quote(text) + " (" + why +
                     "; expected maxtext, megatron, or all of dp,pp,fsdp,ep,cp,tp outermost first)");
  };
  while (pos <= text.size()) {
    auto end = text.find(',', pos);
    auto name = text.substr(pos, end == std::string::npos ? std::string::npos : end - pos);
    auto it = std::find_if(kAllAxes.begin(), kAllAxes.end(), [&](Axis a) { return name == to_string(a); });
    if (it == kAllAxes.end()) fail("unknown axis " + quote(name));
    if (seen[static_cast<std::size_t>(*it)]) fail("axis " + name + " given twice");
    if (n == kAxisCount) fail("too many axes");
    seen[static_cast<std::size_t>(*it)] = true;
    order[n++] = *it;
    if (end == std::string::npos) break;
    pos = end + 1;
  }
  if (n != kAxisCount) fail("every axis must be placed");
  return order;
}

std::string mesh_order_name(const MeshOrder& order) {
  if (order == maxtext_mesh_order()) return "maxtext";
  if (order == megatron_mesh_order()) return "megatron";
  std::string out;
  for (Axis a : order) out += (out.empty() ? "" : ",") + std::string(to_string(a));
  return out;
}

std::int64_t Mesh::size(AxisSet s) const {
  std::int64_t n = 1;
  for (Axis a : kAllAxes)
    if (s.has(a)) n *= size(a);
  return n;
}

std::int64_t Mesh::stride(Axis a) const {
  std::int64_t s = 1;
  for (auto it = order.rbegin(); it != order.rend() && *it != a; ++it) s *= size(*it);
  return s;
}

std::string Mesh::describe() const {
  std::string out;
  for (Axis a : order)
    if (size(a) > 1) out += (out.empty() ? "" : " x ") + std::string(to_string(a)) + " " + std::to_string(size(a));
  if (out.empty()) out = "1 device";
  return out + " (" + mesh_order_name(order) + " order)";
}

namespace {

using Dims = std::vector<std::pair<std::int64_t, std::int64_t>>;  // (stride, size) per axis

Dims dims_of(const Mesh& mesh, AxisSet axes) {
  Dims d;
  for (Axis a : kAllAxes)
    if (axes.has(a) && mesh.size(a) > 1) d.emplace_back(mesh.stride(a), mesh.size(a));
  return d;
}

// Calls f(rank) for every combination of the digits in `dims` added to `base`, stopping once f returns false.
template <class F>
bool each_rank(const Dims& dims, std::int64_t base, F&& f, std::size_t d = 0) {
  if (d == dims.size()) return f(base);
  for (std::int64_t i = 0; i < dims[d].second; ++i)
    if (!each_rank(dims, base + i * dims[d].first, f, d + 1)) return false;
  return true;
}

// Every instance of the group (one per combination of the other axes) is a ring of its own; an SPMD step
// waits for the slowest. Its shape: the instance spanning the most domains (then the most members in one),
// and, over all members, the fewest peers sharing a member's domain (what an all-to-all keeps local).
GroupPlacement compute_placement(const Topology& topo, const Mesh& mesh, AxisSet group) {
  GroupPlacement p;
  p.size = mesh.size(group);
  if (p.size <= 1) return p;
  const Dims members = dims_of(mesh, group), others = dims_of(mesh, kAllAxesSet().without(group));
  // Layouts repeat; a bounded number of instances shows every shape a regular mesh has.
  constexpr std::int64_t kVisits = 1 << 21;
  std::int64_t budget = std::max<std::int64_t>(1, kVisits / p.size);
  p.domains = 0;
  p.local = p.size;
  std::vector<std::int64_t> doms;
  each_rank(others, 0, [&](std::int64_t base) {
    doms.clear();
    each_rank(members, base, [&](std::int64_t r) {
      doms.push_back(topo.domain_of(r));
      return true;
    });
    std::sort(doms.begin(), doms.end());
    std::int64_t spanned = 0, most = 0;
    for (std::size_t i = 0; i < doms.size();) {
      std::size_t j = i;
      while (j < doms.size() && doms[j] == doms[i]) ++j;
      const auto n = static_cast<std::int64_t>(j - i);
      ++spanned;
      most = std::max(most, n);
      p.local = std::min(p.local, n);
      i = j;
    }
    if (spanned > p.domains || (spanned == p.domains && most > p.per_domain)) {
      p.domains = spanned;
      p.per_domain = most;
    }
    return --budget > 0;
  });
  return p;
}

// What the fabric's paths depend on.
struct FabricKey {
  std::string up, out, host;
  double up_bw, up_lat, out_bw, out_lat, host_bw, host_lat;
  int host_sharers, domain, window;
  auto tie() const { return std::tie(up, out, host, up_bw, up_lat, out_bw, out_lat, host_bw, host_lat, host_sharers, domain, window); }
  bool operator<(const FabricKey& o) const { return tie() < o.tie(); }
};

// What a placement depends on: the fabric figures, the window, and the group's strides and sizes.
struct PlacementKey {
  std::string up, out;
  double up_bw, up_lat, out_bw, out_lat, host_bw;  // a path could run through a host CPU
  int host_sharers, domain, window, gpus;
  Dims dims, others;
  auto tie() const {
    return std::tie(up, out, up_bw, up_lat, out_bw, out_lat, host_bw, host_sharers, domain, window, gpus, dims, others);
  }
  bool operator<(const PlacementKey& o) const { return tie() < o.tie(); }
};

}  // namespace

FabricPaths fabric_paths(const Topology& topo) {
  const System& s = topo.system();
  const FabricKey key{s.scale_up.name, s.scale_out.name, s.host_link.name,
                      s.scale_up.per_gpu_bytes_per_s_per_direction, s.scale_up.latency_s,
                      s.scale_out.per_gpu_bytes_per_s_per_direction, s.scale_out.latency_s,
                      s.host_link.per_direction_bytes_per_s, s.host_link.latency_s, s.host_link.gpus_sharing,
                      topo.domain_gpus(), topo.window_gpus()};
  // Per thread: sweep workers look these up for every step, and a shared cache would make them queue.
  thread_local std::map<FabricKey, FabricPaths> cache;
  if (auto it = cache.find(key); it != cache.end()) return it->second;
  FabricPaths f;
  // The peer stands for every hop of a ring inside a domain, so it must not share GPU 0's host CPU where the
  // domain spans more than one: a ring crosses CPUs, and the path through their shared host memory (which a
  // what-if NVLink slower than the host link would make the widest) exists only between a CPU's own GPUs.
  const int per_cpu = std::max(1, s.host_cpu.gpus_per_cpu);
  if (topo.domain_gpus() > 1)
    f.intra = topo.path(topo.gpu_vertex(0), topo.gpu_vertex(topo.domain_gpus() > per_cpu ? per_cpu : 1));
  if (topo.window_gpus() > topo.domain_gpus()) f.inter = topo.path(topo.gpu_vertex(0), topo.gpu_vertex(topo.domain_gpus()));
  if (cache.size() > 4096) cache.clear();  // a bound for endless what-if sweeps over fabric figures
  return cache.emplace(key, f).first->second;
}

GroupPlacement place_group(const Topology& topo, const Mesh& mesh, AxisSet group) {
  const System& s = topo.system();
  PlacementKey key{s.scale_up.name, s.scale_out.name, s.scale_up.per_gpu_bytes_per_s_per_direction,
                   s.scale_up.latency_s, s.scale_out.per_gpu_bytes_per_s_per_direction, s.scale_out.latency_s,
                   s.host_link.per_direction_bytes_per_s, s.host_link.gpus_sharing, topo.domain_gpus(),
                   topo.window_gpus(), topo.gpus(), {}, {}};
  key.dims = dims_of(mesh, group);
  key.others = dims_of(mesh, kAllAxesSet().without(group));
  thread_local std::map<PlacementKey, GroupPlacement> cache;  // per thread, as fabric_paths
  if (auto it = cache.find(key); it != cache.end()) return it->second;
  GroupPlacement p = compute_placement(topo, mesh, group);
  if (cache.size() > 4096) cache.clear();  // a bound for endless what-if sweeps over fabric figures
  return cache.emplace(key, p).first->second;
}

}  // namespace hbmsim
