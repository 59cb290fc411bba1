#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <random>
#include <vector>

#include "helpers.hpp"
#include "hwmodels/builtin.hpp"
#include "hwmodels/catalog.hpp"
#include "hwmodels/profile.hpp"
#include "hwmodels/mesh.hpp"
#include "hwmodels/topology.hpp"
#include "sim/comm.hpp"

using namespace hbmsim;

TEST_CASE("every built-in system file loads with the published key figures", "[hwmodels]") {
  auto ids = builtin_system_ids();
  REQUIRE(ids == std::vector<std::string>{"b200-hgx", "b300-hgx", "gb200-nvl72", "gb300-nvl72", "h100-hgx", "h200-hgx", "vr-nvl144"});
  // Figures from the datasheets named in issue 2 (per GPU; dense = sparse / 2). HBM is what the part reports
  // (nvidia-smi's memory total, in MiB): the datasheets' "GB" are binary on the part, less the driver's share.
  constexpr double MiB = 1048576;
  auto gb200 = builtin_system("gb200-nvl72");
  CHECK(gb200.gpu.hbm_bytes == 189471 * MiB);
  CHECK(gb200.gpu.hbm_bandwidth_bytes_per_s == 8e12);
  CHECK(gb200.gpu.peak_flops(Dtype::bf16) == 2.5e15);
  CHECK(gb200.gpu.peak_flops(Dtype::fp8) == 5e15);
  CHECK(gb200.gpu.peak_flops(Dtype::nvfp4) == 10e15);
  CHECK(gb200.host_h2d_bytes_per_s() == 176e9);    // nvbandwidth, all GPUs copying
  CHECK(gb200.host_cpu.memory_bytes == 480e9);
  CHECK(gb200.scale_up.per_gpu_bytes_per_s_per_direction == 900e9);  // 1.8 TB/s bidirectional
  auto gb300 = builtin_system("gb300-nvl72");
  CHECK(gb300.gpu.hbm_bytes == 284208 * MiB);
  CHECK(gb300.gpu.peak_flops(Dtype::nvfp4) == 15e15);
  CHECK(gb300.host_h2d_bytes_per_s() == 211e9);
  CHECK(gb300.host_d2h_bytes_per_s() == 193.5e9);
  CHECK(gb300.scale_out.per_gpu_bytes_per_s_per_direction == 100e9);  // ConnectX-8 800 Gb/s
  auto vr = builtin_system("vr-nvl144");
  CHECK(vr.gpu.hbm_bytes == 284208 * MiB);  // no measurement: GB300's, the same eight 36 GB stacks
  CHECK(vr.scale_up.per_gpu_bytes_per_s_per_direction == 1.8e12);  // NVLink 6 3.6 TB/s bidirectional
  CHECK(vr.host_link.per_direction_bytes_per_s == 900e9);            // C2C 1.8 TB/s bidirectional
  CHECK(vr.host_cpu.memory_bytes == 1.5e12);
  auto h100 = builtin_system("h100-hgx"), h200 = builtin_system("h200-hgx");
  CHECK(h100.gpu.hbm_bytes == 81559 * MiB);
  CHECK(h100.gpu.hbm_bandwidth_bytes_per_s == 3.35e12);
  CHECK(h200.gpu.hbm_bytes == 143771 * MiB);
  CHECK(h200.gpu.hbm_bandwidth_bytes_per_s == 4.8e12);
  CHECK(h200.gpu.peak_flops(Dtype::bf16) == 989e12);
  CHECK(h200.host_link.per_direction_bytes_per_s == 64e9);  // PCIe Gen5 x16, 128 GB/s bidirectional
  // The air-cooled HGX Blackwell boards: lower clocks than the NVL72 racks' parts (HGX B200 at 1000 W: FP8 72
  // PFLOPS sparse per 8 GPUs), an 8-GPU NVLink 5 domain, and the host over PCIe instead of NVLink-C2C.
  auto b200 = builtin_system("b200-hgx"), b300 = builtin_system("b300-hgx");
  CHECK(b200.gpu.hbm_bytes == 183359 * MiB);
  CHECK(b300.gpu.hbm_bytes == 275040 * MiB);
  for (const auto* b : {&b200, &b300}) {
    CHECK(b->gpu.peak_flops(Dtype::bf16) == 36e15 / 8 / 2);
    CHECK(b->gpu.peak_flops(Dtype::fp8) == 72e15 / 8 / 2);
    CHECK(b->scale_up.per_gpu_bytes_per_s_per_direction == 1.8e12 / 2);
    CHECK(b->scale_up.domain_gpus == 8);
    CHECK(b->host_link.per_direction_bytes_per_s == 64e9);
  }
  CHECK(b200.gpu.peak_flops(Dtype::nvfp4) == 72e15 / 8);   // dense FP4 per 8 GPUs
  CHECK(b300.gpu.peak_flops(Dtype::nvfp4) == 108e15 / 8);
  CHECK(b200.scale_out.per_gpu_bytes_per_s_per_direction == 400e9 / 8);  // ConnectX-7 400 Gb/s
  CHECK(b300.scale_out.per_gpu_bytes_per_s_per_direction == 800e9 / 8);  // ConnectX-8 800 Gb/s
  // Hopper has no FP4: an nvfp4 GEMM runs at the FP8 rate.
  CHECK(h200.gpu.peak_flops(Dtype::nvfp4) == h200.gpu.peak_flops(Dtype::fp8));
  // Blackwell's block-scaled MXFP8 runs on the FP8 tensor-core rate; Hopper has no MXFP8 tensor cores.
  for (const auto* b : {&gb200, &gb300, &b200, &b300, &vr}) CHECK(b->gpu.dense_peak_flops.at(Dtype::mxfp8) == b->gpu.peak_flops(Dtype::fp8));
  CHECK(h200.gpu.dense_peak_flops.count(Dtype::mxfp8) == 0);
}

