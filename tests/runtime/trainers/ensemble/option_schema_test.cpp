// The options schemas (base/option_schema.h) of the ensemble trainer
// (runtime/trainers/ensemble/ensemble_trainer_options.cpp), the multi-task trainer
// (multitask_trainer_options.cpp), active learning and acquisition
// (runtime/trainers/uncertainty/): every field of the structs is described, every
// field survives JSON at a non-default value, older payloads are upgraded, and
// ranges, types and the run-dependent patience are the library's.
#include "packtrain/base/option_schema.h"
#include "packtrain/base/user_error.h"
#include "packtrain/runtime/trainers/ensemble/ensemble_trainer_options.h"
#include "packtrain/runtime/trainers/multitask/multitask_trainer.h"
#include "packtrain/runtime/trainers/uncertainty/acquisition.h"
#include "packtrain/runtime/trainers/uncertainty/active_learning.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>

namespace packtrain::runtime {
namespace {

using ::testing::HasSubstr;
using Field = OptionField<EnsembleTrainerOptions>;

const OptionSchema<EnsembleTrainerOptions>& schema() { return trainer_option_schema(); }

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const UserError& e) {
    return e.what();
  }
  return "no UserError";
}

// The TORCH_ARG fields of `struct <name>` in a header of the tree: a field added to
// the struct but not to its schema would be missing from JSON, validation, the CLI
// and Python alike, which no round trip can see.
// `plain`: the struct's plain members (`double power = 1.0;`) instead of TORCH_ARGs.
std::set<std::string> struct_fields(const std::string& header, const std::string& name, bool plain = false) {
  const std::string path = std::string(PACKTRAIN_SOURCE_DATA_DIR) + "/../" + header;
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  std::stringstream text;
  text << in.rdbuf();
  const std::string all = text.str();
  const size_t begin = all.find("struct " + name + " {");
  const size_t end = all.find("\n};", begin);
  EXPECT_NE(begin, std::string::npos) << name << " in " << path;
  const std::string body = all.substr(begin, end - begin);
  std::set<std::string> names;
  const std::regex arg(plain ? R"(\n  [\w:<>]+ (\w+) = )" : R"(TORCH_ARG\((?:[^()]|\([^()]*\))*,\s*(\w+)\))");
  for (auto it = std::sregex_iterator(body.begin(), body.end(), arg); it != std::sregex_iterator(); ++it) {
    names.insert((*it)[1]);
  }
  return names;
}

template <typename O>
std::set<std::string> described(const OptionSchema<O>& s) {
  std::set<std::string> names;
  for (const OptionField<O>& f : s.fields()) EXPECT_TRUE(names.insert(f.name).second) << f.name << " twice";
  return names;
}

TEST(TrainerOptionSchema, DescribesEveryFieldOfTheStructOnce) {
  std::set<std::string> fields =
      struct_fields("runtime/trainers/ensemble/ensemble_trainer_options.h", "EnsembleTrainerOptions");
  EXPECT_GT(fields.size(), 25u) << "the header's fields were not found";
  EXPECT_EQ(fields.erase("log"), 1u);  // a callback, not an option: never serialized
  EXPECT_EQ(described(schema()), fields);
}

TEST(MultiTaskOptionSchema, DescribesEveryFieldOfTheStructAndItsModelOnce) {
  std::set<std::string> fields =
      struct_fields("runtime/trainers/multitask/multitask_trainer.h", "MultiTaskTrainerOptions");
  EXPECT_GT(fields.size(), 15u) << "the header's fields were not found";
  for (const char* not_an_option : {"log", "layer_timer", "model"}) EXPECT_EQ(fields.erase(not_an_option), 1u);
  std::set<std::string> model = struct_fields("ensemble/packed_transformer.h", "PackedTransformerOptions");
  // The model's device is chosen at load; its seed is the trainer's.
  for (const char* not_an_option : {"device", "seed"}) EXPECT_EQ(model.erase(not_an_option), 1u);
  fields.insert(model.begin(), model.end());
  EXPECT_EQ(described(multitask_option_schema()), fields);
}

// A value of the field's kind other than `now`, inside its range.
template <typename O>
nlohmann::json other_value(const OptionField<O>& f, const nlohmann::json& now) {
  switch (f.kind) {
    case OptionKind::kFlag: return !now.get<bool>();
    case OptionKind::kChoice:
    case OptionKind::kText:
      if (!f.choices.empty()) return f.choices.front() == now.get<std::string>() ? f.choices.back() : f.choices.front();
      return now.get<std::string>() == "cpu" ? "cuda:1" : "cpu";  // the device
    case OptionKind::kNumbers: return nlohmann::json::array({0.25, 0.5});
    case OptionKind::kIntegers: return nlohmann::json::array({5, 7});
    case OptionKind::kInteger:
    case OptionKind::kUnsigned: return now.is_null() ? 7 : now.get<int64_t>() + 3;
    case OptionKind::kNumber: {
      const double v = now.get<double>();
      return f.accepts(v * 0.5) && v * 0.5 != v ? v * 0.5 : 0.25;
    }
  }
  return nullptr;
}

