#include "workloads/pipeline_split.hpp"

#include <string>

#include "hwmodels/json_view.hpp"

namespace hbmsim {

namespace {

std::string str(std::int64_t v) { return std::to_string(v); }

// Layer counts per stage given its first and/or last stage's (vp = 1): the middle stages split the rest.
std::vector<std::int64_t> uneven_counts(std::int64_t L, const Parallelism& p) {
  const auto& s = p.split;
  // Errors name the field given (the first stage's when both are).
  const std::string field = s.first_stage_layers != 0 ? "first_stage_layers = " + str(s.first_stage_layers)
                                                      : "last_stage_layers = " + str(s.last_stage_layers);
  if (p.pp == 1) throw InputError(field + " (an uneven pipeline split needs pp > 1)");
  if (p.vp > 1) throw InputError(field + " (an uneven split is for one chunk per stage; vp = " + str(p.vp) + ")");
  if (s.embedding_as_layer || s.loss_as_layer)
    throw InputError(field + " (give either the first/last stage layers or embedding_as_layer/loss_as_layer, not both)");
  for (auto [name, v] : {std::pair{"first_stage_layers", s.first_stage_layers}, {"last_stage_layers", s.last_stage_layers}})
    if (v < 0 || v >= L) throw InputError(std::string(name) + " = " + str(v) + " (must be between 1 and num_layers - 1 = " + str(L - 1) + ")");
  const std::int64_t fixed = (s.first_stage_layers > 0) + (s.last_stage_layers > 0);
  const std::int64_t rest = L - s.first_stage_layers - s.last_stage_layers, others = p.pp - fixed;
  if (others == 0 && rest != 0)
    throw InputError(field + " (with pp = 2 the first and last stage layers must add up to num_layers = " + str(L) + ")");
  if (others > 0 && (rest <= 0 || rest % others != 0))
    throw InputError(field + " (the other " + str(others) + " stages cannot split the remaining " + str(rest) +
                     " of num_layers = " + str(L) + " evenly)");
  std::vector<std::int64_t> counts(static_cast<std::size_t>(p.pp), others > 0 ? rest / others : 0);
  if (s.first_stage_layers > 0) counts.front() = s.first_stage_layers;
  if (s.last_stage_layers > 0) counts.back() = s.last_stage_layers;
  return counts;
}

// Layer counts per chunk of an even split, the embedding and loss counting as a layer each when asked.
std::vector<std::int64_t> even_counts(std::int64_t L, const Parallelism& p) {
  const std::int64_t chunks = p.pp * p.vp;
  const std::int64_t units = L + p.split.embedding_as_layer + p.split.loss_as_layer;
  const std::string field = p.vp > 1 ? "vp = " + str(p.vp) : "pp = " + str(p.pp);
  if (units % chunks != 0)
    throw InputError(field + " (num_layers = " + str(L) + (units != L ? " plus the embedding/loss counted as layers" : "") +
                     " is not divisible by pp x vp = " + str(chunks) +
                     "; give first_stage_layers/last_stage_layers or count the embedding and loss as layers)");
  std::vector<std::int64_t> counts(static_cast<std::size_t>(chunks), units / chunks);
  if (p.split.embedding_as_layer) --counts.front();
  if (p.split.loss_as_layer) --counts.back();
  for (std::int64_t c : counts)
    if (c <= 0) throw InputError(field + " (a chunk of num_layers = " + str(L) + " would hold no layer)");
  return counts;
}

}  // namespace

std::vector<PipelineChunk> pipeline_chunks(const ModelSpec& model, const Parallelism& p) {
  const std::int64_t L = model.num_layers;
  if (p.pp * p.vp > L)
    throw InputError((p.vp > 1 ? "vp = " + str(p.vp) : "pp = " + str(p.pp)) + " (pp x vp = " + str(p.pp * p.vp) +
                     " chunks exceed num_layers = " + str(L) + ")");
  const bool uneven = p.split.first_stage_layers != 0 || p.split.last_stage_layers != 0;
  const auto counts = uneven ? uneven_counts(L, p) : even_counts(L, p);
  std::vector<PipelineChunk> chunks(counts.size());
  std::int64_t first = 0;
  for (std::size_t k = 0; k < counts.size(); ++k) {
    chunks[k].first_layer = first;
    chunks[k].end_layer = first += counts[k];
    chunks[k].stage = static_cast<int>(static_cast<std::int64_t>(k) % p.pp);
  }
  chunks.front().embedding = true;
  chunks.back().head = true;
  return chunks;
}

}  // namespace hbmsim