TEST_CASE("dtypes: names, bytes per element with their block scales", "[hwmodels]") {
  for (Dtype d : {Dtype::bf16, Dtype::fp8, Dtype::mxfp8, Dtype::nvfp4, Dtype::fp32}) CHECK(parse_dtype(to_string(d)) == d);
  CHECK(dtype_bytes(Dtype::fp8) == 1);                 // per-tensor scaling: one scale per tensor
  CHECK(dtype_bytes(Dtype::mxfp8) == 1 + 1.0 / 32);    // an E8M0 scale byte per 32 elements (OCP MX v1.0)
  CHECK(dtype_bytes(Dtype::nvfp4) == 0.5 + 1.0 / 16);  // an FP8 scale byte per 16 four-bit values
  CHECK_THROWS_WITH(parse_dtype("mxfp6"), Catch::Contains("expected bf16, fp8, mxfp8, nvfp4 or fp32"));
}

TEST_CASE("the GB200 GPU-to-own-CPU path gives the C2C per-direction bandwidth split between its two GPUs", "[hwmodels]") {
  auto s = builtin_system("gb200-nvl72");
  Topology topo(s, 128);
  auto path = topo.path(topo.gpu_vertex(5), topo.cpu_vertex_of_gpu(5));
  // 900 GB/s bidirectional per Grace = 450 GB/s each way, shared by the two GPUs on it.
  CHECK(path.bytes_per_s == Approx(450e9 / 2));
  CHECK(path.latency_s == Approx(2e-6));
  REQUIRE(!path.links.empty());
  CHECK(path.links.back() == "NVLink-C2C");
  // GPU to GPU inside the NVLink domain: the per-GPU NVLink bandwidth.
  auto nv = topo.path(topo.gpu_vertex(0), topo.gpu_vertex(1));
  CHECK(nv.bytes_per_s == Approx(900e9));
  // Across domains (rank 100 is in the second NVL72 domain) the NIC is the bottleneck.
  auto far = topo.path(topo.gpu_vertex(0), topo.gpu_vertex(100));
  CHECK(far.bytes_per_s == Approx(50e9));
}

TEST_CASE("a ring inside an NVLink domain never takes the path through a Grace's shared memory", "[hwmodels][mesh]") {
  // GPUs 0 and 1 share a Grace: between them a path runs through its memory at the C2C share (225 GB/s each
  // way). With NVLink slowed below that as a what-if, it was the widest path of the pair that stood for every
  // hop in the domain, though a ring over more than two GPUs crosses Graces, where no such path exists: an FSDP
  // step over 8 GPUs took the same time at 1 KB/s of NVLink as at 100 GB/s.
  auto s = builtin_system("gb200-nvl72");
  s.scale_up.per_gpu_bytes_per_s_per_direction = 1e9;
  s.scale_out.per_gpu_bytes_per_s_per_direction = 2e9;
  Topology topo(s, 8);
  CHECK(topo.path(topo.gpu_vertex(0), topo.gpu_vertex(1)).bytes_per_s == Approx(450e9 / 2));  // the pair's own path
  // The domain's hop: the wider of NVLink (1 GB/s) and the NICs through the network (2 GB/s), no host memory.
  const auto paths = fabric_paths(topo);
  CHECK(paths.intra.bytes_per_s == Approx(2e9));
  CHECK(paths.intra.bottleneck == s.scale_out.name);
  // At datasheet figures NVLink is the domain's path, as before.
  auto datasheet = builtin_system("gb200-nvl72");
  CHECK(fabric_paths(Topology(datasheet, 8)).intra.bytes_per_s == Approx(900e9));
}

TEST_CASE("a job fills each NVLink domain with the most GPUs that divide its count", "[hwmodels][mesh]") {
  auto s = builtin_system("gb200-nvl72");
  // 72 divides 144; 128 GPUs use 64 per rack (the largest divisor of 128 not above 72); 96 use 48.
  CHECK(Topology(s, 144).domain_gpus() == 72);
  CHECK(Topology(s, 128).domain_gpus() == 64);
  CHECK(Topology(s, 96).domain_gpus() == 48);
  CHECK(Topology(s, 8).domain_gpus() == 8);
  Topology t(s, 128);
  CHECK(t.domain_of(63) == 0);
  CHECK(t.domain_of(64) == 1);
  CHECK(t.domain_of(1000) == 15);  // beyond the graph's window the same rule repeats
}

