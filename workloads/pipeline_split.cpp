#include "workloads/pipeline_split.hpp"

#include <cctype>
#include <string>

#include "hwmodels/json_view.hpp"

namespace hbmsim {

namespace {

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

// The layout with its repetitions and groups written out. Recursion is bounded by the nesting depth and the
// output by a length cap, so a hostile string cannot exhaust the stack or memory.
class LayoutExpander {
 public:
  explicit LayoutExpander(const std::string& text) : text_(text) {}
  std::string run() {
    std::string out = sequence(0);
    if (pos_ < text_.size()) fail("unmatched ')'");
    return out;
  }

 private:
  [[noreturn]] void fail(const std::string& why) const {
    throw InputError("pipeline_layout = \"" + text_ + "\" (" + why + " at character " + str(static_cast<std::int64_t>(pos_) + 1) + ")");
  }
  void skip() {
    while (pos_ < text_.size() && (text_[pos_] == ',' || text_[pos_] == ' ')) ++pos_;
  }
  std::string sequence(int depth) {
    if (depth > 8) fail("groups nested too deep");
    std::string out;
    for (skip(); pos_ < text_.size() && text_[pos_] != ')'; skip()) {
      std::string item;
      const char c = text_[pos_];
      if (c == '(') {
        ++pos_;
        item = sequence(depth + 1);
        if (pos_ >= text_.size()) fail("unclosed '('");
        ++pos_;
      } else if (c == 'E' || c == 't' || c == 'm' || c == 'L' || c == '|') {
        item = std::string(1, c);
        ++pos_;
      } else {
        fail(std::string("unexpected '") + c + "' (expected E, t, m, L, |, (, ) or *N)");
      }
      std::int64_t times = 1;
      if (pos_ < text_.size() && text_[pos_] == '*') {
        ++pos_;
        const std::size_t start = pos_;
        times = 0;
        while (pos_ < text_.size() && std::isdigit(static_cast<unsigned char>(text_[pos_])) && times < 100000)
          times = times * 10 + (text_[pos_++] - '0');
        if (pos_ == start || times < 1) fail("'*' needs a count of at least 1");
      }
      if (static_cast<double>(out.size()) + static_cast<double>(item.size()) * static_cast<double>(times) > 100000)
        fail("the layout expands to more than 100000 symbols");
      for (std::int64_t i = 0; i < times; ++i) out += item;
    }
    return out;
  }

