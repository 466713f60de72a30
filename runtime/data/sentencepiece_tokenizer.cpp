// Llama's SentencePiece tokenizer through libsentencepiece
// (runtime/data/sentencepiece_tokenizer.h).
#include "packtrain/runtime/data/sentencepiece_tokenizer.h"

#include "packtrain/base/user_error.h"
#include "packtrain/runtime/data/input_file.h"

#include <sentencepiece_processor.h>

namespace packtrain::runtime {

namespace {
constexpr uint64_t kMaxSentencePieceBytes = uint64_t{256} << 20;  // Llama 2's is 500 kB
}  // namespace

SentencePieceTokenizer::SentencePieceTokenizer(const std::filesystem::path& model_file)
    : file_(model_file), processor_(std::make_unique<sentencepiece::SentencePieceProcessor>()) {
  // Read through the checked reader (a FIFO at the name would block Load forever).
  const std::string bytes = read_input_bytes(model_file, "tokenizer file", kMaxSentencePieceBytes);
  const auto status = processor_->LoadFromSerializedProto(bytes);
  if (!status.ok()) {
    throw UserError("tokenizer file '" + model_file.string() + "' is not a SentencePiece model: " + status.ToString());
  }
}

SentencePieceTokenizer::SentencePieceTokenizer(SentencePieceTokenizer&&) noexcept = default;
SentencePieceTokenizer& SentencePieceTokenizer::operator=(SentencePieceTokenizer&&) noexcept = default;
SentencePieceTokenizer::~SentencePieceTokenizer() = default;

std::vector<int64_t> SentencePieceTokenizer::encode(std::string_view text) const {
  std::vector<int> ids;
  const auto status = processor_->Encode(text, &ids);
  if (!status.ok()) throw UserError("SentencePiece (" + file_.string() + "): cannot encode: " + status.ToString());
  return {ids.begin(), ids.end()};
}

std::string SentencePieceTokenizer::decode(const std::vector<int64_t>& ids) const {
  std::vector<int> narrow;
  narrow.reserve(ids.size());
  for (const int64_t id : ids) {
    if (id < 0 || id >= vocab_size()) {
      throw UserError("SentencePiece: id " + std::to_string(id) + " is not in the vocabulary of " +
                      std::to_string(vocab_size()));
    }
    narrow.push_back(static_cast<int>(id));
  }
  std::string text;
  const auto status = processor_->Decode(narrow, &text);
  if (!status.ok()) throw UserError("SentencePiece (" + file_.string() + "): cannot decode: " + status.ToString());
  return text;
}

int64_t SentencePieceTokenizer::vocab_size() const { return processor_->GetPieceSize(); }
int64_t SentencePieceTokenizer::bos() const { return processor_->bos_id(); }
int64_t SentencePieceTokenizer::eos() const { return processor_->eos_id(); }
int64_t SentencePieceTokenizer::unk() const { return processor_->unk_id(); }

}  // namespace packtrain::runtime