TEST_CASE("mesh orders give the strides MaxText and Megatron-Core use", "[hwmodels][mesh]") {
  Mesh m;
  m.sizes = {2, 1, 4, 8, 2, 4};  // dp, pp, fsdp, ep, cp, tp
  // MaxText, outermost first dp, pp, fsdp, cp, tp, ep: ep innermost (stride 1), then tp (8), cp (32),
  // fsdp (64), pp and dp (256).
  CHECK(m.stride(Axis::ep) == 1);
  CHECK(m.stride(Axis::tp) == 8);
  CHECK(m.stride(Axis::cp) == 32);
  CHECK(m.stride(Axis::fsdp) == 64);
  CHECK(m.stride(Axis::dp) == 256);
  CHECK(m.devices() == 512);
  // Megatron "tp-cp-ep-dp-pp" (innermost first), FSDP beside dp: tp 1, cp 4, ep 8, fsdp 64, dp 256.
  m.order = megatron_mesh_order();
  CHECK(m.stride(Axis::tp) == 1);
  CHECK(m.stride(Axis::cp) == 4);
  CHECK(m.stride(Axis::ep) == 8);
  CHECK(m.stride(Axis::fsdp) == 64);
  CHECK(m.stride(Axis::dp) == 256);
  CHECK(parse_mesh_order("pp,dp,fsdp,ep,cp,tp", "mesh_order") == megatron_mesh_order());
  CHECK(mesh_order_name(parse_mesh_order("megatron", "x")) == "megatron");
  CHECK_THROWS_WITH(parse_mesh_order("dp,tp", "mesh_order"),
                    "mesh_order = \"dp,tp\" (every axis must be placed; expected maxtext, megatron, or all of "
                    "dp,pp,fsdp,ep,cp,tp outermost first)");
  CHECK_THROWS_WITH(parse_mesh_order("dp,pp,fsdp,ep,cp,xp", "mesh_order"),
                    Catch::Contains("unknown axis \"xp\""));
}

TEST_CASE("group placement comes from the slowest instance of the group and the graph's paths", "[hwmodels][mesh]") {
  auto s = builtin_system("gb200-nvl72");
  Topology topo(s, 128);  // 64 GPUs per rack
  Mesh m;
  m.sizes = {1, 1, 2, 64, 1, 1};  // fsdp 2 x ep 64, MaxText order: ep consecutive, fsdp 64 apart
  // The experts' FSDP pairs {r, r+64} sit in two racks in every instance: one member per domain.
  auto pairs = place_group(topo, m, AxisSet{Axis::fsdp});
  CHECK(pairs.size == 2);
  CHECK(pairs.domains == 2);
  CHECK(pairs.per_domain == 1);
  const auto paths = fabric_paths(topo);
  CHECK(paths.inter.bytes_per_s == Approx(50e9));  // the NIC
  CHECK(paths.inter.bottleneck == "ConnectX-7 400G");
  CHECK(paths.inter.latency_s == Approx(5e-6));    // end to end, as the system file gives it
  // An expert group is one rack: 64 members, all local; the path is NVLink at 900 GB/s.
  auto ep = place_group(topo, m, AxisSet{Axis::ep});
  CHECK(ep.domains == 1);
  CHECK(ep.local == 64);
  CHECK(paths.intra.bytes_per_s == Approx(900e9));
  CHECK(paths.intra.latency_s == Approx(3e-6));
  CHECK(paths.intra.bottleneck == "NVLink 5");
  // The dense weights' group {fsdp, ep} is all 128 GPUs: two racks of 64.
  auto dense = place_group(topo, m, AxisSet{Axis::fsdp, Axis::ep});
  CHECK(dense.size == 128);
  CHECK(dense.domains == 2);
  CHECK(dense.per_domain == 64);
  // A group that does not align with the domains: 96 GPUs, 48 per domain, fsdp 3 members 32 apart.
  // Instance {b, b+32, b+64}: for b < 16 the domains are 0, 0, 1; for b >= 16 they are 0, 1, 1. Every
  // instance spans 2 domains with at most 2 members in one, and some member is alone in its domain.
  Topology t96(s, 96);
  Mesh odd;
  odd.sizes = {1, 1, 3, 32, 1, 1};
  auto uneven = place_group(t96, odd, AxisSet{Axis::fsdp});
  CHECK(uneven.domains == 2);
  CHECK(uneven.per_domain == 2);
  CHECK(uneven.local == 1);
}