// Every field set to another value survives the schema's JSON, and returns that value.
template <typename O>
O every_field_changed(const OptionSchema<O>& s) {
  const O defaults;
  O changed;
  for (const OptionField<O>& f : s.fields()) {
    const nlohmann::json v = other_value(f, f.get(defaults));
    f.set(changed, v);
    EXPECT_NE(f.get(changed), f.get(defaults)) << f.name << " did not change";
    EXPECT_EQ(f.get(changed), v) << f.name;
  }
  const nlohmann::json saved = s.to_json(changed);
  EXPECT_EQ(saved.at("format_version"), s.format_version());
  const O loaded = s.from_json(nlohmann::json::parse(saved.dump()));
  for (const OptionField<O>& f : s.fields()) EXPECT_EQ(f.get(loaded), f.get(changed)) << f.name;
  return changed;
}

TEST(TrainerOptionSchema, EveryFieldRoundTripsAtANonDefaultValue) {
  EnsembleTrainerOptions changed = every_field_changed(schema());
  // Through the public pair too (which validates: per-member lists as long as members).
  changed.members(2).first_member(0).device(c10::Device("cpu"));
  changed.member_channels({5, 7, 3, 7});  // 2 members x the 2 blocks of channels {5, 7}
  ASSERT_EQ(changed.channels(), (std::vector<int64_t>{5, 7}));
  // LayerNorm and members of different widths exclude each other: each round-trips
  // changed beside the other at its default.
  ASSERT_TRUE(changed.layer_norm());
  ASSERT_FALSE(changed.member_hidden().empty());
  for (const bool norm : {true, false}) {
    EnsembleTrainerOptions one = changed;
    if (norm) {
      one.member_hidden({});
    } else {
      one.layer_norm(false).member_hidden({1, 1}).hidden(std::max<int64_t>(changed.hidden(), 1));
    }
    EXPECT_EQ(to_json(options_from_json(to_json(one))), to_json(one)) << "layer norm " << norm;
  }
}

TEST(MultiTaskOptionSchema, EveryFieldRoundTripsAtANonDefaultValue) {
  MultiTaskTrainerOptions changed = every_field_changed(multitask_option_schema());
  // Through the public pair too (which validates the combination).
  changed.model().vocab(259).width(32).heads(2).layers(2).max_length(64).classes(3).kv_heads(1);
  changed.buckets({16, 64}).pipeline_stages(1).pipeline_boundaries({}).micro_batches(1).batch_size(8).shared_inputs(
      true);
  changed.member_lrs(std::vector<double>(static_cast<size_t>(changed.model().members()), 2e-3));  // one per member
  EXPECT_EQ(to_json(multitask_options_from_json(to_json(changed))), to_json(changed));
}

TEST(TrainerOptionSchema, AVersionOnePayloadIsUpgradedAndAMissingKeyIsAnError) {
  nlohmann::json v1 = schema().to_json(EnsembleTrainerOptions().early_stopping(EarlyStopping::kEnsemble));
  v1.erase("format_version");
  for (const Field& f : schema().fields()) {
    if (f.since > 1) v1.erase(f.name);
  }
  const EnsembleTrainerOptions old = options_from_json(v1.dump());
  EXPECT_EQ(old.early_stopping(), EarlyStopping::kMember);  // as version 1 stopped
  EXPECT_EQ(old.recalibration(), Recalibration::kNone);     // as version 1 predicted
  EXPECT_EQ(old.first_member(), 0);
  EXPECT_TRUE(old.member_lr().empty());
  nlohmann::json v2 = schema().to_json(EnsembleTrainerOptions());
  v2.erase("early_stopping");
  EXPECT_THAT(error_of([&] { options_from_json(v2.dump()); }), HasSubstr("missing key 'early_stopping'"));
  v2 = schema().to_json(EnsembleTrainerOptions());
  v2["format_version"] = kTrainerOptionsFormat + 1;
  EXPECT_THAT(error_of([&] { options_from_json(v2.dump()); }), HasSubstr("written by a newer packtrain"));
  v2 = schema().to_json(EnsembleTrainerOptions());
  v2.erase("hidden");
  v2.erase("format_version");  // a version-1 payload had every version-1 key too
  EXPECT_THAT(error_of([&] { options_from_json(v2.dump()); }), HasSubstr("missing key 'hidden'"));
}

