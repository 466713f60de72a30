// TextTokenizer: how a multi-task model reads and writes text — the byte tokenizer of
// packtrain's own trunk (byte_tokenizer.h: BOS, bytes, EOS; vocab 259), or a loaded
// trunk's own tokenizer: GPT-2's byte-level BPE from the checkpoint folder
// (bpe_tokenizer.h; a sentence is its tokens then <|endoftext|>, a prompt its tokens,
// as GPT-2 was trained) or Llama's SentencePiece model (sentencepiece_tokenizer.h; a
// sentence is BOS, its pieces, EOS, a prompt BOS and its pieces). The trainer, `score`
// and `generate` go through this seam only.
#pragma once

#include "packtrain/runtime/data/bpe_tokenizer.h"  // kMaxTokenizerVocab

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace packtrain::runtime {

class TextTokenizer {
 public:
  virtual ~TextTokenizer() = default;
  // A labelled sentence's ids, at most max_tokens (cut so the end token stays: the
  // classifier reads the last); *truncated (if given) says whether it was cut.
  virtual std::vector<int64_t> encode(std::string_view text, int64_t max_tokens, bool* truncated) const = 0;
  // What generation continues; a UserError when it does not fit max_tokens.
  virtual std::vector<int64_t> encode_prompt(std::string_view text, int64_t max_tokens) const = 0;
  // The text of generated ids, up to the first end token.
  virtual std::string decode(const std::vector<int64_t>& ids) const = 0;
  virtual int64_t pad() const = 0;       // what padded positions hold (never attended to, never scored)
  virtual int64_t end() const = 0;       // the end-of-text id generation stops at
  virtual int64_t vocab() const = 0;     // ids are below it
  virtual const char* unit() const = 0;  // "byte" or "token", for per-unit figures
};

// packtrain's own trunk's tokenizer (ByteTokenizer).
std::unique_ptr<TextTokenizer> make_byte_text_tokenizer();
// Which tokenizer a checkpoint folder's model was trained with.
enum class TokenizerFamily {
  kAny,            // whichever the folder holds (a tokenizer read without its model)
  kGpt2,           // GPT-2's byte-level BPE
  kSentencePiece,  // Llama's tokenizer.model
};

// A checkpoint folder's tokenizer: Llama's SentencePiece tokenizer.model when the
// folder holds one, else GPT-2's byte-level BPE (tokenizer.json, or vocab.json +
// merges.txt) with its end token <|endoftext|>. A UserError naming the folder when it
// has no tokenizer files, they lack the end (and, SentencePiece, BOS) token, any id is
// outside [0, vocab_limit) (the model's vocabulary: checked before a table is sized by
// an id), or `family` asks for a kind the folder lacks (a Llama folder with only a
// tokenizer.json: Llama 3's tiktoken-style BPE is not GPT-2's).
std::unique_ptr<TextTokenizer> make_checkpoint_text_tokenizer(const std::filesystem::path& dir,
                                                              int64_t vocab_limit = kMaxTokenizerVocab,
                                                              TokenizerFamily family = TokenizerFamily::kAny);

}  // namespace packtrain::runtime
