// SentencePieceTokenizer: Llama's tokenizer, as the checkpoint was trained with (issue
// 39): the folder's `tokenizer.model` (a SentencePiece model proto) through Debian's
// libsentencepiece (its processor encodes and decodes; nothing is re-implemented here).
// Ids are the model's own; bos, eos and unk are its control ids (-1 when it has none).
// Tested against PyPI's `sentencepiece` on a model trained offline on bundled text
// (python/tests/test_sentencepiece_tokenizer.py).
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace packtrain::runtime {

class SentencePieceTokenizer {
 public:
  // A UserError naming the file when it cannot be read or is not a SentencePiece model.
  explicit SentencePieceTokenizer(const std::filesystem::path& model_file);
  SentencePieceTokenizer(SentencePieceTokenizer&&) noexcept;
  SentencePieceTokenizer& operator=(SentencePieceTokenizer&&) noexcept;
  ~SentencePieceTokenizer();

  // The text's pieces' ids (no BOS or EOS: the caller adds its convention's).
  std::vector<int64_t> encode(std::string_view text) const;
  // The text of ids (control ids such as BOS and EOS decode to nothing); a UserError
  // for an id outside the vocabulary.
  std::string decode(const std::vector<int64_t>& ids) const;
  int64_t vocab_size() const;
  int64_t bos() const;
  int64_t eos() const;
  int64_t unk() const;

 private:
  std::filesystem::path file_;
  std::unique_ptr<sentencepiece::SentencePieceProcessor> processor_;
};

}  // namespace packtrain::runtime
