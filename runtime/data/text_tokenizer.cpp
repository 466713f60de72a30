// The tokenizers a multi-task model reads text with (runtime/data/text_tokenizer.h).
#include "packtrain/runtime/data/text_tokenizer.h"

#include "packtrain/base/user_error.h"
#include "packtrain/runtime/data/bpe_tokenizer.h"
#include "packtrain/runtime/data/byte_tokenizer.h"
#include "packtrain/runtime/data/sentencepiece_tokenizer.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <filesystem>
#include <optional>

namespace packtrain::runtime {

namespace {

class ByteTextTokenizer final : public TextTokenizer {
 public:
  std::vector<int64_t> encode(std::string_view text, int64_t max_tokens, bool* truncated) const override {
    return bytes_.encode(text, max_tokens, truncated);
  }
  std::vector<int64_t> encode_prompt(std::string_view text, int64_t max_tokens) const override {
    try {
      return bytes_.encode_prompt(text, max_tokens);
    } catch (const c10::Error& e) {
      throw UserError(e.what_without_backtrace());
    }
  }
  std::string decode(const std::vector<int64_t>& ids) const override { return bytes_.decode(ids); }
  int64_t pad() const override { return ByteTokenizer::kPad; }
  int64_t end() const override { return ByteTokenizer::kEos; }
  int64_t vocab() const override { return ByteTokenizer::kVocab; }
  const char* unit() const override { return "byte"; }

 private:
  ByteTokenizer bytes_;
};

// GPT-2's convention: no BOS; a sentence ends with <|endoftext|>, which also pads.
class BpeTextTokenizer final : public TextTokenizer {
 public:
  BpeTextTokenizer(BpeTokenizer bpe, int64_t end) : bpe_(std::move(bpe)), end_(end) {}
  std::vector<int64_t> encode(std::string_view text, int64_t max_tokens, bool* truncated) const override {
    TORCH_CHECK(max_tokens >= 2, "tokenizer: max_tokens must be >= 2, got ", max_tokens);
    std::vector<int64_t> ids = bpe_.encode(text);
    const bool cut = static_cast<int64_t>(ids.size()) + 1 > max_tokens;
    if (cut) ids.resize(static_cast<size_t>(max_tokens - 1));
    if (truncated != nullptr) *truncated = cut;
    ids.push_back(end_);
    return ids;
  }
  std::vector<int64_t> encode_prompt(std::string_view text, int64_t max_tokens) const override {
    std::vector<int64_t> ids = bpe_.encode(text);
    if (ids.empty()) ids.push_back(end_);  // an empty prompt starts after an end of text, as GPT-2 samples
    if (static_cast<int64_t>(ids.size()) > max_tokens) {
      throw UserError("the prompt has " + std::to_string(ids.size()) + " tokens; the model has " +
                      std::to_string(max_tokens) + " positions");
    }
    return ids;
  }
  std::string decode(const std::vector<int64_t>& ids) const override {
    const auto stop = std::find(ids.begin(), ids.end(), end_);
    return bpe_.decode(std::vector<int64_t>(ids.begin(), stop));
  }
  int64_t pad() const override { return end_; }
  int64_t end() const override { return end_; }
  int64_t vocab() const override { return bpe_.vocab_size(); }
  const char* unit() const override { return "token"; }

 private:
  BpeTokenizer bpe_;
  int64_t end_;
};

// Llama's convention (its tokenizer's add_bos_token): a sentence is BOS, its pieces,
// EOS; a prompt BOS and its pieces; EOS also pads.
class SentencePieceTextTokenizer final : public TextTokenizer {
 public:
  explicit SentencePieceTextTokenizer(SentencePieceTokenizer pieces) : pieces_(std::move(pieces)) {}
  std::vector<int64_t> encode(std::string_view text, int64_t max_tokens, bool* truncated) const override {
    TORCH_CHECK(max_tokens >= 3, "tokenizer: max_tokens must be >= 3, got ", max_tokens);
    std::vector<int64_t> ids = with_bos(text);
    const bool cut = static_cast<int64_t>(ids.size()) + 1 > max_tokens;
    if (cut) ids.resize(static_cast<size_t>(max_tokens - 1));
    if (truncated != nullptr) *truncated = cut;
    ids.push_back(pieces_.eos());
    return ids;
  }
  std::vector<int64_t> encode_prompt(std::string_view text, int64_t max_tokens) const override {
    std::vector<int64_t> ids = with_bos(text);
    if (static_cast<int64_t>(ids.size()) > max_tokens) {
      throw UserError("the prompt has " + std::to_string(ids.size()) + " tokens with BOS; the model has " +
                      std::to_string(max_tokens) + " positions");
    }
    return ids;
  }
  std::string decode(const std::vector<int64_t>& ids) const override {
    const auto stop = std::find(ids.begin(), ids.end(), pieces_.eos());
    return pieces_.decode(std::vector<int64_t>(ids.begin(), stop));  // BOS is a control id: no text
  }
  int64_t pad() const override { return pieces_.eos(); }
  int64_t end() const override { return pieces_.eos(); }
  int64_t vocab() const override { return pieces_.vocab_size(); }
  const char* unit() const override { return "token"; }

 private:
  std::vector<int64_t> with_bos(std::string_view text) const {
    std::vector<int64_t> ids{pieces_.bos()};
    const std::vector<int64_t> body = pieces_.encode(text);
    ids.insert(ids.end(), body.begin(), body.end());
    return ids;
  }
  SentencePieceTokenizer pieces_;
};

}  // namespace

std::unique_ptr<TextTokenizer> make_byte_text_tokenizer() { return std::make_unique<ByteTextTokenizer>(); }

std::unique_ptr<TextTokenizer> make_checkpoint_text_tokenizer(const std::filesystem::path& dir, int64_t vocab_limit,
                                                              TokenizerFamily family) {
  const std::filesystem::path model = dir / "tokenizer.model";
  std::error_code ec;
  const bool has_model = std::filesystem::exists(std::filesystem::symlink_status(model, ec));
  if (family == TokenizerFamily::kSentencePiece && !has_model) {
    throw UserError("tokenizer folder '" + dir.string() +
                    "' holds a Llama checkpoint but no tokenizer.model (Llama's SentencePiece model); a "
                    "tokenizer.json alone (Llama 3's tiktoken-style BPE) is not read");
  }
  if (has_model && family != TokenizerFamily::kGpt2) {
    SentencePieceTokenizer pieces(model);
    if (pieces.vocab_size() > vocab_limit) {
      throw UserError("tokenizer file '" + model.string() + "' has " + std::to_string(pieces.vocab_size()) +
                      " pieces, more than the model's vocabulary of " + std::to_string(vocab_limit));
    }
    if (pieces.bos() < 0 || pieces.eos() < 0) {
      throw UserError("tokenizer file '" + model.string() +
                      "' has no BOS or no EOS id (Llama's sentences start with BOS and end with EOS)");
    }
    return std::make_unique<SentencePieceTextTokenizer>(std::move(pieces));
  }
  BpeTokenizer bpe = BpeTokenizer::from_folder(dir, vocab_limit);
  const std::optional<int64_t> end = bpe.token_id("<|endoftext|>");
  if (!end) {
    throw UserError("tokenizer in '" + dir.string() +
                    "' has no <|endoftext|> token (GPT-2's end of text, which ends each sentence)");
  }
  return std::make_unique<BpeTextTokenizer>(std::move(bpe), *end);
}

}  // namespace packtrain::runtime
