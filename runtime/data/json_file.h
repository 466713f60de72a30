// JSON files that come with a user's model folder (tokenizer.json, vocab.json,
// config.json, a shard index): read through the checked input reader (a regular
// file, bounded: a FIFO or directory at the name is refused, never waited on), and
// read as typed values, so a value of the wrong type is a DataError naming the file
// and the key (exit 2), never nlohmann's type_error (an internal error).
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

namespace packtrain::runtime {

inline constexpr uint64_t kMaxJsonBytes = uint64_t{256} << 20;  // tokenizer.json files run to tens of MB

// The file's JSON value; DataError naming the file when it is not a bounded regular
// file or not JSON. `what` says what the file is ("tokenizer file", "config").
nlohmann::json read_json_file(const std::filesystem::path& file, std::string_view what,
                              uint64_t max_bytes = kMaxJsonBytes);

// `value` as JSON text of at most `max_chars` (longer: cut, "..." appended), for
// messages that quote a user's value.
std::string short_json(const nlohmann::json& value, size_t max_chars = 80);

// Typed fields of a JSON object. Each returns `fallback` when the key is absent, and
// throws DataError "<where>: <key> must be <type>, got <value>" for a value of another
// type (null too: "activation_function": null is no activation). `where` names the
// file (and the object within it).
std::string json_string(const nlohmann::json& object, const std::string& key, const std::string& fallback,
                        const std::string& where);
bool json_bool(const nlohmann::json& object, const std::string& key, bool fallback, const std::string& where);

}  // namespace packtrain::runtime
