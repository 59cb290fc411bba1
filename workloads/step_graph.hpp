// The ops and tensors of one training step on one device. Layers are instances of a scanned layer
// template (MaxText scan_layers=True); every activation carries its MaxText checkpoint name.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <boost/graph/adjacency_list.hpp>

#include "hwmodels/system.hpp"
#include "workloads/model.hpp"
#include "workloads/training.hpp"

namespace hbmsim {

// MaxText checkpoint names that a remat policy can address, in layer order.
const std::vector<std::string>& checkpoint_names();
bool is_checkpoint_name(const std::string& name);

enum class OpKind { gemm, attention, memory, all_to_all };
const char* to_string(OpKind k);

struct TensorDef {
  std::string name;
  double bytes = 0;
  bool checkpoint = false;  // a MaxText checkpoint name a policy can save or offload
};

struct OpDef {
  std::string name;
  OpKind kind = OpKind::memory;
  Dtype dtype = Dtype::bf16;
  double flops = 0;      // forward, executed
  double bytes = 0;      // forward HBM traffic (inputs + weights + outputs), or bytes sent for all-to-all
  double bwd_flops = 0;  // backward, executed
  double bwd_bytes = 0;
  std::vector<int> inputs;   // tensor indices in the template
  std::vector<int> outputs;
  std::vector<int> saved;    // forward tensors the backward op reads
};

struct LayerTemplate {
  std::string kind;  // "dense" or "moe"
  std::vector<TensorDef> tensors;  // tensors[0] is decoder_layer_input, produced by the previous layer
  std::vector<OpDef> ops;          // forward program order; backward runs them in reverse
  int output_tensor = -1;          // becomes the next layer's decoder_layer_input
  // FSDP traffic of one layer, per device: gathered bytes and group sizes.
  double gathered_dense_bytes = 0;   // non-expert weights, gathered over fsdp*ep
  double gathered_expert_bytes = 0;  // local experts' weights, gathered over fsdp
  double grad_dense_bytes = 0;       // reduce-scattered gradients (weight storage dtype)
  double grad_expert_bytes = 0;

  int find_tensor(const std::string& name) const;
};

struct StepGraph {
  ModelSpec model;
  TrainingSpec training;
  std::vector<LayerTemplate> templates;
  std::vector<int> layer_template;  // per layer, index into templates
  ModelSpec::Flops model_flops;     // MaxText model FLOPs for the whole step on one device
  // Per device, whole step.
  double local_params = 0;          // parameters this device stores
  double parameter_bytes = 0, optimizer_bytes = 0, gradient_bytes = 0;
  // Embedding and head (unembedding + loss), per micro-batch.
  double embed_gathered_bytes = 0, embed_grad_bytes = 0;  // both tables (input embedding and unembedding)
  double logits_bytes = 0;
  double unembed_flops = 0;
  double optimizer_update_bytes = 0;  // HBM traffic of the Adam update
  std::int64_t fsdp_group = 1, expert_fsdp_group = 1, ep_group = 1;
  // MaxText's mesh puts the expert axis innermost, then tensor: an expert group is consecutive GPUs and the
  // experts' FSDP group strides over both (on 128 GB200s with EP 64, its two members sit in two racks).
  std::int64_t expert_fsdp_stride = 1;

  const LayerTemplate& layer(std::int64_t i) const { return templates[static_cast<std::size_t>(layer_template[static_cast<std::size_t>(i)])]; }
  // Bytes of one checkpoint-named tensor in one layer of the given kind (0 when absent).
  double tensor_bytes(const std::string& name, const std::string& kind = "") const;
};

// Validates `training` against `model` (filling fsdp) and builds the step.
StepGraph build_step_graph(const ModelSpec& model, TrainingSpec training);

// One layer template as a Boost.Graph DAG: vertices are ops, edges are tensors flowing between them.
using OpGraph = boost::adjacency_list<boost::vecS, boost::vecS, boost::bidirectionalS, int, int>;
OpGraph layer_dag(const LayerTemplate& t);
std::string layer_dot(const LayerTemplate& t, const std::string& title);

}  // namespace hbmsim
