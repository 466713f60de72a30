#include "packtrain/runtime/data/byte_tokenizer.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

namespace packtrain::runtime {

std::vector<int64_t> ByteTokenizer::encode(std::string_view text, int64_t max_tokens, bool* truncated) const {
  TORCH_CHECK(max_tokens >= 2, "tokenizer: max_tokens must be >= 2 (BOS and EOS), got ", max_tokens);
  const auto bytes = static_cast<int64_t>(text.size());
  const int64_t kept = std::min(bytes, max_tokens - 2);
  if (truncated != nullptr) *truncated = kept < bytes;
  std::vector<int64_t> ids;
  ids.reserve(static_cast<size_t>(kept + 2));
  ids.push_back(kBos);
  for (int64_t i = 0; i < kept; ++i) ids.push_back(static_cast<unsigned char>(text[static_cast<size_t>(i)]));
  ids.push_back(kEos);
  return ids;
}

std::vector<int64_t> ByteTokenizer::encode_prompt(std::string_view text, int64_t max_tokens) const {
  TORCH_CHECK(static_cast<int64_t>(text.size()) + 1 <= max_tokens, "the prompt has ", text.size(),
              " bytes; with BOS it must fit the model's ", max_tokens, " positions");
  std::vector<int64_t> ids{kBos};
  for (char c : text) ids.push_back(static_cast<unsigned char>(c));
  return ids;
}

std::string ByteTokenizer::decode(const std::vector<int64_t>& ids) const {
  std::string out;
  for (int64_t id : ids) {
    if (id == kEos) break;
    if (id >= 0 && id < 256) out.push_back(static_cast<char>(id));
  }
  return out;
}

PaddedTokens pad_sequences(const std::vector<std::vector<int64_t>>& sequences, int64_t length, int64_t pad) {
  const auto n = static_cast<int64_t>(sequences.size());
  PaddedTokens out{at::full({n, length}, pad, at::kLong), at::empty({n}, at::kLong)};
  int64_t* tokens = out.tokens.data_ptr<int64_t>();
  int64_t* lengths = out.lengths.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    const auto& s = sequences[static_cast<size_t>(i)];
    TORCH_CHECK(static_cast<int64_t>(s.size()) <= length, "pad_sequences: a sequence of ", s.size(),
                " tokens does not fit ", length);
    std::copy(s.begin(), s.end(), tokens + i * length);
    lengths[i] = static_cast<int64_t>(s.size());
  }
  return out;
}

}  // namespace packtrain::runtime