TEST(TrainerOptionSchema, WrongTypesUnknownKeysAndBadNamesAreUserErrors) {
  const auto with = [](const std::string& key, const nlohmann::json& value) {
    nlohmann::json j = schema().to_json(EnsembleTrainerOptions());
    j[key] = value;
    return error_of([&] { options_from_json(j.dump()); });
  };
  EXPECT_THAT(with("members", 2.5), HasSubstr("key 'members' has the wrong type: 2.5"));
  EXPECT_THAT(with("layer_norm", 1), HasSubstr("key 'layer_norm' has the wrong type"));
  EXPECT_THAT(with("seed", -1), HasSubstr("key 'seed' has the wrong type"));
  EXPECT_THAT(with("lr", "0.1"), HasSubstr("key 'lr' has the wrong type"));
  EXPECT_THAT(with("head", "median"), HasSubstr("unknown head 'median' (expected mean, gaussian or classification)"));
  EXPECT_THAT(with("device", "gpu7"), HasSubstr("'gpu7' is not a device"));
  EXPECT_THAT(with("bogus", 1), HasSubstr("unknown key 'bogus'"));
  EXPECT_EQ(error_of([] { options_from_json("{"); }), "trainer options: not valid JSON");
}

TEST(TrainerOptionSchema, ValidateChecksTheSchemasRanges) {
  const auto problem = [](const EnsembleTrainerOptions& o) { return error_of([&] { o.validate(); }); };
  EXPECT_EQ(problem(EnsembleTrainerOptions().members(0)), "members must be > 0, got 0");
  EXPECT_EQ(problem(EnsembleTrainerOptions().dropout(1.5)), "dropout must be in [0, 1), got 1.5");
  EXPECT_EQ(problem(EnsembleTrainerOptions().lr(std::numeric_limits<double>::infinity())),
            "lr must be > 0 and finite, got inf");
  EXPECT_EQ(problem(EnsembleTrainerOptions().patience(-1)), "patience must be >= 0, got -1");
  EXPECT_EQ(problem(EnsembleTrainerOptions().members(2).member_dropout({0.1, 1.0})),
            "member_dropout must be in [0, 1), got 1");
  EXPECT_EQ(problem(EnsembleTrainerOptions().members(3).member_lr({0.1})),
            "per-member learning rates: expected one per member (3), got 1");
  EXPECT_EQ(problem(EnsembleTrainerOptions()), "no UserError");
}

TEST(TrainerOptionSchema, PatienceUnsetIsTheRunsDefault) {
  const EnsembleTrainerOptions unset;
  EXPECT_FALSE(unset.patience().has_value());
  EXPECT_EQ(resolved_patience(unset, /*has_validation=*/true), kDefaultPatience);
  EXPECT_EQ(resolved_patience(unset, /*has_validation=*/false), 0);
  EXPECT_EQ(resolved_patience(EnsembleTrainerOptions().patience(0), false), 0);
  EXPECT_EQ(resolved_patience(EnsembleTrainerOptions().patience(7), true), 7);
  EXPECT_THAT(error_of([] { resolved_patience(EnsembleTrainerOptions().patience(7), false); }),
              HasSubstr("patience > 0 needs validation rows"));
  // Unset is kept as unset (null) in JSON: a resumed run resolves it as the first did.
  EXPECT_TRUE(schema().to_json(unset).at("patience").is_null());
  EXPECT_FALSE(options_from_json(to_json(unset)).patience().has_value());
}

TEST(TrainerOptionSchema, DescribesItselfForPythonAndTheDocs) {
  const nlohmann::json d = schema().describe();
  ASSERT_EQ(d.size(), schema().fields().size());
  std::map<std::string, nlohmann::json> by_name;
  for (const auto& f : d) by_name[f.at("name")] = f;
  EXPECT_EQ(by_name.at("members").at("default"), 16);
  EXPECT_EQ(by_name.at("members").at("min"), 0.0);
  EXPECT_TRUE(by_name.at("members").at("min_open").get<bool>());
  EXPECT_EQ(by_name.at("batch_size").at("flag"), "--batch");
  EXPECT_EQ(by_name.at("capture").at("flag"), "--eager");
  EXPECT_TRUE(by_name.at("capture").at("flag_sets_false").get<bool>());
  EXPECT_EQ(by_name.at("head").at("choices"), nlohmann::json({"mean", "gaussian", "classification"}));
  EXPECT_TRUE(by_name.at("lr").at("sweep").get<bool>());
  EXPECT_FALSE(by_name.at("first_member").at("python").get<bool>());
  EXPECT_EQ(by_name.at("first_member").at("flag"), "");
  EXPECT_EQ(by_name.at("early_stopping").at("default"), "ensemble");
}

