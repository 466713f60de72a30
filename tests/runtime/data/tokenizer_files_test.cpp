// A trunk folder's tokenizer files as a hostile or careless user hands them over
// (issue 51): every id is checked against the model's vocabulary before anything is
// sized or indexed by it (an added token of id -100000 wrote outside the heap), a
// value of the wrong type is one UserError naming the file (never nlohmann's
// type_error), a FIFO or directory at a tokenizer file's name is refused (never
// waited on), and a fuzz-style loop over mutated tokenizer.json files — run under
// AddressSanitizer and UBSan in CI (scripts/sanitize.sh runs data_tests) — meets
// only UserErrors. (Against `tokenizers` itself: python/tests/test_bpe_tokenizer.py.)
#include "packtrain/runtime/data/text_tokenizer.h"

#include "packtrain/base/user_error.h"
#include "packtrain/runtime/data/bpe_tokenizer.h"
#include "tests/support/test_support.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <sys/stat.h>

#include <algorithm>
#include <cstdint>
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

constexpr int64_t kModelVocab = 50;  // the config's vocab_size the tokenizer must fit

// A small valid GPT-2-style tokenizer.json: byte-level BPE, one merge, <|endoftext|>.
nlohmann::json valid_tokenizer() {
  return nlohmann::json::parse(R"({
    "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2, "<|endoftext|>": 3, "Ġ": 4, "Ġa": 5},
              "merges": ["a b", ["Ġ", "a"]]},
    "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "use_regex": true},
    "added_tokens": [{"id": 3, "content": "<|endoftext|>", "special": true}]
  })");
}

