// Hyperparameter sweeps in one pack (runtime/trainers/ensemble/hyperparameter_sweep.h).
#include "packtrain/runtime/trainers/ensemble/hyperparameter_sweep.h"

#include "packtrain/base/number_text.h"
#include "packtrain/base/user_error.h"
#include "packtrain/runtime/trainers/ensemble/ensemble_trainer.h"
#include "packtrain/runtime/trainers/memory_estimate.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

namespace packtrain::runtime {

namespace {
// Non-empty, finite and without repeats (a NaN is named as such, never as a repeat).
void check_axis(const std::vector<double>& values, const char* name) {
  if (values.empty()) throw UserError(std::string("a sweep needs at least one ") + name);
  check_distinct(values, std::string("a sweep's ") + name + " values");
}
}  // namespace

size_t SweepGrid::configurations() const {
  return lr.size() * weight_decay.size() * std::max<size_t>(dropout.size(), 1) * std::max<size_t>(hidden.size(), 1) *
         std::max<size_t>(channels.size(), 1);
}

namespace {
// "[8, 16]"
std::string list_text(const std::vector<int64_t>& values) {
  std::string text;
  for (const int64_t v : values) text += (text.empty() ? "" : ", ") + std::to_string(v);
  return "[" + text + "]";
}

// The channel lists of a sweep: non-empty, positive, distinct, one count per block
// each (the pack's blocks are one depth); the widest count of each block.
std::vector<int64_t> check_channel_lists(const std::vector<std::vector<int64_t>>& lists) {
  std::vector<int64_t> widest(lists.front().size(), 0);
  for (size_t i = 0; i < lists.size(); ++i) {
    const std::vector<int64_t>& list = lists[i];
    if (list.empty()) throw UserError("a sweep's channel lists must each give at least one block's channels");
    if (list.size() != widest.size()) {
      throw UserError("a sweep's channel lists differ in their number of blocks (" + list_text(lists.front()) +
                      " and " + list_text(list) + "): members of one pack have the same depth; give every list " +
                      std::to_string(widest.size()) + " counts");
    }
    for (size_t b = 0; b < list.size(); ++b) {
      if (list[b] < 1) throw UserError("a sweep's channels must be positive, got " + list_text(list));
      widest[b] = std::max(widest[b], list[b]);
    }
    for (size_t j = 0; j < i; ++j) {
      if (lists[j] == list) throw UserError("a sweep's channel lists repeat " + list_text(list));
    }
  }
  return widest;
}
}  // namespace

EnsembleTrainerOptions sweep_options(EnsembleTrainerOptions base, const SweepGrid& grid) {
  check_axis(grid.lr, "learning rate");
  check_axis(grid.weight_decay, "weight decay");
  const std::vector<double> rates = grid.dropout.empty() ? std::vector<double>{base.dropout()} : grid.dropout;
  check_axis(rates, "dropout rate");
  const std::vector<int64_t> widths = grid.hidden.empty() ? std::vector<int64_t>{base.hidden()} : grid.hidden;
  std::vector<double> width_values(widths.begin(), widths.end());
  check_axis(width_values, "hidden width");
  for (const int64_t w : widths) {
    if (w < 1) throw UserError("a sweep's hidden widths must be positive, got " + std::to_string(w));
  }
  const std::vector<std::vector<int64_t>> channel_lists =
      grid.channels.empty() ? std::vector<std::vector<int64_t>>{base.channels()} : grid.channels;
  const std::vector<int64_t> widest_channels = check_channel_lists(channel_lists);
  if (grid.seeds < 1) throw UserError("a sweep needs at least one member per configuration");
  const auto configurations = static_cast<int64_t>(grid.configurations());
  if (grid.seeds > std::numeric_limits<int64_t>::max() / configurations) {
    throw UserError("a sweep of " + std::to_string(configurations) + " configurations x " + std::to_string(grid.seeds) +
                    " members each has more members than can be counted");
  }
  const int64_t members = configurations * grid.seeds;
  const int64_t widest = *std::max_element(widths.begin(), widths.end());
  // Before any per-member value exists (four numbers a member, copied with the
  // options): the least a pack of this many members needs, whatever its data (one
  // feature, no rows), must be available.
  check_memory(
      estimate_ensemble_run(EnsembleTrainerOptions(base).members(members).hidden(widest).channels(widest_channels),
                            EnsembleRunSizes{}),
      "sweep fewer values, or lower --members (members per configuration), --hidden or --depth (or run "
      "where more memory is free)");
  std::vector<double> lr, wd, dropout;
  std::vector<int64_t> hidden, channels;
  lr.reserve(static_cast<size_t>(members));
  wd.reserve(static_cast<size_t>(members));
  dropout.reserve(static_cast<size_t>(members));
  hidden.reserve(static_cast<size_t>(members));
  for (const std::vector<int64_t>& c : channel_lists) {
    for (const int64_t h : widths) {
      for (const double l : grid.lr) {
        for (const double w : grid.weight_decay) {
          for (const double p : rates) {
            for (int64_t s = 0; s < grid.seeds; ++s) {
              channels.insert(channels.end(), c.begin(), c.end());
              hidden.push_back(h);
              lr.push_back(l);
              wd.push_back(w);
              dropout.push_back(p);
            }
          }
        }
      }
    }
  }
  base.members(static_cast<int64_t>(lr.size())).member_lr(lr).member_weight_decay(wd);
  // One rate: the model's own dropout (its draws as without a sweep); one width: the
  // pack's own (no padding).
  if (rates.size() > 1) base.member_dropout(dropout);
  if (widths.size() > 1) base.hidden(widest).member_hidden(hidden);
  if (channel_lists.size() > 1) base.channels(widest_channels).member_channels(channels);
  return base;
}

std::vector<SweepConfiguration> sweep_configurations(const EnsembleTrainerOptions& o) {
  const int64_t K = o.members();
  const auto lr = [&](int64_t k) { return o.member_lr().empty() ? o.lr() : o.member_lr()[static_cast<size_t>(k)]; };
  const auto wd = [&](int64_t k) {
    return o.member_weight_decay().empty() ? o.weight_decay() : o.member_weight_decay()[static_cast<size_t>(k)];
  };
  const auto dropout = [&](int64_t k) {
    return o.member_dropout().empty() ? o.dropout() : o.member_dropout()[static_cast<size_t>(k)];
  };
  const auto hidden = [&](int64_t k) {
    return o.member_hidden().empty() ? o.hidden() : o.member_hidden()[static_cast<size_t>(k)];
  };
  const std::vector<std::vector<int64_t>> member_channels = o.member_channel_lists();
  const auto channels = [&](int64_t k) {
    return member_channels.empty() ? std::vector<int64_t>{} : member_channels[static_cast<size_t>(k)];
  };
  std::vector<SweepConfiguration> out;
  for (int64_t k = 0; k < K; ++k) {
    if (out.empty() || out.back().lr != lr(k) || out.back().weight_decay != wd(k) || out.back().dropout != dropout(k) ||
        out.back().hidden != hidden(k) || out.back().channels != channels(k)) {
      out.push_back({lr(k), wd(k), dropout(k), hidden(k), channels(k), k, 0});
    }
    ++out.back().members;
  }
  return out;
}

std::vector<ConfigurationReport> report_configurations(const EnsembleTrainer& trainer, const at::Tensor& val_x,
                                                       const at::Tensor& val_y, const at::Tensor& test_x,
                                                       const at::Tensor& test_y) {
  const Head head = trainer.options().head();
  const bool validated = val_x.defined() && val_x.size(0) > 0;
  const bool tested = test_x.defined() && test_x.size(0) > 0;
  const EnsemblePrediction val = validated ? trainer.predict_uncalibrated(val_x) : EnsemblePrediction{};
  const EnsemblePrediction test = tested ? trainer.predict_uncalibrated(test_x) : EnsemblePrediction{};
  std::vector<ConfigurationReport> out;
  for (const SweepConfiguration& c : sweep_configurations(trainer.options())) {
    ConfigurationReport r;
    r.configuration = c;
    for (int64_t k = c.first_member; k < c.first_member + c.members; ++k) {
      r.usable += trainer.member_states()[static_cast<size_t>(k)].usable ? 1 : 0;
    }
    if (r.usable == 0) {
      out.push_back(r);
      continue;
    }
    if (validated) {
      r.validation = ensemble_metrics(member_range(val, c.first_member, c.members, head, trainer.classes()), val_y,
                                      head, trainer.classes());
      double sum = 0;
      int64_t n = 0;
      for (int64_t k = c.first_member; k < c.first_member + c.members; ++k) {
        if (!trainer.member_states()[static_cast<size_t>(k)].usable) continue;
        const Metrics& m = r.validation.members[static_cast<size_t>(k - c.first_member)];
        sum += head == Head::kMean ? m.rmse : m.nll;
        ++n;
      }
      r.val_loss = sum / static_cast<double>(n);
    }
    if (tested) {
      r.test = ensemble_metrics(member_range(test, c.first_member, c.members, head, trainer.classes()), test_y, head,
                                trainer.classes());
    }
    out.push_back(r);
  }
  return out;
}

size_t best_configuration(const std::vector<ConfigurationReport>& reports) {
  size_t best = reports.size();
  for (size_t i = 0; i < reports.size(); ++i) {
    if (std::isfinite(reports[i].val_loss) &&
        (best == reports.size() || reports[i].val_loss < reports[best].val_loss)) {
      best = i;
    }
  }
  if (best == reports.size()) {
    throw UserError("choosing a configuration needs validation rows (--val-fraction > 0 or --val-index)");
  }
  return best;
}

}  // namespace packtrain::runtime
