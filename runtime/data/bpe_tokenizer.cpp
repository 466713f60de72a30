// GPT-2's byte-level BPE (runtime/data/bpe_tokenizer.h).
#include "packtrain/runtime/data/bpe_tokenizer.h"

#include "packtrain/base/user_error.h"
#include "packtrain/runtime/data/input_file.h"
#include "packtrain/runtime/data/json_file.h"

#include <nlohmann/json.hpp>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <array>
#include <limits>
#include <mutex>
#include <sstream>

namespace packtrain::runtime {

namespace {

namespace fs = std::filesystem;

// GPT-2's pre-tokenization pattern (its encoder.py; Hugging Face's ByteLevel).
constexpr const char* kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

std::string utf8(uint32_t cp) {
  std::string out;
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return out;
}

// GPT-2's bytes_to_unicode: each byte as a printable character (UTF-8), and back.
struct ByteAlphabet {
  std::array<std::string, 256> to_char;
  std::unordered_map<std::string, unsigned char> to_byte;
  ByteAlphabet() {
    std::array<bool, 256> printable{};
    for (int b = '!'; b <= '~'; ++b) printable[b] = true;
    for (int b = 0xA1; b <= 0xAC; ++b) printable[b] = true;
    for (int b = 0xAE; b <= 0xFF; ++b) printable[b] = true;
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      to_char[b] = utf8(printable[b] ? static_cast<uint32_t>(b) : next++);
      to_byte[to_char[b]] = static_cast<unsigned char>(b);
    }
  }
};

const ByteAlphabet& alphabet() {
  static const ByteAlphabet a;
  return a;
}

// The characters of a UTF-8 string (each its bytes; a stray byte alone).
std::vector<std::string> characters(const std::string& s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    const size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 1;
    out.push_back(s.substr(i, std::min(n, s.size() - i)));
    i += n;
  }
  return out;
}

// An id of `token` from `file`: an integer in [0, vocab_limit), checked before any
// table is sized by it (an id of -100000 or 2e9 must not index or allocate).
int64_t checked_id(const nlohmann::json& id, const std::string& token, int64_t vocab_limit, const std::string& file) {
  if (!id.is_number_integer() || (id.is_number_unsigned() && id.get<uint64_t>() > uint64_t{INT64_MAX})) {
    throw UserError("tokenizer file '" + file + "': token " + short_json(token) +
                    " has no integer id: " + short_json(id));
  }
  const int64_t value = id.get<int64_t>();
  if (value < 0 || value >= vocab_limit) {
    throw UserError("tokenizer file '" + file + "': token " + short_json(token) + " has id " + std::to_string(value) +
                    ", outside the model's vocabulary of " + std::to_string(vocab_limit) + " (ids 0.." +
                    std::to_string(vocab_limit - 1) + ")");
  }
  return value;
}

std::unordered_map<std::string, int64_t> vocab_from(const nlohmann::json& j, const fs::path& file,
                                                    int64_t vocab_limit) {
  if (!j.is_object()) throw UserError("tokenizer file '" + file.string() + "': the vocabulary is not an object");
  std::unordered_map<std::string, int64_t> vocab;
  for (const auto& [token, id] : j.items()) vocab[token] = checked_id(id, token, vocab_limit, file.string());
  return vocab;
}

std::pair<std::string, std::string> split_merge(const std::string& line, const fs::path& file) {
  const size_t space = line.find(' ');
  if (space == std::string::npos || space == 0 || space + 1 >= line.size() ||
      line.find(' ', space + 1) != std::string::npos) {
    throw UserError("tokenizer file '" + file.string() + "': merge '" + line + "' is not two tokens");
  }
  return {line.substr(0, space), line.substr(space + 1)};
}

}  // namespace