TEST_CASE("collective costs follow the hierarchical ring formula", "[hwmodels]") {
  auto s = builtin_system("gb200-nvl72");
  s.efficiency.collective = PiecewiseTable::constant(1.0);
  Mesh m;
  m.sizes = {1, 1, 128, 1, 1, 1};
  Network net(s, m);
  // All-gather of 1 GB over 128 GPUs in two racks of 64 at 100% efficiency: 63/64 of it over NVLink's
  // 900 GB/s with 63 hops of 3 us, then (K-1)/G = 1/128 of it over the 50 GB/s NIC with one 5 us hop.
  const double intra = 1e9 * 63 / 64 / 900e9 + 63 * 3e-6, inter = 1e9 / 128 / 50e9 + 5e-6;
  auto ag = net.cost(CommKind::all_gather, 1e9, AxisSet{Axis::fsdp});
  CHECK(ag.seconds == Approx(intra + inter));
  CHECK(ag.bytes[kIntraDomain] == Approx(1e9 * 63 / 64));
  CHECK(ag.bytes[kInterDomain] == Approx(1e9 / 128));
  CHECK(net.cost(CommKind::reduce_scatter, 1e9, AxisSet{Axis::fsdp}).seconds == Approx(intra + inter));
  // All-reduce: a reduce-scatter then an all-gather.
  CHECK(net.cost(CommKind::all_reduce, 1e9, AxisSet{Axis::fsdp}).seconds == Approx(2 * (intra + inter)));
  CHECK(net.cost(CommKind::all_gather, 1e9, AxisSet{Axis::tp}).seconds == 0);  // a group of one
  // An all-to-all over 64 GPUs of one rack: 63/64 of the buffer over NVLink, one latency.
  Mesh e;
  e.sizes = {1, 1, 2, 64, 1, 1};
  Network ep(s, e);
  CHECK(ep.cost(CommKind::all_to_all, 1e9, AxisSet{Axis::ep}).seconds == Approx(1e9 * 63 / 64 / 900e9 + 3e-6));
  // The experts' FSDP pair across racks: each receives the other's half over its NIC.
  CHECK(ep.cost(CommKind::all_gather, 1e9, AxisSet{Axis::fsdp}).seconds == Approx(1e9 / 2 / 50e9 + 5e-6));
  // A send to the next member of a pair in two racks crosses the NIC: bytes / 50 GB/s + 5 us.
  CHECK(ep.cost(CommKind::send_recv, 1e9, AxisSet{Axis::fsdp}).seconds == Approx(1e9 / 50e9 + 5e-6));
}

TEST_CASE("a deduplicated all-to-all sends a token once per destination GPU and once per remote domain", "[hwmodels]") {
  auto s = builtin_system("gb200-nvl72");
  s.efficiency.collective = PiecewiseTable::constant(1.0);
  // ep 128 over two racks of 64; DeepSeek-V3's routing, 8 of 256 experts per token, 2 experts per GPU.
  // 1 GB is 8 copies of every token: 125 MB per copy.
  Mesh m;
  m.sizes = {1, 1, 1, 128, 1, 1};
  Network net(s, m);
  const AxisSet ep{Axis::ep};
  const TokenRouting deepseek{256, 8};
  // A given GPU holds none of a token's experts with C(254, 8) / C(256, 8) = (248 x 247) / (256 x 255);
  // the other rack none with C(128, 8) / C(256, 8) = prod_{i<8} (128 - i) / (256 - i).
  const double p_gpu = 1 - 248.0 * 247 / (256.0 * 255);
  double miss_rack = 1;
  for (int i = 0; i < 8; ++i) miss_rack *= (128.0 - i) / (256.0 - i);
  const double copy = 1e9 / 8;
  // Off the rack: one copy per token that has an expert there (0.996 of them), against 8 x 64/128 = 4 copies
  // sent per expert. On NVLink: to each of the 63 rack peers holding an expert, direct and forwarded.
  auto flex = net.cost(CommKind::all_to_all, 1e9, ep, deepseek);
  CHECK(flex.bytes[kInterDomain] == Approx(copy * (1 - miss_rack)));
  CHECK(flex.bytes[kIntraDomain] == Approx(copy * 126 * p_gpu));
  CHECK(flex.seconds == Approx(std::max(copy * 126 * p_gpu / 900e9 + 3e-6, copy * (1 - miss_rack) / 50e9 + 5e-6)));
  auto plain = net.cost(CommKind::all_to_all, 1e9, ep);
  CHECK(plain.bytes[kInterDomain] == Approx(1e9 * 64 / 128));
  CHECK(plain.bytes[kIntraDomain] == Approx(1e9 * 63 / 128));
  CHECK(flex.seconds < plain.seconds / 3);
  // One expert per GPU in one rack: every chosen expert is on a GPU of its own, nothing to deduplicate.
  Mesh one;
  one.sizes = {1, 1, 1, 64, 1, 1};
  Network rack(s, one);
  auto a = rack.cost(CommKind::all_to_all, 1e9, ep, TokenRouting{64, 8});
  auto b = rack.cost(CommKind::all_to_all, 1e9, ep);
  CHECK(a.bytes[kIntraDomain] == Approx(b.bytes[kIntraDomain]));
  CHECK(a.seconds == Approx(b.seconds));
}

