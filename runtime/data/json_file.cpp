// JSON files of a user's model folder, read and typed with errors naming the file
// (runtime/data/json_file.h).
#include "packtrain/runtime/data/json_file.h"

#include "packtrain/runtime/data/data_error.h"
#include "packtrain/runtime/data/input_file.h"

#include <fmt/format.h>

namespace packtrain::runtime {

nlohmann::json read_json_file(const std::filesystem::path& file, std::string_view what, uint64_t max_bytes) {
  const std::string text = read_input_bytes(file, what, max_bytes);
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw DataError(fmt::format("{} '{}' is not JSON: {}", what, file.string(), e.what()));
  }
}

std::string short_json(const nlohmann::json& value, size_t max_chars) {
  // error_handler::replace: a hostile file's invalid UTF-8 is quoted, never thrown on.
  std::string text = value.dump(-1, ' ', true, nlohmann::json::error_handler_t::replace);
  if (text.size() > max_chars) {
    text.resize(max_chars);
    text += "...";
  }
  return text;
}

namespace {
// The key's value; nullptr when absent.
const nlohmann::json* field(const nlohmann::json& object, const std::string& key) {
  if (!object.is_object()) return nullptr;
  const auto it = object.find(key);
  return it == object.end() ? nullptr : &*it;
}

DataError wrong_type(const std::string& where, const std::string& key, const char* type, const nlohmann::json& v) {
  return DataError(fmt::format("{}: {} must be {}, got {}", where, key, type, short_json(v)));
}
}  // namespace

std::string json_string(const nlohmann::json& object, const std::string& key, const std::string& fallback,
                        const std::string& where) {
  const nlohmann::json* v = field(object, key);
  if (v == nullptr) return fallback;
  if (!v->is_string()) throw wrong_type(where, key, "a string", *v);
  return v->get<std::string>();
}

bool json_bool(const nlohmann::json& object, const std::string& key, bool fallback, const std::string& where) {
  const nlohmann::json* v = field(object, key);
  if (v == nullptr) return fallback;
  if (!v->is_boolean()) throw wrong_type(where, key, "true or false", *v);
  return v->get<bool>();
}

}  // namespace packtrain::runtime