struct BpeTokenizer::Pattern {
  pcre2_code* code = nullptr;
  Pattern() {
    int error = 0;
    PCRE2_SIZE offset = 0;
    code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(kGpt2Pattern), PCRE2_ZERO_TERMINATED,
                         PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &error, &offset, nullptr);
    if (code == nullptr) {
      std::array<PCRE2_UCHAR, 256> message{};
      pcre2_get_error_message(error, message.data(), message.size());
      throw UserError(std::string("BPE pattern does not compile: ") + reinterpret_cast<const char*>(message.data()));
    }
  }
  ~Pattern() { pcre2_code_free(code); }
  Pattern(const Pattern&) = delete;
  Pattern& operator=(const Pattern&) = delete;

  // The pieces of `text`, in order (each match; the pattern's last \s+ leaves no gap
  // in valid UTF-8 text; an invalid byte no alternative matches is a piece alone).
  std::vector<std::string> split(std::string_view text) const {
    std::vector<std::string> pieces;
    pcre2_match_data* match = pcre2_match_data_create_from_pattern(code, nullptr);
    size_t at = 0;
    while (at < text.size()) {
      const int rc = pcre2_match(code, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), at, 0, match, nullptr);
      if (rc < 0) {
        pieces.emplace_back(text.substr(at));
        break;
      }
      const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match);
      if (ovector[0] > at) pieces.emplace_back(text.substr(at, ovector[0] - at));  // bytes no alternative took
      if (ovector[1] == ovector[0]) {  // an empty match cannot happen with this pattern; never loop
        pieces.emplace_back(text.substr(ovector[0], 1));
        at = ovector[0] + 1;
        continue;
      }
      pieces.emplace_back(text.substr(ovector[0], ovector[1] - ovector[0]));
      at = ovector[1];
    }
    pcre2_match_data_free(match);
    return pieces;
  }
};

struct BpeTokenizer::Cache {
  std::mutex mutex;
  std::unordered_map<std::string, std::vector<int64_t>> pieces;
};