void write(const fs::path& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

// The message of the UserError loading `dir` throws ("loaded" when it loads).
std::string load_error(const fs::path& dir, TokenizerFamily family = TokenizerFamily::kGpt2) {
  try {
    (void)make_checkpoint_text_tokenizer(dir, kModelVocab, family);
  } catch (const UserError& e) {
    return e.what();
  }
  return "loaded";
}

TEST(TokenizerFiles, AValidFileLoadsAndEncodes) {
  const packtrain::testing::ScopedTempDir dir("tokenizer");
  write(dir.path() / "tokenizer.json", valid_tokenizer().dump());
  const auto tokenizer = make_checkpoint_text_tokenizer(dir.path(), kModelVocab, TokenizerFamily::kGpt2);
  EXPECT_EQ(tokenizer->vocab(), 6);
  EXPECT_EQ(tokenizer->encode("ab a", 16, nullptr), (std::vector<int64_t>{2, 5, 3}));
}

// Ids outside the model's vocabulary, from each source, are refused before they
// size or index anything: no write outside the heap, no 1.9 GB allocation, no bad_alloc.
TEST(TokenizerFiles, IdsOutsideTheModelsVocabularyAreRefused) {
  const packtrain::testing::ScopedTempDir dir("tokenizer");
  const fs::path file = dir.path() / "tokenizer.json";
  for (const int64_t id :
       {int64_t{-100000}, int64_t{-1}, kModelVocab, int64_t{50'000'000}, int64_t{2'000'000'000}, INT64_MAX}) {
    nlohmann::json added = valid_tokenizer();
    added["added_tokens"][0]["id"] = id;
    write(file, added.dump());
    EXPECT_THAT(load_error(dir.path()),
                HasSubstr("has id " + std::to_string(id) + ", outside the model's vocabulary of 50"));
    nlohmann::json vocab = valid_tokenizer();
    vocab["model"]["vocab"]["b"] = id;
    write(file, vocab.dump());
    EXPECT_THAT(load_error(dir.path()), HasSubstr("has id " + std::to_string(id)));
  }
  // Without a model (a tokenizer read alone) the bound is 2^24 ids.
  nlohmann::json huge = valid_tokenizer();
  huge["added_tokens"][0]["id"] = 2'000'000'000;
  write(file, huge.dump());
  EXPECT_THAT([&] { (void)BpeTokenizer::from_folder(dir.path()); },
              ThrowsMessage<UserError>(HasSubstr("outside the model's vocabulary of 16777216")));
  // vocab.json + merges.txt: the same check.
  fs::remove(file);
  write(dir.path() / "vocab.json", R"({"a": 0, "b": -7, "<|endoftext|>": 2})");
  write(dir.path() / "merges.txt", "#version: 0.2\na b\n");
  EXPECT_THAT(load_error(dir.path()), HasSubstr("has id -7"));
}

// Each value of the wrong type is one UserError naming the file and the key.
TEST(TokenizerFiles, ValuesOfTheWrongTypeAreUserErrors) {
  const packtrain::testing::ScopedTempDir dir("tokenizer");
  const fs::path file = dir.path() / "tokenizer.json";
  const std::vector<std::pair<std::string, nlohmann::json>> cases{
      {"/model/type", 5},
      {"/model/type", nullptr},
      {"/pre_tokenizer/use_regex", "yes"},
      {"/pre_tokenizer/add_prefix_space", "no"},
      {"/pre_tokenizer/type", 7},
      {"/added_tokens/0/content", 5},
      {"/added_tokens/0/id", "3"},
      {"/added_tokens/0/id", 3.5},
      {"/added_tokens", "none"},
      {"/model/vocab/a", "0"},
      {"/model/merges/0", 5},
  };
  for (const auto& [pointer, value] : cases) {
    nlohmann::json t = valid_tokenizer();
    t[nlohmann::json::json_pointer(pointer)] = value;
    write(file, t.dump());
    const std::string error = load_error(dir.path());
    EXPECT_THAT(error, HasSubstr(file.string())) << pointer << " = " << value.dump();
  }
}

// A FIFO or a directory at a tokenizer file's name is refused at once, naming it.
TEST(TokenizerFiles, AFifoOrDirectoryAtAFileNameIsRefusedNotWaitedOn) {
  for (const std::string name : {"tokenizer.json", "vocab.json", "merges.txt", "tokenizer.model"}) {
    for (const bool fifo : {true, false}) {
      const packtrain::testing::ScopedTempDir dir("tokenizer");
      if (name == "vocab.json") write(dir.path() / "merges.txt", "a b\n");
      if (name == "merges.txt") write(dir.path() / "vocab.json", R"({"a": 0, "b": 1, "<|endoftext|>": 2})");
      const fs::path at = dir.path() / name;
      if (fifo) {
        ASSERT_EQ(::mkfifo(at.c_str(), 0600), 0);
      } else {
        fs::create_directory(at);
      }
      const TokenizerFamily family =
          name == "tokenizer.model" ? TokenizerFamily::kSentencePiece : TokenizerFamily::kGpt2;
      EXPECT_THAT(load_error(dir.path(), family),
                  AllOf(HasSubstr(at.string()), HasSubstr(fifo ? "is a FIFO" : "is a directory")))
          << name;
    }
  }
}

TEST(TokenizerFiles, ALlamaFolderNeedsItsSentencePieceModel) {
  const packtrain::testing::ScopedTempDir dir("tokenizer");
  write(dir.path() / "tokenizer.json", valid_tokenizer().dump());
  EXPECT_THAT(load_error(dir.path(), TokenizerFamily::kSentencePiece),
              HasSubstr("holds a Llama checkpoint but no tokenizer.model"));
  write(dir.path() / "tokenizer.model", "not a protobuf");
  EXPECT_THAT(load_error(dir.path(), TokenizerFamily::kSentencePiece), HasSubstr("is not a SentencePiece model"));
}

// Fuzz-style: mutated tokenizer.json files — values swapped for hostile ones at
// random places, bytes flipped, files cut short — either load, with every id inside
// the model's vocabulary, or are refused with a UserError. Under the sanitizers a bad
// write or read fails the run. Deterministic (fixed seed), so a failure reproduces.
TEST(TokenizerFiles, MutatedFilesLoadOrAreRefusedNeverWorse) {
  const packtrain::testing::ScopedTempDir dir("tokenizer");
  const fs::path file = dir.path() / "tokenizer.json";
  const std::vector<nlohmann::json> hostile{-1,
                                            -100000,
                                            kModelVocab,
                                            kModelVocab - 1,
                                            int64_t{2'000'000'000},
                                            INT64_MAX,
                                            UINT64_MAX,
                                            3.5,
                                            1e300,
                                            "3",
                                            "",
                                            "\xff\xfe",
                                            nullptr,
                                            true,
                                            nlohmann::json::array(),
                                            nlohmann::json::object(),
                                            nlohmann::json::array({"a", "b", "c"}),
                                            nlohmann::json::array({1, 2})};
  // Every place in the valid file a value sits.
  std::vector<nlohmann::json::json_pointer> places;
  const nlohmann::json flat = valid_tokenizer().flatten();
  for (const auto& [pointer, value] : flat.items()) {
    nlohmann::json::json_pointer p(pointer);
    for (; !p.empty(); p = p.parent_pointer()) places.push_back(p);
  }
  std::mt19937_64 rng(51);
  int loaded = 0, refused = 0;
  for (int round = 0; round < 1500; ++round) {
    nlohmann::json t = valid_tokenizer();
    const int edits = 1 + static_cast<int>(rng() % 3);
    for (int e = 0; e < edits; ++e) {
      const auto& place = places[rng() % places.size()];
      try {
        t[place] = hostile[rng() % hostile.size()];
      } catch (const nlohmann::json::exception&) {  // the path no longer exists after an earlier edit
      }
    }
    if (rng() % 4 == 0 && (t["added_tokens"].is_array() || t["added_tokens"].is_null())) {  // one more, any id
      t["added_tokens"].push_back({{"content", "<x>"}, {"id", hostile[rng() % hostile.size()]}});
    }
    std::string text = t.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    if (rng() % 5 == 0) text[rng() % text.size()] = static_cast<char>(rng() % 256);  // a flipped byte
    if (rng() % 8 == 0) text.resize(rng() % text.size());                            // cut short
    write(file, text);
    try {
      const auto tokenizer = make_checkpoint_text_tokenizer(dir.path(), kModelVocab, TokenizerFamily::kGpt2);
      ++loaded;
      ASSERT_LE(tokenizer->vocab(), kModelVocab) << text;
      try {
        const std::vector<int64_t> ids = tokenizer->encode("ab a<|endoftext|>b", 16, nullptr);
        for (const int64_t id : ids) ASSERT_TRUE(id >= 0 && id < tokenizer->vocab()) << id << " in " << text;
        (void)tokenizer->decode(ids);
      } catch (const UserError&) {  // an incomplete vocabulary: said, not crashed on
      }
    } catch (const UserError&) {
      ++refused;
    }
  }
  // Both outcomes occur: the mutations reach past the first check.
  EXPECT_GT(loaded, 0);
  EXPECT_GT(refused, 0);
}

}  // namespace
}  // namespace packtrain::runtime
