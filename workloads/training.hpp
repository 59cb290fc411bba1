// Training configuration of one run: batch, sequence, dtypes and parallel degrees, validated.
#pragma once
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "hwmodels/system.hpp"
#include "workloads/model.hpp"

namespace hbmsim {

struct Parallelism {
  std::int64_t fsdp = 0;  // 0: whatever the GPU count leaves after tp, ep and dp
  std::int64_t tp = 1, ep = 1, dp = 1;
};

struct TrainingSpec {
  std::int64_t gpus = 0;
  std::int64_t per_device_batch = 1;
  std::int64_t seq_len = 4096;
  std::int64_t grad_accum = 1;
  // MaxText use_batch_split_schedule/batch_split_factor (DeepSeek): each MoE layer runs as this many
  // micro-batches so that one micro-batch's all-to-all can overlap another's compute.
  std::int64_t moe_batch_split = 1;
  Parallelism parallelism;
  Dtype activation_dtype = Dtype::bf16;
  Dtype mlp_gemm_dtype = Dtype::bf16;        // --weights nvfp4/fp8: MaxText te_nvfp4 / fp8 recipes
  Dtype attention_gemm_dtype = Dtype::bf16;  // projections and attention stay bf16 unless asked
  Dtype weight_storage_dtype = Dtype::fp32;  // MaxText weight_dtype default float32
  double optimizer_bytes_per_param = 8;      // Adam: two fp32 moments
  double gradient_bytes_per_param = 4;       // fp32 gradient accumulation buffer

  std::int64_t tokens_per_device() const { return per_device_batch * seq_len; }
};

// Fills fsdp when 0 and checks every degree against the GPU count and the model; errors name the flag.
void validate_training(TrainingSpec& t, const ModelSpec& m);

}  // namespace hbmsim
