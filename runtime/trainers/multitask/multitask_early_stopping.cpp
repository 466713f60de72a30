// MultiTaskTrainer's early stopping per member (options.patience()): after each epoch
// every member's classification loss on the validation sentences; a member that
// improved has its weights kept, one without improvement for `patience` epochs gets
// its best weights back and is masked out of the optimizer (its update and weight
// decay are skipped, in the captured step too: the mask is read in place).
#include "packtrain/runtime/trainers/multitask/multitask_trainer.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

namespace packtrain::runtime {

void MultiTaskTrainer::set_validation_data(const LabelledTexts& validation) { validation_ = validation; }

int64_t MultiTaskTrainer::members_training() const {
  if (member_best_.empty()) return model_->members();
  return std::count_if(member_best_.begin(), member_best_.end(), [](const MemberBest& m) { return !m.stopped; });
}

void MultiTaskTrainer::watch_validation(MultiTaskEpochReport& report) {
  const int64_t K = model_->members();
  report.members_training = members_training();
  if (options_.patience() <= 0) return;  // train_epoch checked the validation sentences
  if (member_best_.empty()) member_best_.assign(static_cast<size_t>(K), MemberBest{});
  // Each member's mean negative log-likelihood of the true classes (float64), its
  // probabilities clipped to [eps, 1 - eps] as scikit-learn's log_loss does (a member
  // sure of a wrong class scores -log(eps), not infinity).
  const at::Tensor probabilities = member_scores(validation_.texts);  // (K, N, C)
  const at::Tensor labels = at::tensor(validation_.labels, at::kLong).view({1, -1, 1}).expand({K, -1, 1});
  constexpr double eps = std::numeric_limits<double>::epsilon();
  const at::Tensor loss = -probabilities.gather(2, labels).squeeze(2).clamp(eps, 1 - eps).log().mean(1);
  at::NoGradGuard no_grad;
  ensemble::PackedParameters& parameters = model_->parameters();
  if (!best_rows_.defined()) {
    best_rows_ = at::stack([&] {
      std::vector<at::Tensor> rows;
      for (int64_t k = 0; k < K; ++k) rows.push_back(parameters.member_row(k));
      return rows;
    }());
  }
  const at::Tensor losses = loss.contiguous();  // (K) float64 on the CPU: read once, not per member
  const double* loss_of = losses.data_ptr<double>();
  std::vector<int64_t> improved, stopped;
  for (int64_t k = 0; k < K; ++k) {
    MemberBest& m = member_best_[static_cast<size_t>(k)];
    const double v = loss_of[k];
    report.member_validation_loss.push_back(m.stopped ? m.loss : v);
    if (m.stopped) continue;
    if (std::isfinite(v) && v < m.loss) {
      m.loss = v;
      m.epoch = epochs_done_;
      improved.push_back(k);
    } else if (epochs_done_ - m.epoch >= options_.patience()) {
      m.stopped = true;
      stopped.push_back(k);
      report.events.push_back(
          m.epoch > 0 ? fmt::format("member {} stopped early at epoch {} (best validation loss {:.4f} at epoch {}; "
                                    "its weights restored)",
                                    k, epochs_done_, m.loss, m.epoch)
                      : fmt::format("member {} stopped at epoch {}: no finite validation loss yet", k, epochs_done_));
    }
  }
  for (const int64_t k : improved) best_rows_[k].copy_(parameters.member_row(k));
  write_best_rows(stopped);
  if (!stopped.empty()) {
    std::vector<uint8_t> training;
    for (const MemberBest& m : member_best_) training.push_back(m.stopped ? 0 : 1);
    optimizer_->set_mask(at::tensor(training, at::kByte).to(at::kBool));
  }
  report.members_training = members_training();
}

void MultiTaskTrainer::restore_best_members() {
  std::vector<int64_t> all(member_best_.size());
  std::iota(all.begin(), all.end(), 0);
  write_best_rows(all);
}

void MultiTaskTrainer::write_best_rows(const std::vector<int64_t>& members) {
  if (!best_rows_.defined()) return;
  std::vector<int64_t> with_best;  // a member that never improved has no best weights to return to
  for (const int64_t k : members) {
    if (member_best_[static_cast<size_t>(k)].epoch > 0) with_best.push_back(k);
  }
  if (with_best.empty()) return;
  at::NoGradGuard no_grad;
  model_->parameters().write_member_rows(
      best_rows_.index_select(0, at::tensor(with_best, at::kLong).to(best_rows_.device())), with_best);
}

}  // namespace packtrain::runtime
