// ByteTokenizer: text as its UTF-8 bytes (ids 0-255) plus three special tokens, so
// any text encodes and nothing is downloaded. A sequence is BOS, the bytes, then EOS
// (the token the classification head reads); a generation prompt is BOS and the bytes.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace packtrain::runtime {

class ByteTokenizer {
 public:
  static constexpr int64_t kPad = 256;
  static constexpr int64_t kBos = 257;
  static constexpr int64_t kEos = 258;
  static constexpr int64_t kVocab = 259;

  // BOS, the bytes of `text`, EOS; when that exceeds `max_tokens` the bytes are cut
  // so BOS ... EOS fits (and *truncated, if given, is set).
  std::vector<int64_t> encode(std::string_view text, int64_t max_tokens, bool* truncated = nullptr) const;
  // BOS and the bytes, no EOS: what generation continues. Throws when it exceeds max_tokens.
  std::vector<int64_t> encode_prompt(std::string_view text, int64_t max_tokens) const;
  // The bytes of `ids` up to the first EOS; other special tokens are skipped.
  std::string decode(const std::vector<int64_t>& ids) const;
};

// Sequences right-padded with `pad` to a (N, T) int64 tensor and their lengths (N).
struct PaddedTokens {
  at::Tensor tokens;
  at::Tensor lengths;
};
PaddedTokens pad_sequences(const std::vector<std::vector<int64_t>>& sequences, int64_t length,
                           int64_t pad = ByteTokenizer::kPad);

}  // namespace packtrain::runtime
