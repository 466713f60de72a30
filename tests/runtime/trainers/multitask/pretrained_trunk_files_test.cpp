// A trunk folder's config.json and file list as a careless or hostile user leaves
// them (issue 51): every config value of the wrong type is a UserError naming the
// file, never nlohmann's type_error; a fuzz-style loop over mutated GPT-2 and Llama
// configs meets only UserErrors (`bash scripts/sanitize.sh multitask_tests` runs it
// under AddressSanitizer and UBSan); the folder's files are listed (shards the index
// names included) and a checkpoint's record of them catches a changed, gone or new
// file. (The loaded weights against transformers: python/tests/test_pretrained_trunk.py.)
#include "packtrain/runtime/trainers/multitask/pretrained_trunk.h"

#include "packtrain/base/user_error.h"
#include "tests/support/test_support.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

namespace packtrain::runtime {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

void write(const fs::path& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

nlohmann::json gpt2_config() {
  return {{"model_type", "gpt2"},
          {"vocab_size", 300},
          {"n_embd", 16},
          {"n_layer", 1},
          {"n_head", 2},
          {"n_positions", 64},
          {"n_inner", nullptr},
          {"activation_function", "gelu_new"},
          {"layer_norm_epsilon", 1e-5},
          {"tie_word_embeddings", true}};
}

nlohmann::json llama_config() {
  return {{"model_type", "llama"},
          {"vocab_size", 300},
          {"hidden_size", 16},
          {"intermediate_size", 32},
          {"num_hidden_layers", 1},
          {"num_attention_heads", 2},
          {"num_key_value_heads", 1},
          {"max_position_embeddings", 64},
          {"rms_norm_eps", 1e-6},
          {"rope_theta", 10000.0},
          {"hidden_act", "silu"},
          {"tie_word_embeddings", false},
          {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", 10000.0}}}};
}

TEST(PretrainedTrunkConfig, ValuesOfTheWrongTypeAreUserErrorsNamingTheFile) {
  const packtrain::testing::ScopedTempDir dir("trunk_config");
  const fs::path file = dir.path() / "config.json";
  const std::vector<std::tuple<nlohmann::json, std::string, nlohmann::json>> cases{
      {gpt2_config(), "/activation_function", 5},
      {gpt2_config(), "/activation_function", nullptr},
      {gpt2_config(), "/n_embd", "16"},
      {gpt2_config(), "/tie_word_embeddings", "yes"},
      {gpt2_config(), "/layer_norm_epsilon", "small"},
      {gpt2_config(), "/model_type", 2},
      {llama_config(), "/hidden_act", 5},
      {llama_config(), "/rope_parameters/rope_type", 5},
      {llama_config(), "/rope_parameters", "default"},
      {llama_config(), "/rope_theta", "big"},
      {llama_config(), "/vocab_size", 18446744073709551615ULL},
  };
  for (const auto& [base, pointer, value] : cases) {
    nlohmann::json config = base;
    config[nlohmann::json::json_pointer(pointer)] = value;
    write(file, config.dump());
    EXPECT_THAT([&] { (void)pretrained_trunk_options(dir.path(), 2); },
                ThrowsMessage<UserError>(HasSubstr(file.string())))
        << pointer << " = " << value.dump();
  }
  write(file, gpt2_config().dump());
  EXPECT_EQ(pretrained_trunk_options(dir.path(), 2).width(), 16);
  write(file, llama_config().dump());
  EXPECT_EQ(pretrained_trunk_options(dir.path(), 2).key_value_heads(), 1);
}

// Fuzz-style: hostile values at random places of both families' configs, and bytes
// flipped or cut, either load or are a UserError. Deterministic (fixed seed).
TEST(PretrainedTrunkConfig, MutatedConfigsLoadOrAreRefusedNeverWorse) {
  const packtrain::testing::ScopedTempDir dir("trunk_config");
  const fs::path file = dir.path() / "config.json";
  const std::vector<nlohmann::json> hostile{-1,
                                            0,
                                            1,
                                            2,
                                            int64_t{1} << 40,
                                            INT64_MAX,
                                            UINT64_MAX,
                                            0.5,
                                            -1e300,
                                            1e300,
                                            "",
                                            "gpt2",
                                            "llama",
                                            "\xff",
                                            nullptr,
                                            true,
                                            false,
                                            nlohmann::json::array(),
                                            nlohmann::json::object(),
                                            nlohmann::json::array({1})};
  std::mt19937_64 rng(51);
  int loaded = 0, refused = 0;
  for (int round = 0; round < 1000; ++round) {
    nlohmann::json config = round % 2 == 0 ? gpt2_config() : llama_config();
    std::vector<std::string> keys;
    const nlohmann::json flat = config.flatten();  // kept: items() refers to it
    for (const auto& [key, value] : flat.items()) keys.push_back(key);
    const int edits = 1 + static_cast<int>(rng() % 3);
    for (int e = 0; e < edits; ++e) {
      try {
        config[nlohmann::json::json_pointer(keys[rng() % keys.size()])] = hostile[rng() % hostile.size()];
      } catch (const nlohmann::json::exception&) {
      }
    }
    std::string text = config.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    if (rng() % 6 == 0) text[rng() % text.size()] = static_cast<char>(rng() % 256);
    if (rng() % 10 == 0) text.resize(rng() % text.size());
    write(file, text);
    try {
      const ensemble::PackedTransformerOptions o = pretrained_trunk_options(dir.path(), 2);
      ASSERT_GT(o.width(), 0) << text;
      ++loaded;
    } catch (const UserError&) {
      ++refused;
    } catch (const c10::Error& e) {
      ADD_FAILURE() << "c10::Error for " << text << ": " << e.what_without_backtrace();
    }
  }
  EXPECT_GT(loaded, 0);
  EXPECT_GT(refused, 0);
}

TEST(PretrainedTrunkFiles, ListEveryFileReadAndARecordCatchesAChange) {
  const packtrain::testing::ScopedTempDir dir("trunk_files");
  const fs::path t = dir.path();
  write(t / "config.json", gpt2_config().dump());
  write(t / "model.safetensors.index.json",
        R"({"weight_map": {"a": "model-1.safetensors", "b": "model-2.safetensors", "c": "../escape.safetensors"}})");
  write(t / "model-1.safetensors", "one");
  write(t / "model-2.safetensors", "two");
  write(t / "tokenizer.json", "{}");
  write(t / "README.md", "not read");
  std::vector<std::string> names;
  for (const fs::path& f : pretrained_trunk_files(t)) names.push_back(f.filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"config.json", "model-1.safetensors", "model-2.safetensors",
                                             "model.safetensors.index.json", "tokenizer.json"}));
  const std::string recorded = trunk_record_json(t);
  EXPECT_NO_THROW(check_trunk_record(recorded, trunk_record_json(t), t, "c.ckpt"));
  write(t / "model-2.safetensors", "TWO");
  EXPECT_THAT([&] { check_trunk_record(recorded, trunk_record_json(t), t, "c.ckpt"); },
              ThrowsMessage<UserError>(AllOf(HasSubstr("model-2.safetensors' changed"), HasSubstr("c.ckpt"))));
  write(t / "model-2.safetensors", "two");
  fs::remove(t / "tokenizer.json");
  write(t / "vocab.json", "{}");
  EXPECT_THAT([&] { check_trunk_record(recorded, trunk_record_json(t), t, "c.ckpt"); },
              ThrowsMessage<UserError>(HasSubstr("tokenizer.json' is gone")));
  write(t / "tokenizer.json", "{}");
  EXPECT_THAT([&] { check_trunk_record(recorded, trunk_record_json(t), t, "c.ckpt"); },
              ThrowsMessage<UserError>(HasSubstr("vocab.json' is new")));
}

}  // namespace
}  // namespace packtrain::runtime
