// BpeTokenizer: GPT-2's byte-level BPE, as the checkpoint was trained with (issue 39),
// read from a Hugging Face tokenizer folder: tokenizer.json (the `tokenizers` format:
// a BPE model, a ByteLevel pre-tokenizer, added tokens), or GPT-2's original
// vocab.json + merges.txt (its one special token, <|endoftext|>, from the vocab).
//
// Encoding, as Hugging Face's ByteLevel BPE does it: special (added) tokens are cut
// out of the text first, by longest match; the rest is split by GPT-2's pattern
// ('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+,
// Unicode-aware through PCRE2: there is no packaged C++ GPT-2 tokenizer), each piece's
// UTF-8 bytes become GPT-2's printable byte alphabet, and merges apply lowest rank
// first. Decoding inverts the byte alphabet (special tokens as their text). Tested
// against `tokenizers` on non-ASCII text, whitespace runs and special tokens
// (python/tests/test_bpe_tokenizer.py).
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace packtrain::runtime {

// The most ids a tokenizer read without its model may have (2^24; real vocabularies
// are below 300k): the bound when no model's vocabulary is known.
inline constexpr int64_t kMaxTokenizerVocab = int64_t{1} << 24;

class BpeTokenizer {
 public:
  // tokenizer.json, else vocab.json + merges.txt, in `dir`, each read through the
  // checked input reader (a FIFO or directory at the name is refused); UserError
  // naming the file for a missing or malformed one, a value of the wrong type, a
  // model other than BPE over ByteLevel, or any id (vocabulary or added token) outside
  // [0, vocab_limit) — the model's vocabulary, checked before anything is sized by it.
  static BpeTokenizer from_folder(const std::filesystem::path& dir, int64_t vocab_limit = kMaxTokenizerVocab);

  // `merges` in rank order; `special` the added tokens matched verbatim in the text.
  // UserError for an id outside [0, vocab_limit).
  BpeTokenizer(std::unordered_map<std::string, int64_t> vocab, std::vector<std::pair<std::string, std::string>> merges,
               std::vector<std::pair<std::string, int64_t>> special, bool add_prefix_space,
               int64_t vocab_limit = kMaxTokenizerVocab);
  ~BpeTokenizer();
  BpeTokenizer(BpeTokenizer&&) noexcept;
  BpeTokenizer& operator=(BpeTokenizer&&) noexcept;

  std::vector<int64_t> encode(std::string_view text) const;
  // The text of `ids` (bytes that are not UTF-8 pass through as they are); an id
  // outside the vocabulary is a UserError.
  std::string decode(const std::vector<int64_t>& ids) const;
  int64_t vocab_size() const;  // largest id + 1
  std::optional<int64_t> token_id(const std::string& token) const;

 private:
  struct Pattern;  // the compiled pre-tokenization pattern (PCRE2)
  // One pre-tokenized piece (already in the byte alphabet) to its ids.
  void encode_piece(const std::string& piece, std::vector<int64_t>& out) const;

  std::unordered_map<std::string, int64_t> vocab_;
  std::vector<std::string> tokens_;  // by id ("" where no token has the id)
  std::map<std::pair<std::string, std::string>, int64_t> ranks_;
  std::vector<std::pair<std::string, int64_t>> special_;  // longest first
  bool add_prefix_space_ = false;
  std::unique_ptr<Pattern> pattern_;
  struct Cache;  // piece -> ids, behind a mutex
  std::unique_ptr<Cache> cache_;
};

}  // namespace packtrain::runtime