BpeTokenizer::BpeTokenizer(std::unordered_map<std::string, int64_t> vocab,
                           std::vector<std::pair<std::string, std::string>> merges,
                           std::vector<std::pair<std::string, int64_t>> special, bool add_prefix_space,
                           int64_t vocab_limit)
    : vocab_(std::move(vocab)),
      special_(std::move(special)),
      add_prefix_space_(add_prefix_space),
      pattern_(std::make_unique<Pattern>()),
      cache_(std::make_unique<Cache>()) {
  if (vocab_limit < 1 || vocab_limit > kMaxTokenizerVocab) {
    throw UserError("BPE: a vocabulary limit of " + std::to_string(vocab_limit) + " (1.." +
                    std::to_string(kMaxTokenizerVocab) + " ids are possible)");
  }
  int64_t size = 0;  // every id is checked before it sizes or indexes tokens_
  const auto check = [&](const std::string& token, int64_t id) {
    if (id < 0 || id >= vocab_limit) {
      throw UserError("BPE: token " + short_json(token) + " has id " + std::to_string(id) +
                      ", outside the model's vocabulary of " + std::to_string(vocab_limit));
    }
    size = std::max(size, id + 1);
  };
  for (const auto& [token, id] : vocab_) check(token, id);
  for (const auto& [token, id] : special_) check(token, id);
  tokens_.assign(static_cast<size_t>(size), "");
  for (const auto& [token, id] : vocab_) tokens_[static_cast<size_t>(id)] = token;
  for (const auto& [token, id] : special_) tokens_[static_cast<size_t>(id)] = token;
  for (size_t r = 0; r < merges.size(); ++r) ranks_.emplace(merges[r], static_cast<int64_t>(r));  // first rank wins
  std::stable_sort(special_.begin(), special_.end(),
                   [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
}

BpeTokenizer::~BpeTokenizer() = default;
BpeTokenizer::BpeTokenizer(BpeTokenizer&&) noexcept = default;
BpeTokenizer& BpeTokenizer::operator=(BpeTokenizer&&) noexcept = default;

BpeTokenizer BpeTokenizer::from_folder(const fs::path& dir, int64_t vocab_limit) {
  const fs::path json = dir / "tokenizer.json";
  // Whatever is at a name (a FIFO, a loop of links) is read, so the checked reader names it.
  const auto present = [](const fs::path& file) {
    std::error_code ec;
    return fs::exists(fs::symlink_status(file, ec));
  };
  if (present(json)) {
    const nlohmann::json t = read_json_file(json, "tokenizer file");
    const std::string where = "tokenizer file '" + json.string() + "'";
    const auto fail = [&](const std::string& problem) { return UserError(where + ": " + problem); };
    if (!t.is_object() || !t.contains("model") || !t.at("model").is_object()) throw fail("no model");
    const nlohmann::json& model = t.at("model");
    if (const std::string type = json_string(model, "type", "BPE", where + " model"); type != "BPE") {
      throw fail("model type '" + type + "' is not BPE (GPT-2's byte-level BPE is read)");
    }
    const nlohmann::json& pre = t.contains("pre_tokenizer") ? t.at("pre_tokenizer") : nlohmann::json();
    if (!pre.is_object() || json_string(pre, "type", "", where + " pre_tokenizer") != "ByteLevel") {
      throw fail("pre_tokenizer is not ByteLevel (GPT-2's byte-level BPE is read): " + short_json(pre));
    }
    if (!json_bool(pre, "use_regex", true, where + " pre_tokenizer"))
      throw fail("a ByteLevel pre_tokenizer without GPT-2's pattern (use_regex false)");
    if (json_bool(pre, "add_prefix_space", false, where + " pre_tokenizer")) {
      throw fail("a ByteLevel pre_tokenizer with add_prefix_space is not supported (GPT-2's has none)");
    }
    if (!model.contains("vocab") || !model.contains("merges") || !model.at("merges").is_array()) {
      throw fail("the BPE model needs vocab and merges");
    }
    std::unordered_map<std::string, int64_t> vocab = vocab_from(model.at("vocab"), json, vocab_limit);
    std::vector<std::pair<std::string, std::string>> merges;
    for (const nlohmann::json& m : model.at("merges")) {
      if (m.is_string()) {
        merges.push_back(split_merge(m.get<std::string>(), json));
      } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
        merges.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
      } else {
        throw fail("merge " + short_json(m) + " is not two tokens");
      }
    }
    std::vector<std::pair<std::string, int64_t>> special;
    if (t.contains("added_tokens") && !t.at("added_tokens").is_null()) {
      if (!t.at("added_tokens").is_array())
        throw fail("added_tokens is not a list: " + short_json(t.at("added_tokens")));
      for (const nlohmann::json& a : t.at("added_tokens")) {
        if (!a.is_object() || !a.contains("content") || !a.at("content").is_string() || !a.contains("id")) {
          throw fail("added token " + short_json(a) + " has no content string and id");
        }
        const std::string content = a.at("content").get<std::string>();
        special.emplace_back(content, checked_id(a.at("id"), content, vocab_limit, json.string()));
      }
    }
    return BpeTokenizer(std::move(vocab), std::move(merges), std::move(special), false, vocab_limit);
  }
  const fs::path vocab_file = dir / "vocab.json", merges_file = dir / "merges.txt";
  if (!present(vocab_file) || !present(merges_file)) {
    throw UserError("tokenizer folder '" + dir.string() +
                    "' has no tokenizer: neither tokenizer.model (Llama's SentencePiece) nor tokenizer.json, "
                    "nor vocab.json and merges.txt (GPT-2's byte-level BPE)");
  }
  std::unordered_map<std::string, int64_t> vocab =
      vocab_from(read_json_file(vocab_file, "tokenizer file"), vocab_file, vocab_limit);
  std::istringstream in(read_input_file(merges_file, "tokenizer file"));
  std::vector<std::pair<std::string, std::string>> merges;
  std::string line;
  for (bool first = true; std::getline(in, line); first = false) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || (first && line.starts_with("#version"))) continue;
    merges.push_back(split_merge(line, merges_file));
  }
  std::vector<std::pair<std::string, int64_t>> special;
  if (const auto it = vocab.find("<|endoftext|>"); it != vocab.end()) special.emplace_back(it->first, it->second);
  return BpeTokenizer(std::move(vocab), std::move(merges), std::move(special), false, vocab_limit);
}

