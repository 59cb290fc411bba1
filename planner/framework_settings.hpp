// The settings that realise a simulated run in the frameworks (MaxText keys, XLA flags, Megatron-LM arguments),
// with a note wherever a setting has no equivalent there.
#pragma once
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "planner/run_config.hpp"

namespace hbmsim {

// The settings that would run a config: simulate --config JSON, MaxText keys, XLA flags, Megatron arguments.
nlohmann::json runnable_settings(const RunConfig& config);
std::string maxtext_settings(const RunConfig& config);
// The Megatron-LM arguments that realise a config, with a note where a setting has no Megatron equivalent.
std::string megatron_settings(const RunConfig& config);
// Megatron's selective recompute modules a config's policy is, space-separated ("moe_act layernorm"): under
// no_recompute or selective, the modules whose tensors, and only those, its tensors rematerialize. nullopt: not
// such a policy (or no module at all).
std::optional<std::string> selective_recompute_modules(const RunConfig& config);
std::string xla_flags(const RunConfig& config);

}  // namespace hbmsim