  const std::string& text_;
  std::size_t pos_ = 0;
};

// Layer counts per chunk of an even split, the embedding and loss counting as a layer each when asked.
std::vector<std::int64_t> even_counts(std::int64_t L, const Parallelism& p) {
  const std::int64_t chunks = p.pp * p.vp;
  const std::int64_t units = L + p.split.embedding_as_layer + p.split.loss_as_layer;
  const std::string field = p.vp > 1 ? "vp = " + str(p.vp) : "pp = " + str(p.pp);
  if (units % chunks != 0) {
    // Name the switches that would make the split even, where one would (126 layers + 2 over pp 8 x vp 4).
    std::string hint = "give first_stage_layers/last_stage_layers or count the embedding and loss as layers";
    if (!p.split.embedding_as_layer && !p.split.loss_as_layer && (L + 2) % chunks == 0)
      hint = "embedding_as_layer and loss_as_layer on would make it " + str(L + 2) + ", or give first_stage_layers/last_stage_layers";
    else if (units == L && (L + 1) % chunks == 0)
      hint = "embedding_as_layer or loss_as_layer on would make it " + str(L + 1) + ", or give first_stage_layers/last_stage_layers";
    throw InputError(field + " (num_layers = " + str(L) + (units != L ? " plus the embedding/loss counted as layers" : "") +
                     " is not divisible by pp x vp = " + str(chunks) + "; " + hint + ")");
  }
  std::vector<std::int64_t> counts(static_cast<std::size_t>(chunks), units / chunks);
  // The first chunk may be the embedding alone, the last the loss alone (Llama 3.1 405B's 126 layers + 2 over
  // pp 16 x vp 8); any other chunk holds a layer.
  if (p.split.embedding_as_layer) --counts.front();
  if (p.split.loss_as_layer) --counts.back();
  for (std::size_t k = 1; k + 1 < counts.size(); ++k)
    if (counts[k] <= 0) throw InputError(field + " (a chunk of num_layers = " + str(L) + " would hold no layer)");
  return counts;
}

// Layer counts per chunk from a layout, checked against the model and the pipeline.
std::vector<std::int64_t> layout_counts(std::int64_t L, std::int64_t mtp_layers, const Parallelism& p) {
  const auto& s = p.split;
  const std::string field = "pipeline_layout = \"" + s.layout + "\"";
  if (s.first_stage_layers != 0 || s.last_stage_layers != 0 || s.embedding_as_layer || s.loss_as_layer)
    throw InputError(field + " (a layout gives every chunk's layers; drop first/last_stage_layers and embedding/loss_as_layer)");
  std::int64_t mtp = 0;
  auto counts = parse_pipeline_layout(s.layout, mtp);
  if (mtp != mtp_layers)
    throw InputError(field + " (" + str(mtp) + " MTP layers, m; the run trains mtp_layers = " + str(mtp_layers) + ")");
  const std::int64_t chunks = p.pp * p.vp;
  if (static_cast<std::int64_t>(counts.size()) != chunks)
    throw InputError(field + " (" + str(static_cast<std::int64_t>(counts.size())) + " chunks; pp x vp = " + str(chunks) + ")");
  std::int64_t total = 0;
  for (std::int64_t c : counts) total += c;
  if (total != L) throw InputError(field + " (" + str(total) + " decoder layers; the model has num_layers = " + str(L) + ")");
  return counts;
}

}  // namespace

std::string ceil_pipeline_layout(std::int64_t layers, std::int64_t chunks, std::int64_t mtp_layers) {
  if (chunks < 2) return "";
  const std::int64_t per = (layers + chunks - 1) / chunks, rest = layers - per * (chunks - 1);
  if (rest < 1) return "";
  const std::string t = "t*" + std::to_string(per) + "|";
  return "E" + t + (chunks > 2 ? "(" + t + ")*" + std::to_string(chunks - 2) : std::string()) + "t*" + std::to_string(rest) +
         std::string(static_cast<std::size_t>(mtp_layers), 'm') + "L";
}

std::vector<std::int64_t> parse_pipeline_layout(const std::string& layout, std::int64_t& mtp_layers) {
  const std::string symbols = LayoutExpander(layout).run();
  auto fail = [&](const std::string& why) { throw InputError("pipeline_layout = \"" + layout + "\" (" + why + ")"); };
  std::vector<std::int64_t> counts(1, 0);
  mtp_layers = 0;
  for (std::size_t i = 0; i < symbols.size(); ++i) {
    const char c = symbols[i];
    if (c == '|') counts.push_back(0);
    else if (c == 't') ++counts.back();
    else if (c == 'm' && symbols.find('|', i) != std::string::npos) fail("m, an MTP layer, belongs in the last chunk");
    else if (c == 'm') ++mtp_layers;
    else if (c == 'E' && i != 0) fail("E, the embedding, must open the first chunk");
    else if (c == 'L' && i + 1 != symbols.size()) fail("L, the loss, must close the last chunk");
  }
  if (symbols.empty() || symbols.front() != 'E') fail("the first chunk must start with E, the embedding");
  if (symbols.back() != 'L') fail("the last chunk must end with L, the loss");
  return counts;
}

std::vector<PipelineChunk> pipeline_chunks(const ModelSpec& model, const Parallelism& p) {
  const std::int64_t L = model.num_layers;
  const std::int64_t units = L + p.split.embedding_as_layer + p.split.loss_as_layer;
  if (p.split.layout.empty() && p.pp * p.vp > units)
    throw InputError((p.vp > 1 ? "vp = " + str(p.vp) : "pp = " + str(p.pp)) + " (pp x vp = " + str(p.pp * p.vp) +
                     " chunks exceed num_layers = " + str(L) + (units != L ? " plus the embedding/loss counted as layers" : "") + ")");
  const bool uneven = p.split.first_stage_layers != 0 || p.split.last_stage_layers != 0;
  const auto counts = !p.split.layout.empty() ? layout_counts(L, model.mtp_layers, p) : uneven ? uneven_counts(L, p) : even_counts(L, p);
  std::vector<PipelineChunk> chunks(counts.size());
  std::int64_t first = 0;
  for (std::size_t k = 0; k < counts.size(); ++k) {
    chunks[k].first_layer = first;
    chunks[k].end_layer = first += counts[k];
    chunks[k].stage = static_cast<int>(static_cast<std::int64_t>(k) % p.pp);
  }
  chunks.front().embedding = true;
  chunks.back().head = true;
  chunks.back().end_layer += model.mtp_layers;  // the MTP modules run before the head, on the last stage
  return chunks;
}

}  // namespace hbmsim
