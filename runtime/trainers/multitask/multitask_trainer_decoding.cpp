// MultiTaskTrainer's decoding: the captured decode step per decoding kind, generate.
#include "packtrain/runtime/trainers/multitask/multitask_trainer.h"

#include "multitask_trainer_internal.h"
#include "packtrain/base/user_error.h"
#include "packtrain/profiling/nvtx.h"
#include "packtrain/runtime/data/data_error.h"
#include "packtrain/runtime/data/text_tokenizer.h"
#include "packtrain/runtime/trainers/multitask/multitask_pipeline.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>
#include <fmt/format.h>

#include <algorithm>
#include <limits>

namespace packtrain::runtime {

MultiTaskTrainer::DecodeSession& MultiTaskTrainer::decode_session(const GenerateOptions& g) {
  const int64_t max_length = options_.model().max_length(), V = options_.model().vocab(), K = model_->members();
  const bool sampled = g.temperature > 0;
  const int64_t top_k = sampled && g.top_k > 0 && g.top_k < V ? g.top_k : 0;
  std::unique_ptr<DecodeSession>& slot = decode_sessions_[{sampled, top_k, g.capture}];
  if (slot) return *slot;
  auto s = std::make_unique<DecodeSession>();
  const auto longs = at::TensorOptions().dtype(at::kLong).device(device_);
  const auto reals = at::TensorOptions().dtype(options_.model().dtype()).device(device_);
  s->sampled = sampled;
  s->cache = model_->make_cache(1);
  s->token = at::zeros({K, 1}, longs);
  s->position = at::zeros({1}, longs);
  s->step_index = at::zeros({1}, longs);
  s->generated = at::full({max_length, K}, tokenizer_->end(), longs);
  if (sampled) {
    s->noise = at::zeros({max_length, K, V}, reals);
    s->temperature = at::ones({}, reals);
  }
  DecodeSession* d = s.get();
  const auto body = [this, d, K, V, top_k](const std::vector<at::Tensor>&) {
    const at::Tensor hidden = model_->decode_step(d->token, d->position, d->cache);  // (K, 1, d)
    at::Tensor logits = model_->lm_logits(hidden.unsqueeze(2)).view({K, V});
    at::Tensor next;
    if (!d->sampled) {
      next = logits.argmax(-1);
    } else {
      at::Tensor z = logits / d->temperature;
      if (top_k > 0) {
        const at::Tensor kth = std::get<0>(z.topk(top_k, -1)).narrow(-1, top_k - 1, 1);
        z = z.masked_fill(z < kth, -std::numeric_limits<double>::infinity());
      }
      next = (z + d->noise.index_select(0, d->step_index).view({K, V})).argmax(-1);
    }
    d->generated.index_copy_(0, d->step_index, next.view({1, K}));
    d->token.copy_(next.view({K, 1}));
    d->position.add_(1);
    d->step_index.add_(1);
  };
  // An eager decode step (CPU, capture off, a failed capture) says why in the log, once.
  s->step = std::make_unique<graphs::CapturedStep>("decode", device_, std::vector<graphs::StaticInput>{}, body,
                                                   graphs::CaptureOptions().capture(g.capture).log(options_.log()));
  slot = std::move(s);
  return *slot;
}

int64_t MultiTaskTrainer::decode_graphs_captured() const {
  int64_t n = 0;
  for (const auto& [key, session] : decode_sessions_) n += session->step->captures();
  return n;
}

std::vector<std::string> MultiTaskTrainer::generate(const std::string& prompt, const GenerateOptions& g) {
  if (pipeline_) {
    throw DataError(
        "score and generate need the whole model: load the pipeline run's checkpoint in one process "
        "(packtrain multitask generate CHECKPOINT assembles its stages)");
  }
  if (g.max_new_tokens < 1) throw UserError("generate: max_new_tokens must be >= 1");
  // The temperature divides float32 logits: beyond float32's range (1e308) it is no number the step can hold.
  if (!(g.temperature >= 0) || g.temperature > std::numeric_limits<float>::max()) {
    throw UserError(fmt::format("generate: temperature must be finite, >= 0 and at most {:g} (float32's range), got {}",
                                static_cast<double>(std::numeric_limits<float>::max()), g.temperature));
  }
  if (g.top_k < 0) throw UserError("generate: top_k must be >= 0");
  const TextTokenizer& tokenizer = *tokenizer_;
  const int64_t max_length = options_.model().max_length(), V = options_.model().vocab(), K = model_->members();
  const std::vector<int64_t> ids = tokenizer.encode_prompt(prompt, max_length);
  const auto n = static_cast<int64_t>(ids.size());
  const int64_t steps = std::min(g.max_new_tokens, max_length - n + 1);
  at::NoGradGuard no_grad;
  const auto longs = at::TensorOptions().dtype(at::kLong).device(device_);
  DecodeSession& session = decode_session(g);
  // The prompt but its last token fills the cache; the last one is the first input
  // of the sampling steps. (Cache entries past the position are masked: no reset.)
  for (int64_t i = 0; i + 1 < n; ++i) {
    session.position.fill_(i);
    model_->decode_step(at::full({K, 1}, ids[static_cast<size_t>(i)], longs), session.position, session.cache);
  }
  session.token.fill_(ids.back());
  session.position.fill_(n - 1);
  session.step_index.zero_();
  session.generated.fill_(tokenizer.end());
  if (session.sampled) {
    // Gumbel-max: argmax(logits / T + Gumbel noise) samples softmax(logits / T).
    auto generator = at::make_generator<at::CPUGeneratorImpl>(g.seed);
    const at::Tensor u = at::rand({steps, K, V}, generator, at::kDouble).clamp_min(1e-300);
    session.noise.narrow(0, 0, steps).copy_(-(-u.log()).log());
    session.temperature.fill_(g.temperature);
  }
  graphs::CapturedStep& decode = *session.step;
  const bool was_warming_up = decode.mode() == graphs::StepMode::kWarmingUp;
  {
    PACKTRAIN_NVTX_RANGE("generate");
    for (int64_t i = 0; i < steps; ++i) decode.run();
  }
  if (was_warming_up && decode.mode() == graphs::StepMode::kWarmingUp) {
    // Not a fallback, but no graph either: every call was an eager warm-up call.
    const graphs::CaptureOptions capture;
    options_.log()(
        fmt::format("step 'decode' ran eagerly: {} new tokens are fewer than the {} calls a graph needs "
                    "({} warm-up calls, then the capture)",
                    steps, capture.warmup_steps() + 1, capture.warmup_steps()));
  }
  const at::Tensor generated = session.generated.narrow(0, 0, steps);
  last_decode_mode_ = graphs::to_string(decode.mode());
  const at::Tensor host = generated.cpu();
  const auto tokens = host.accessor<int64_t, 2>();
  std::vector<std::string> out;
  for (int64_t k = 0; k < K; ++k) {
    std::vector<int64_t> member;
    for (int64_t i = 0; i < steps; ++i) member.push_back(tokens[i][k]);
    out.push_back(tokenizer.decode(member));
  }
  return out;
}

MultiTaskTrainer::ScoredGeneration MultiTaskTrainer::score_and_generate(const std::string& text,
                                                                        const GenerateOptions& options) {
  return {score({text})[0], generate(text, options)};
}

}  // namespace packtrain::runtime