// --- active learning and acquisition (runtime/trainers/uncertainty/)

TEST(AcquisitionOptionSchema, DescribesEveryFieldOfTheStructOnce) {
  const std::set<std::string> fields =
      struct_fields("runtime/trainers/uncertainty/acquisition.h", "AcquisitionOptions", /*plain=*/true);
  EXPECT_EQ(fields, (std::set<std::string>{"strategy", "selection", "ucb_beta", "power", "seed"}));
  EXPECT_EQ(described(acquisition_option_schema()), fields);
}

TEST(ActiveLearningOptionSchema, DescribesEveryFieldOfTheStructAndItsAcquisitionOnce) {
  std::set<std::string> fields =
      struct_fields("runtime/trainers/uncertainty/active_learning.h", "ActiveLearningOptions");
  EXPECT_GT(fields.size(), 5u) << "the header's fields were not found";
  EXPECT_EQ(fields.erase("acquisition"), 1u);  // nested: its own fields, below
  for (const OptionField<AcquisitionOptions>& f : acquisition_option_schema().fields()) {
    fields.insert(f.name == "seed" ? "acquisition_seed" : f.name);  // the loop has a seed of its own
  }
  EXPECT_EQ(described(active_learning_option_schema()), fields);
}

TEST(AcquisitionOptionSchema, EveryFieldRoundTripsAtANonDefaultValue) {
  const AcquisitionOptions changed = every_field_changed(acquisition_option_schema());
  EXPECT_NE(changed.strategy, AcquisitionOptions().strategy);
  EXPECT_NE(changed.seed, AcquisitionOptions().seed);
  const nlohmann::json saved = acquisition_option_schema().to_json(changed);
  EXPECT_EQ(acquisition_option_schema().to_json(acquisition_option_schema().parse(saved.dump())), saved);
}

TEST(ActiveLearningOptionSchema, EveryFieldRoundTripsAtANonDefaultValue) {
  const ActiveLearningOptions changed = every_field_changed(active_learning_option_schema());
  // The nested acquisition's fields reach the nested struct.
  const AcquisitionOptions defaults;
  EXPECT_NE(changed.acquisition().strategy, defaults.strategy);
  EXPECT_NE(changed.acquisition().selection, defaults.selection);
  EXPECT_NE(changed.acquisition().ucb_beta, defaults.ucb_beta);
  EXPECT_NE(changed.acquisition().power, defaults.power);
  EXPECT_NE(changed.acquisition().seed, defaults.seed);
  EXPECT_NE(changed.seed(), ActiveLearningOptions().seed());
  EXPECT_NO_THROW(changed.validate());
}

TEST(ActiveLearningOptionSchema, ValidateChecksTheSchemasRanges) {
  const auto problem = [](const ActiveLearningOptions& o) { return error_of([&] { o.validate(); }); };
  EXPECT_EQ(problem(ActiveLearningOptions().initial(0)), "active learning: initial must be > 0, got 0");
  EXPECT_EQ(problem(ActiveLearningOptions().ensembles(-2)), "active learning: ensembles must be > 0, got -2");
  ActiveLearningOptions bad_power;
  bad_power.acquisition().power = -1;
  EXPECT_EQ(problem(bad_power), "active learning: power must be >= 0 and finite, got -1");
  EXPECT_EQ(problem(ActiveLearningOptions()), "no UserError");
  AcquisitionOptions beta;
  beta.ucb_beta = std::numeric_limits<double>::quiet_NaN();
  EXPECT_THAT(error_of([&] { beta.validate(); }), HasSubstr("ucb_beta must be in [-1e+06, 1e+06], got nan"));
  beta.ucb_beta = 1e6;
  EXPECT_EQ(error_of([&] { beta.validate(); }), "no UserError");
}

TEST(ActiveLearningOptionSchema, NamesItsFlagsAsTheCliDid) {
  std::map<std::string, std::string> flags;
  for (const auto& f : active_learning_option_schema().fields()) flags[f.name] = f.flag;
  EXPECT_EQ(flags.at("ensembles"), "--runs");
  EXPECT_EQ(flags.at("seed"), "--al-seed");
  EXPECT_EQ(flags.at("ucb_beta"), "--ucb-beta");
  EXPECT_EQ(flags.at("random_baseline"), "--no-random-baseline");
  EXPECT_EQ(flags.at("acquisition_seed"), "");  // --seed is the trainer's
  EXPECT_EQ(acquisition_option_schema().find("seed")->flag, "--seed");
  EXPECT_EQ(default_strategy(/*classification=*/true), AcquisitionStrategy::kBald);
  EXPECT_EQ(default_strategy(/*classification=*/false), AcquisitionOptions().strategy);
}

}  // namespace
}  // namespace packtrain::runtime