namespace {

// GB200 NVL72 at collective efficiency 1 with a profile's scale_out_collective_scale applied.
System gb200_with_scale_out(double scale_out) {
  Profile p;
  p.parameters = {{"scale_out_collective_scale", scale_out}};
  auto s = builtin_system("gb200-nvl72");
  s.efficiency.collective = PiecewiseTable::constant(1.0);
  return apply_profile(s, p);
}

// The 1 GB all-gather over two racks of 64 (fsdp 128) on `s`, in seconds.
double all_gather_over_two_racks_s(const System& s) {
  Mesh m;
  m.sizes = {1, 1, 128, 1, 1, 1};
  return Network(s, m).cost(CommKind::all_gather, 1e9, AxisSet{Axis::fsdp}).seconds;
}

}  // namespace

TEST_CASE("scale_out_collective_scale slows only the part of a collective that crosses the NICs", "[hwmodels][profile]") {
  // The 1 GB all-gather over two racks of 64 above, with the NIC path at half the collective efficiency:
  // the NVLink term is unchanged, the NIC's bandwidth term doubles, its latency does not.
  const System s = gb200_with_scale_out(0.5);
  const double intra = 1e9 * 63 / 64 / 900e9 + 63 * 3e-6, inter = 1e9 / 128 / (0.5 * 50e9) + 5e-6;
  CHECK(all_gather_over_two_racks_s(s) == Approx(intra + inter));
  // Inside one rack nothing changes: 64 GPUs, NVLink only.
  Mesh one;
  one.sizes = {1, 1, 64, 1, 1, 1};
  CHECK(Network(s, one).cost(CommKind::all_gather, 1e9, AxisSet{Axis::fsdp}).seconds == Approx(1e9 * 63 / 64 / 900e9 + 63 * 3e-6));
  // A send across racks: bytes / (0.5 x 50 GB/s) + 5 us.
  Mesh e;
  e.sizes = {1, 1, 2, 64, 1, 1};
  CHECK(Network(s, e).cost(CommKind::send_recv, 1e9, AxisSet{Axis::fsdp}).seconds == Approx(1e9 / 25e9 + 5e-6));
}

TEST_CASE("a collective never crosses the NICs faster than their bandwidth, however the profile scales it", "[hwmodels][profile]") {
  // The 1 GB all-gather over two racks of 64 above, at collective efficiency 1 and scale_out_collective_scale 2
  // (both in calibrate fit's ranges: collective_scale up to 1.25 on a table of 0.8, scale-out up to 2): the NIC
  // term is the bytes over the NIC's 50 GB/s, not over twice that.
  const double intra = 1e9 * 63 / 64 / 900e9 + 63 * 3e-6, inter = 1e9 / 128 / 50e9 + 5e-6;
  CHECK(all_gather_over_two_racks_s(gb200_with_scale_out(2.0)) == Approx(intra + inter));
}