void BpeTokenizer::encode_piece(const std::string& piece, std::vector<int64_t>& out) const {
  {
    std::lock_guard<std::mutex> lock(cache_->mutex);
    if (const auto it = cache_->pieces.find(piece); it != cache_->pieces.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<std::string> word = characters(piece);
  while (word.size() > 1) {
    int64_t best = std::numeric_limits<int64_t>::max();
    for (size_t i = 0; i + 1 < word.size(); ++i) {
      const auto it = ranks_.find({word[i], word[i + 1]});
      if (it != ranks_.end()) best = std::min(best, it->second);
    }
    if (best == std::numeric_limits<int64_t>::max()) break;
    // Merge every occurrence of the best pair, left to right.
    std::vector<std::string> merged;
    for (size_t i = 0; i < word.size(); ++i) {
      if (i + 1 < word.size()) {
        const auto it = ranks_.find({word[i], word[i + 1]});
        if (it != ranks_.end() && it->second == best) {
          merged.push_back(word[i] + word[i + 1]);
          ++i;
          continue;
        }
      }
      merged.push_back(word[i]);
    }
    word = std::move(merged);
  }
  std::vector<int64_t> ids;
  for (const std::string& symbol : word) {
    const auto it = vocab_.find(symbol);
    if (it == vocab_.end()) throw UserError("BPE: the vocabulary has no token '" + symbol + "' (an incomplete vocab)");
    ids.push_back(it->second);
  }
  out.insert(out.end(), ids.begin(), ids.end());
  std::lock_guard<std::mutex> lock(cache_->mutex);
  cache_->pieces.emplace(piece, std::move(ids));
}

std::vector<int64_t> BpeTokenizer::encode(std::string_view text) const {
  std::vector<int64_t> out;
  const ByteAlphabet& bytes = alphabet();
  const auto encode_plain = [&](std::string_view plain, bool at_start) {
    if (plain.empty()) return;
    std::string owned;
    if (add_prefix_space_ && at_start && plain.front() != ' ') {
      owned = " " + std::string(plain);
      plain = owned;
    }
    for (const std::string& piece : pattern_->split(plain)) {
      std::string mapped;
      for (const char c : piece) mapped += bytes.to_char[static_cast<unsigned char>(c)];
      encode_piece(mapped, out);
    }
  };
  size_t start = 0, at = 0;
  while (at < text.size()) {
    const auto special = std::find_if(special_.begin(), special_.end(), [&](const auto& s) {
      return !s.first.empty() && text.substr(at, s.first.size()) == s.first;
    });
    if (special == special_.end()) {
      ++at;
      continue;
    }
    encode_plain(text.substr(start, at - start), start == 0);
    out.push_back(special->second);
    at += special->first.size();
    start = at;
  }
  encode_plain(text.substr(start), start == 0);
  return out;
}

std::string BpeTokenizer::decode(const std::vector<int64_t>& ids) const {
  const ByteAlphabet& bytes = alphabet();
  std::string out;
  for (const int64_t id : ids) {
    if (id < 0 || id >= static_cast<int64_t>(tokens_.size()) || tokens_[static_cast<size_t>(id)].empty()) {
      throw UserError("BPE: id " + std::to_string(id) + " is not in the vocabulary");
    }
    const std::string& token = tokens_[static_cast<size_t>(id)];
    if (std::any_of(special_.begin(), special_.end(), [&](const auto& s) { return s.second == id; })) {
      out += token;
      continue;
    }
    for (const std::string& c : characters(token)) {
      const auto it = bytes.to_byte.find(c);
      out += it != bytes.to_byte.end() ? std::string(1, static_cast<char>(it->second)) : c;
    }
  }
  return out;
}

int64_t BpeTokenizer::vocab_size() const { return static_cast<int64_t>(tokens_.size()); }

std::optional<int64_t> BpeTokenizer::token_id(const std::string& token) const {
  if (const auto it = vocab_.find(token); it != vocab_.end()) return it->second;
  for (const auto& [text, id] : special_) {
    if (text == token) return id;
  }
  return std::nullopt;
}

}  // namespace packtrain::runtime
