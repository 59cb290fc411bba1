// A device mesh: the named parallel axes of a run, their sizes and their order, and where a group of axes
// runs on the hardware (how its members fall into scale-up domains and which links join them), answered by
// path queries on the topology graph.
#pragma once
#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "hwmodels/topology.hpp"

namespace hbmsim {

// dp: data-parallel replicas; pp: pipeline stages; fsdp: weight-sharded data parallelism; ep: experts;
// cp: context (sequence) parallelism; tp: tensor parallelism.
enum class Axis : std::uint8_t { dp, pp, fsdp, ep, cp, tp };
constexpr int kAxisCount = 6;
constexpr std::array<Axis, kAxisCount> kAllAxes = {Axis::dp, Axis::pp, Axis::fsdp, Axis::ep, Axis::cp, Axis::tp};
const char* to_string(Axis a);

// A set of axes: a communication group spans every combination of their indices.
class AxisSet {
 public:
  constexpr AxisSet() = default;
  constexpr AxisSet(std::initializer_list<Axis> axes) {
    for (Axis a : axes) bits_ = static_cast<std::uint8_t>(bits_ | bit(a));
  }
  constexpr bool has(Axis a) const { return (bits_ & bit(a)) != 0; }
  constexpr bool empty() const { return bits_ == 0; }
  constexpr AxisSet operator|(AxisSet o) const { return from_bits(static_cast<std::uint8_t>(bits_ | o.bits_)); }
  constexpr AxisSet without(AxisSet o) const { return from_bits(static_cast<std::uint8_t>(bits_ & ~o.bits_)); }
  constexpr std::uint8_t bits() const { return bits_; }
  constexpr bool operator==(const AxisSet&) const = default;
  std::string name() const;  // "fsdp+ep" (outer to inner in the declaration order), "none" when empty

 private:
  static constexpr std::uint8_t bit(Axis a) { return static_cast<std::uint8_t>(1u << static_cast<unsigned>(a)); }
  static constexpr AxisSet from_bits(std::uint8_t b) {
    AxisSet s;
    s.bits_ = b;
    return s;
  }
  std::uint8_t bits_ = 0;
};

constexpr AxisSet kAllAxesSet() { return AxisSet{Axis::dp, Axis::pp, Axis::fsdp, Axis::ep, Axis::cp, Axis::tp}; }

using MeshOrder = std::array<Axis, kAxisCount>;  // outermost (largest stride) first
// MaxText's default mesh (data, stage, fsdp, context, tensor, expert): the expert axis innermost.
MeshOrder maxtext_mesh_order();
// Megatron-Core's default order "tp-cp-ep-dp-pp" (innermost first), with FSDP beside dp.
MeshOrder megatron_mesh_order();
// "maxtext", "megatron", or all six axis names outermost first ("dp,pp,fsdp,cp,tp,ep"). Errors name `where`.
MeshOrder parse_mesh_order(const std::string& text, const std::string& where);
// "maxtext", "megatron" or the comma-separated list.
std::string mesh_order_name(const MeshOrder& order);

struct Mesh {
  std::array<std::int64_t, kAxisCount> sizes{1, 1, 1, 1, 1, 1};
  MeshOrder order = maxtext_mesh_order();

  std::int64_t size(Axis a) const { return sizes[static_cast<std::size_t>(a)]; }
  std::int64_t size(AxisSet s) const;
  // Rank distance between neighbours along an axis: the product of the sizes of the axes inside it.
  std::int64_t stride(Axis a) const;
  std::int64_t devices() const { return size(kAllAxesSet()); }
  std::string describe() const;  // "fsdp 64 x tp 2 (maxtext order)", axes of size 1 left out
};

// Where one communication group's traffic runs. Every combination of the other axes' indices is an instance
// of the group; an SPMD step waits for the slowest, so the shape is the worst instance's: the most scale-up
// domains it spans and the most members it has in one of them, and (for all-to-all) the fewest members that
// share a member's domain.
struct GroupPlacement {
  std::int64_t size = 1;
  std::int64_t per_domain = 1;
  std::int64_t domains = 1;
  std::int64_t local = 1;  // fewest members sharing one member's domain (itself included)
};

// The two kinds of path a group's traffic takes, from the topology graph (links, bottleneck bandwidth,
// latency): a GPU to a peer in its scale-up domain, and to a GPU in another domain.
enum PathLevel : int { kIntraDomain = 0, kInterDomain = 1 };
struct FabricPaths {
  PathCost intra;  // empty when a domain holds one GPU
  PathCost inter;  // empty when the job fits one domain
  const PathCost& at(int level) const { return level == kIntraDomain ? intra : inter; }
};

// Both are cached (per fabric, mesh layout and group): a sweep asks them for every step.
GroupPlacement place_group(const Topology& topo, const Mesh& mesh, AxisSet group);
FabricPaths fabric_paths(const Topology& topo);

}  // namespace hbmsim