TEST_CASE("a profile that leaves a kernel or link below one per second is refused, naming its keys", "[hwmodels][profile]") {
  // The floor is the one a what-if or a system file's rate has (kMinHardwareRate): 1 FLOP/s or 1 byte/s, checked on
  // what the profile makes of the system (a table's lowest fraction times the peak it scales).
  const auto s = builtin_system("h200-hgx");
  auto refused = [&](const nlohmann::json& doc) {
    try {
      (void)apply_profile(s, load_profile(doc, "p.json"));
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  auto with = [](const char* key, nlohmann::json value) {
    nlohmann::json doc = {{"format", "hbmsim-profile/1"}, {"name", "t"}};
    doc[key] = std::move(value);
    return doc;
  };
  CHECK_THAT(refused(with("parameters", {{"gemm_scale", 1e-300}})),
             Catch::StartsWith("p.json: parameters.gemm_scale = 1e-300 (bf16 GEMMs at ") && Catch::Contains("FLOP/s on h200-hgx, implausibly small"));
  CHECK_THAT(refused(with("efficiency", {{"collective", {{1, 1e-300}}}})),
             Catch::StartsWith("p.json: efficiency.collective (lowest fraction 1e-300) (collectives at "));
  CHECK_THAT(refused(with("parameters", {{"host_link_scale", 1e-300}})),
             Catch::Contains("parameters.host_link_scale = 1e-300 (the host link at") && Catch::Contains("bytes/s"));
  CHECK_THAT(refused(with("parameters", {{"attention_scale@h200-hgx", 1e-300}})), Catch::Contains("parameters.attention_scale@h200-hgx"));
  // A measured rate of its own is checked as it is read (at least 1 per second): a measured host link of 1 byte/s
  // is a legal what-if, as --host-link-bw 1 is, even though host copies then run below it; a scale that takes it
  // below is refused with the measured figure named.
  nlohmann::json slow = with("host_link", {{"h2d_bytes_per_s", 1.0}, {"d2h_bytes_per_s", 1.0}});
  CHECK(refused(slow) == "accepted");
  slow["parameters"] = {{"host_link_scale", 0.5}};
  CHECK_THAT(refused(slow), Catch::Contains("parameters.host_link_scale = 0.5, with host_link.h2d_bytes_per_s = 1 and "
                                            "host_link.d2h_bytes_per_s = 1 (the host link at"));
  // Small but above the floor: applied as given, not clamped. H200's bf16 GEMM at 1e12 FLOPs times 1e-9 is some
  // 1e5 FLOP/s; the host link (PCIe 5, tens of GB/s) times 1e-9 some tens of bytes/s.
  Profile tiny;
  tiny.parameters = {{"gemm_scale", 1e-9}, {"host_link_scale", 1e-9}};
  const auto t = apply_profile(s, tiny);
  CHECK(t.efficiency.gemm_bf16.at(1e12) == Approx(s.efficiency.gemm_bf16.at(1e12) * 1e-9));
  CHECK(t.host_h2d_bytes_per_s() == Approx(s.host_h2d_bytes_per_s() * 1e-9));
}

TEST_CASE("piecewise efficiency tables interpolate in log space and clamp at the ends", "[hwmodels]") {
  PiecewiseTable t{{{1e9, 0.2}, {1e11, 0.6}}};
  CHECK(t.at(1e8) == 0.2);
  CHECK(t.at(1e12) == 0.6);
  CHECK(t.at(1e10) == Approx(0.4));  // halfway in log10
}

namespace {

// One defect per case, applied to the GB200 system file; `path` must appear in the error.
struct Defect {
  const char* what;
  const char* path;
  std::function<void(nlohmann::json&)> apply;
};

}  // namespace

TEST_CASE("broken system files exit with status 2 naming the file, the JSON path and the value", "[hwmodels][cli]") {
  const auto base = nlohmann::json::parse(*builtin_file("systems/gb200-nvl72.json"));
  std::vector<Defect> defects = {
      {"unknown top-level key", "colour", [](auto& j) { j["colour"] = "green"; }},
      {"missing HBM size", "gpu.hbm_bytes is missing", [](auto& j) { j["gpu"].erase("hbm_bytes"); }},
      {"negative HBM size", "gpu.hbm_bytes.value = -1", [](auto& j) { j["gpu"]["hbm_bytes"]["value"] = -1; }},
      {"zero HBM bandwidth", "gpu.hbm_bandwidth_bytes_per_s.value = 0", [](auto& j) { j["gpu"]["hbm_bandwidth_bytes_per_s"]["value"] = 0; }},
      {"size as a string", "gpu.hbm_bytes.value = \"186e9\"", [](auto& j) { j["gpu"]["hbm_bytes"]["value"] = "186e9"; }},
      {"no bf16 peak", "gpu.dense_peak_flops", [](auto& j) { j["gpu"]["dense_peak_flops"].erase("bf16"); }},
      {"unknown sharing policy", "host_link.sharing = \"sometimes\"", [](auto& j) { j["host_link"]["sharing"] = "sometimes"; }},
      {"zero sharers", "host_link.gpus_sharing = 0", [](auto& j) { j["host_link"]["gpus_sharing"] = 0; }},
      {"more sharers than GPUs per CPU", "host_link.gpus_sharing = 3", [](auto& j) { j["host_link"]["gpus_sharing"] = 3; }},
      {"fractional domain size", "scale_up.domain_gpus = 1.5", [](auto& j) { j["scale_up"]["domain_gpus"] = 1.5; }},
      {"empty source", "host_link.per_direction_bytes_per_s.source", [](auto& j) { j["host_link"]["per_direction_bytes_per_s"]["source"] = ""; }},
      {"reserve above HBM", "runtime.reserve_bytes", [](auto& j) { j["runtime"]["reserve_bytes"]["value"] = 1e12; }},
      {"unknown efficiency table", "efficiency = \"nope\"", [](auto& j) { j["efficiency"] = "nope"; }},
      {"measured above the link share", "host_link.measured_h2d_bytes_per_s.value = 1000000000000.0", [](auto& j) { j["host_link"]["measured_h2d_bytes_per_s"]["value"] = 1e12; }},
      {"null latency", "gpu.launch_overhead_s.value = null", [](auto& j) { j["gpu"]["launch_overhead_s"]["value"] = nullptr; }},
      {"a fraction of an SM", "gpu.sms.value", [](auto& j) { j["gpu"]["sms"]["value"] = 147.5; }},
      {"no SMs", "gpu.sms.value = 0", [](auto& j) { j["gpu"]["sms"]["value"] = 0; }},
      {"SMs without a source", "gpu.sms.source", [](auto& j) { j["gpu"]["sms"].erase("source"); }},
      {"missing scale-out", "scale_out is missing", [](auto& j) { j.erase("scale_out"); }},
      {"extra key in a figure", "gpu.hbm_bandwidth_bytes_per_s.unit", [](auto& j) { j["gpu"]["hbm_bandwidth_bytes_per_s"]["unit"] = "TB/s"; }},
      {"negative GPUs per CPU", "host_cpu.gpus_per_cpu = -2", [](auto& j) { j["host_cpu"]["gpus_per_cpu"] = -2; }},
      {"pinned fraction above one", "runtime.host_pinned_fraction.value = 1.5", [](auto& j) { j["runtime"]["host_pinned_fraction"]["value"] = 1.5; }},
      {"size past 2^63 as an integer", "host_cpu.gpus_per_cpu", [](auto& j) { j["host_cpu"]["gpus_per_cpu"] = 18446744073709551615ull; }},
  };
  auto dir = test::temp_dir();
  for (std::size_t i = 0; i < defects.size(); ++i) {
    auto doc = base;
    defects[i].apply(doc);
    auto file = dir / ("broken-system-" + std::to_string(i) + ".json");
    test::write(file, doc.dump(2));
    INFO(defects[i].what);
    auto r = test::cli("simulate --system " + file.string() + " --model llama3.1-8b --gpus 8");
    CHECK(r.status == 2);
    CHECK(r.err.find(file.string()) != std::string::npos);
    CHECK(r.err.find(defects[i].path) != std::string::npos);
    CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);  // one line
  }
  // Malformed JSON names the file and the position.
  auto file = dir / "malformed.json";
  test::write(file, base.dump().substr(0, 100));
  auto r = test::cli("simulate --system " + file.string() + " --model llama3.1-8b --gpus 8");
  CHECK(r.status == 2);
  CHECK(r.err.find(file.string() + ": malformed JSON") != std::string::npos);
}

TEST_CASE("a calibration profile round-trips through its JSON and rejects malformed fields", "[hwmodels][profile]") {
  Profile p;
  p.name = "t";
  p.source = "unit test";
  p.metadata = {{"gpu", "NVIDIA H200"}};
  p.h2d_bytes_per_s = 50e9;
  p.d2h_bytes_per_s = 48e9;
  p.host_latency_s = 1e-5;
  p.gemm_bf16 = PiecewiseTable{{{1e9, 0.3}, {1e12, 0.8}}};
  p.parameters = {{"gemm_scale", 0.9}};
  auto j = p.to_json();
  auto q = load_profile(j, "mem");
  CHECK(q.to_json() == j);
  auto bad = j;
  bad["host_link"]["h2d_bytes_per_s"] = -5;
  CHECK_THROWS_WITH(load_profile(bad, "p.json"), Catch::Contains("p.json: host_link.h2d_bytes_per_s = -5"));
  bad = j;
  bad["parameters"]["warp_factor"] = 2;
  CHECK_THROWS_WITH(load_profile(bad, "p.json"), Catch::Contains("parameters.warp_factor"));
  bad = j;
  bad["efficiency"]["gemm"]["bf16"] = {{1e12, 0.8}, {1e9, 0.3}};
  CHECK_THROWS_WITH(load_profile(bad, "p.json"), Catch::Contains("efficiency.gemm.bf16[1][0]"));
  bad = j;
  bad["format"] = "other/2";
  CHECK_THROWS_AS(load_profile(bad, "p.json"), InputError);
}

TEST_CASE("applying a profile replaces datasheet figures and scales what its parameters name", "[hwmodels][profile]") {
  auto s = builtin_system("h200-hgx");
  Profile p;
  p.h2d_bytes_per_s = 20e9;
  p.parameters = {{"host_link_scale", 0.5}, {"gemm_scale", 0.5}};
  auto c = apply_profile(s, p);
  CHECK(c.host_h2d_bytes_per_s() == Approx(10e9));  // measured 20 GB/s, then scaled by 0.5
  CHECK(c.host_d2h_bytes_per_s() == Approx(s.host_d2h_bytes_per_s() * 0.5));
  CHECK(c.efficiency.gemm_bf16.at(1e12) == Approx(s.efficiency.gemm_bf16.at(1e12) * 0.5));
}

TEST_CASE("MXFP8 GEMMs run at the fp8 table, times mxfp8_gemm_scale on top of gemm_scale", "[hwmodels][profile]") {
  auto s = builtin_system("gb200-nvl72");
  for (double flops : {1e9, 1e11, 1e13}) CHECK(s.efficiency.gemm(Dtype::mxfp8).at(flops) == s.efficiency.gemm(Dtype::fp8).at(flops));
  Profile p;
  p.parameters = {{"gemm_scale", 0.8}, {"mxfp8_gemm_scale", 0.9}};
  auto c = apply_profile(s, p);
  // 0.74 at 1e13 FLOPs in the Blackwell fp8 table (data/efficiency/blackwell.json): 0.74 x 0.8 = 0.592 per-tensor,
  // 0.74 x 0.8 x 0.9 = 0.5328 block-scaled.
  CHECK(c.efficiency.gemm(Dtype::fp8).at(1e13) == Approx(0.592));
  CHECK(c.efficiency.gemm(Dtype::mxfp8).at(1e13) == Approx(0.5328));
  // A measured fp8 table carries over to the block-scaled kernels before the scales.
  p.gemm_fp8 = PiecewiseTable{{{1e9, 0.5}}};
  CHECK(apply_profile(s, p).efficiency.gemm(Dtype::mxfp8).at(1e12) == Approx(0.5 * 0.8 * 0.9));
}

TEST_CASE("a parameter qualified with @SYSTEM applies on that system only, over the unqualified one", "[hwmodels][profile]") {
  Profile p;
  p.parameters = {{"gemm_scale", 0.9}, {"gemm_scale@gb200-nvl72", 0.7}};
  for (const char* id : {"gb200-nvl72", "h100-hgx"}) {
    INFO(id);
    auto s = builtin_system(id);
    const double scale = std::string(id) == "gb200-nvl72" ? 0.7 : 0.9;  // its own value replaces, never compounds
    CHECK(apply_profile(s, p).efficiency.gemm_fp8.at(1e12) == Approx(s.efficiency.gemm_fp8.at(1e12) * scale));
  }
  auto j = p.to_json();
  CHECK(load_profile(j, "mem").parameters == p.parameters);
  j["parameters"]["gemm_scale@dgx-b300"] = 0.8;
  CHECK_THROWS_WITH(load_profile(j, "p.json"), Catch::Contains("parameters.gemm_scale@dgx-b300") && Catch::Contains("unknown system \"dgx-b300\""));
  CHECK(parse_parameter_key("collective_scale@h100-hgx").name == "collective_scale");
  CHECK(parse_parameter_key("collective_scale@h100-hgx").system == "h100-hgx");
  CHECK_THROWS_WITH(parse_parameter_key("warp@h100-hgx"), Catch::Contains("unknown parameter"));
}

TEST_CASE("group-limited routing sends a token to fewer GPUs and domains", "[hwmodels][moe]") {
  // DeepSeek-V3's routing: 8 of 256 experts, drawn from 4 of 8 groups of 32 consecutive experts.
  const TokenRouting grouped{256, 8, 8, 4}, free{256, 8};
  const double copy = 1e9 / 8;
  {
    // ep 8 in one HGX node: each GPU holds one group. By hand, a given GPU gets none of a token's experts
    // when its group is not picked (1/2) or, picked, none of the 8 experts falls among its 32 of the 128
    // picked: C(96, 8) / C(128, 8). Without groups: C(224, 8) / C(256, 8).
    auto s = builtin_system("b200-hgx");
    s.efficiency.collective = PiecewiseTable::constant(1.0);
    Mesh m;
    m.sizes = {1, 1, 1, 8, 1, 1};
    Network net(s, m);
    double in_picked = 1, anywhere = 1;
    for (int i = 0; i < 8; ++i) {
      in_picked *= (96.0 - i) / (128.0 - i);
      anywhere *= (224.0 - i) / (256.0 - i);
    }
    const double p_grouped = 1 - (0.5 + 0.5 * in_picked), p_free = 1 - anywhere;
    CHECK(net.cost(CommKind::all_to_all, 1e9, AxisSet{Axis::ep}, grouped).bytes[kIntraDomain] == Approx(copy * 7 * p_grouped));
    CHECK(net.cost(CommKind::all_to_all, 1e9, AxisSet{Axis::ep}, free).bytes[kIntraDomain] == Approx(copy * 7 * p_free));
    CHECK(p_grouped < 0.7 * p_free);  // about 3.2 GPUs a token instead of 4.6
  }
  {
    // ep 128 over two NVL72 racks of 64: two experts per GPU, four groups per rack. Counted against a
    // Monte Carlo draw of the routing itself (200,000 tokens): how often GPU 0 (experts 0-1) and the other
    // rack (experts 128-255) receive a copy.
    auto s = builtin_system("gb200-nvl72");
    s.efficiency.collective = PiecewiseTable::constant(1.0);
    Mesh m;
    m.sizes = {1, 1, 1, 128, 1, 1};
    Network net(s, m);
    std::mt19937 rng(7);
    int gpu_hits = 0, rack_hits = 0;
    const int draws = 200000;
    std::vector<int> groups(8), experts(128);
    for (int t = 0; t < draws; ++t) {
      std::iota(groups.begin(), groups.end(), 0);
      std::shuffle(groups.begin(), groups.end(), rng);
      for (int g = 0; g < 4; ++g)
        for (int e = 0; e < 32; ++e) experts[static_cast<std::size_t>(g * 32 + e)] = groups[static_cast<std::size_t>(g)] * 32 + e;
      std::shuffle(experts.begin(), experts.end(), rng);
      bool gpu = false, rack = false;
      for (int k = 0; k < 8; ++k) {
        gpu |= experts[static_cast<std::size_t>(k)] < 2;
        rack |= experts[static_cast<std::size_t>(k)] >= 128;
      }
      gpu_hits += gpu;
      rack_hits += rack;
    }
    const double p_gpu = static_cast<double>(gpu_hits) / draws, p_dom = static_cast<double>(rack_hits) / draws;
    auto c = net.cost(CommKind::all_to_all, 1e9, AxisSet{Axis::ep}, grouped);
    // Inter-domain: one copy per token that has an expert in the other rack; intra-domain: to each of the 63
    // rack peers holding one, direct and forwarded (the test above). Three standard errors of the draws.
    CHECK(c.bytes[kInterDomain] == Approx(copy * p_dom).epsilon(3 * std::sqrt(p_dom * (1 - p_dom) / draws) / p_dom));
    CHECK(c.bytes[kIntraDomain] == Approx(copy * 126 * p_gpu).epsilon(3 * std::sqrt(p_gpu * (1 - p_gpu) / draws) / p_gpu));
  }
}
