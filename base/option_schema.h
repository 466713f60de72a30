// One description of an options struct, from which everything else about its
// options is generated: validate()'s range checks, JSON both ways (with a format
// version and the upgrade of older payloads), the CLI's flags and --help
// (runtime/cli/schema_flags.h), the Python estimators' parameters (their defaults,
// types and ranges) and the docs' option tables (`packtrain info --options`).
// Adding a field to an options struct is its TORCH_ARG plus one entry here:
//
//   OptionSchema<TrainerOptions> s("trainer options", /*format_version=*/2);
//   s.option(PACKTRAIN_OPTION(members)).help_text("Ensemble members K").in_group("Model").above(0);
//   s.option(PACKTRAIN_OPTION(dropout)).help_text("Dropout").at_least(0).below(1).sweepable();
//   s.choice(PACKTRAIN_OPTION(head), kHeadNames).help_text("Output head");
//   s.option(PACKTRAIN_OPTION(capture)).flag_name("--eager").sets_false().help_text("Run eagerly");
//   s.option(PACKTRAIN_OPTION(first_member)).internal().added_in(2, 0);  // older payloads: 0
//
// The kind of each field (integer, number, flag, ...) follows from its C++ type.
//
// A field's accessor is TORCH_ARG's reference getter, so reading and writing go
// through the struct itself; the schema keeps no pointer to itself (it may be
// moved). Errors in values a user gave are packtrain::UserError.
#pragma once

#include "packtrain/base/enum_names.h"
#include "packtrain/base/number_text.h"
#include "packtrain/base/user_error.h"

#include <c10/core/Device.h>
#include <c10/util/Exception.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

// The name and reference accessor of a TORCH_ARG field, for an OptionSchema entry.
#define PACKTRAIN_OPTION(field) \
#field, [](auto& o) -> auto& { return o.field(); }
// A field of a nested options struct (o.outer().field()), under the field's own name.
#define PACKTRAIN_NESTED_OPTION(outer, field) \
#field, [](auto& o) -> auto& { return o.outer().field(); }

namespace packtrain {

enum class OptionKind { kInteger, kUnsigned, kNumber, kFlag, kChoice, kText, kNumbers, kIntegers };

inline const char* kind_name(OptionKind kind) {
  switch (kind) {
    case OptionKind::kInteger: return "integer";
    case OptionKind::kUnsigned: return "unsigned";
    case OptionKind::kNumber: return "number";
    case OptionKind::kFlag: return "flag";
    case OptionKind::kChoice: return "choice";
    case OptionKind::kText: return "text";
    case OptionKind::kNumbers: return "numbers";
    case OptionKind::kIntegers: return "integers";
  }
  return "unknown";
}

// One field: what it is called where (JSON key and Python parameter `name`, CLI
// `flag`), what it holds, the values it accepts, and since which format version.
template <typename O>
struct OptionField {
  std::string name;
  OptionKind kind = OptionKind::kNumber;
  std::string help;
  std::string group;
  std::string flag;              // "--members"; "" : no CLI flag
  bool flag_sets_false = false;  // a flag whose presence turns the option off (--eager)
  bool sweep = false;            // the CLI takes a comma list of values to sweep (lists: /-separated lists)
  bool optional = false;         // may be unset (JSON null): the run picks (unset_means says how)
  std::string unset_means;       // --help and docs for an unset optional ("50 with validation rows, else 0")
  bool python = true;            // a parameter of the Python estimators
  std::string choice_what;       // kChoice: what a value is, for errors ("head")
  std::vector<std::string> choices;
  std::optional<double> min, max;
  bool min_open = false, max_open = false, finite = false;
  int since = 1;                 // the format version that added it
  nlohmann::json absent_before;  // what a payload older than `since` means (null: it must hold the key)
  std::function<nlohmann::json(const O&)> get;
  std::function<void(O&, const nlohmann::json&)> set;  // UserError naming the key for a wrong type or name

  // Chained setters of the description.
  OptionField& help_text(std::string text) { return help = std::move(text), *this; }
  OptionField& in_group(std::string name) { return group = std::move(name), *this; }
  OptionField& flag_name(std::string name) { return flag = std::move(name), *this; }
  OptionField& sets_false() { return flag_sets_false = true, *this; }
  OptionField& sweepable() { return sweep = true, *this; }
  OptionField& no_flag() { return flag.clear(), *this; }
  OptionField& not_python() { return python = false, *this; }
  OptionField& internal() { return no_flag().not_python(); }
  OptionField& unset(std::string means) { return unset_means = std::move(means), *this; }
  OptionField& above(double v) { return min = v, min_open = true, *this; }
  OptionField& at_least(double v) { return min = v, min_open = false, *this; }
  OptionField& below(double v) { return max = v, max_open = true, *this; }
  OptionField& at_most(double v) { return max = v, max_open = false, *this; }
  OptionField& finite_only() { return finite = true, *this; }
  // A text option that names one of `names` (a registry's entries).
  OptionField& one_of(std::vector<std::string> names, std::string what) {
    return choices = std::move(names), choice_what = std::move(what), *this;
  }
  OptionField& added_in(int version, nlohmann::json before) {
    return since = version, absent_before = std::move(before), *this;
  }

  bool bounded() const { return min || max || finite; }
  bool accepts(double v) const {
    if (finite && !std::isfinite(v)) return false;
    if (min && (min_open ? !(v > *min) : !(v >= *min))) return false;
    if (max && (max_open ? !(v < *max) : !(v <= *max))) return false;
    return !std::isnan(v);
  }
  // "> 0", ">= 0", "in [0, 1)", "> 0 and finite"
  std::string rule() const {
    std::string r;
    if (min && max) {
      r = std::string("in ") + (min_open ? "(" : "[") + number_text(*min) + ", " + number_text(*max) +
          (max_open ? ")" : "]");
    } else if (min) {
      r = std::string(min_open ? "> " : ">= ") + number_text(*min);
    } else if (max) {
      r = std::string(max_open ? "< " : "<= ") + number_text(*max);
    }
    if (finite) r += r.empty() ? "finite" : " and finite";
    return r;
  }
  // The value's problem ("dropout must be in [0, 1), got 1.5"), or "" when it is fine.
  std::string problem(const O& o) const {
    const nlohmann::json v = get(o);
    if (kind == OptionKind::kText && !choices.empty()) {
      const std::string text = v.template get<std::string>();
      if (std::find(choices.begin(), choices.end(), text) != choices.end()) return {};
      std::string expected;
      for (size_t i = 0; i < choices.size(); ++i) {
        expected += (i == 0 ? "" : i + 1 == choices.size() ? " or " : ", ") + choices[i];
      }
      return "unknown " + choice_what + " '" + text + "' (expected " + expected + ")";
    }
    if (!bounded()) return {};
    if (v.is_null()) return {};
    const auto check = [&](const nlohmann::json& x) -> std::string {
      const double d = x.template get<double>();
      return accepts(d) ? std::string() : name + " must be " + rule() + ", got " + number_text(d);
    };
    if (!v.is_array()) return check(v);
    for (const auto& x : v) {
      if (std::string p = check(x); !p.empty()) return p;
    }
    return {};
  }
  // The value as --help and the docs show it: 16, 0.003, gaussian, [0.001,0.003], or
  // the unset text.
  std::string shown(const O& o) const {
    const nlohmann::json v = get(o);
    if (v.is_null()) return unset_means.empty() ? "unset" : unset_means;
    if (v.is_string()) return v.template get<std::string>();
    if (v.is_number_float()) return number_text(v.template get<double>());
    if (v.is_array()) {
      std::string out;
      for (const auto& x : v) {
        out += (out.empty() ? "" : ",") + (x.is_number_integer() ? x.dump() : number_text(x.template get<double>()));
      }
      return "[" + out + "]";
    }
    return v.dump();
  }
};

template <typename O>
class OptionSchema {
 public:
  OptionSchema(std::string what, int format_version) : what_(std::move(what)), version_(format_version) {}

  const std::string& what() const { return what_; }
  // Payloads may leave any key out, which then keeps the default (an options struct
  // whose JSON is also a user's partial override, as the multi-task trainer's).
  OptionSchema& missing_keys_take_defaults() { return lenient_ = true, *this; }
  int format_version() const { return version_; }
  const std::vector<OptionField<O>>& fields() const { return fields_; }
  const OptionField<O>* find(const std::string& name) const {
    for (const auto& f : fields_) {
      if (f.name == name) return &f;
    }
    return nullptr;
  }

  // --- describing the fields (in the order --help, JSON and the docs show them)
  // A field, its kind from its C++ type: int64_t, uint64_t, double, bool,
  // std::vector<double>, std::string, std::optional<int64_t> (JSON null when unset:
  // the run picks) or c10::Device (as its text). An enum is a choice().
  template <typename Access>
  OptionField<O>& option(const std::string& name, Access access) {
    using T = std::remove_cvref_t<decltype(access(std::declval<O&>()))>;
    if constexpr (std::is_same_v<T, c10::Device>) {
      return device(name, access);
    } else if constexpr (std::is_same_v<T, std::optional<int64_t>>) {
      return optional_integer(name, access);
    } else {
      OptionField<O>& f = add(name, kind_of<T>());
      f.get = [access](const O& o) { return nlohmann::json(access(o)); };
      f.set = [access, name, what = what_](O& o, const nlohmann::json& j) { access(o) = read<T>(j, name, what); };
      return f;
    }
  }
  // An enum, by its name table (base/enum_names.h).
  template <typename Access, typename E, std::size_t N>
  OptionField<O>& choice(const std::string& name, Access access, const EnumNames<E, N>& names) {
    OptionField<O>& f = add(name, OptionKind::kChoice);
    f.choice_what = std::string(names.what);
    for (const auto& entry : names.entries) f.choices.emplace_back(entry.second);
    f.get = [access, &names](const O& o) { return nlohmann::json(std::string(names.name(access(o)))); };
    f.set = [access, &names, name, what = what_](O& o, const nlohmann::json& j) {
      const std::string text = read<std::string>(j, name, what);
      const std::optional<E> e = names.find(text);
      if (!e) {
        throw UserError(what + ": unknown " + std::string(names.what) + " '" + text + "' (expected " +
                        names.expected() + ")");
      }
      access(o) = *e;
    };
    return f;
  }
  // --- what the description gives
  // UserError naming the first field outside its range.
  void check_ranges(const O& o) const {
    for (const auto& f : fields_) {
      if (std::string p = f.problem(o); !p.empty()) throw UserError(p);
    }
  }
  // Every field, and "format_version".
  nlohmann::json to_json(const O& o) const {
    nlohmann::json j = nlohmann::json::object();
    j["format_version"] = version_;
    for (const auto& f : fields_) j[f.name] = f.get(o);
    return j;
  }
  // The fields a payload holds, over `start` (the struct's defaults). A payload
  // without "format_version" is version 1. A key older versions lacked takes its
  // absent_before value; any other missing key (unless missing_keys_take_defaults),
  // an unknown key, a wrong type or a version newer than this build's is a UserError
  // naming it.
  O from_json(const nlohmann::json& j, O start = O()) const {
    if (!j.is_object()) throw UserError(what_ + ": not a JSON object");
    int version = 1;
    if (j.contains("format_version")) {
      const int64_t v = read<int64_t>(j.at("format_version"), "format_version", what_);
      if (v < 1 || v > version_) {
        throw UserError(what_ + ": format version " + std::to_string(v) + ", but this packtrain reads 1 to " +
                        std::to_string(version_) + " (written by a newer packtrain?)");
      }
      version = static_cast<int>(v);
    }
    for (const auto& [key, value] : j.items()) {
      if (key != "format_version" && find(key) == nullptr) throw UserError(what_ + ": unknown key '" + key + "'");
    }
    for (const auto& f : fields_) {
      if (j.contains(f.name)) {
        f.set(start, j.at(f.name));
      } else if (version < f.since && !f.absent_before.is_null()) {
        f.set(start, f.absent_before);  // the upgrade: what older payloads meant without it
      } else if (!lenient_ && !(f.optional && version < f.since)) {
        throw UserError(what_ + ": missing key '" + f.name + "' (format version " + std::to_string(version) + ")");
      }
    }
    return start;
  }
  // from_json of a JSON text; text that is not JSON is a UserError too.
  O parse(const std::string& text) const {
    const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) throw UserError(what_ + ": not valid JSON");
    return from_json(j);
  }
  // The schema itself, for the Python package and the docs: each field's name, kind,
  // flag, help, group, default (of `defaults`), range, choices and version.
  nlohmann::json describe(const O& defaults = O()) const {
    nlohmann::json out = nlohmann::json::array();
    for (const auto& f : fields_) {
      nlohmann::json d = {{"name", f.name},
                          {"kind", kind_name(f.kind)},
                          {"flag", f.flag},
                          {"help", f.help},
                          {"group", f.group},
                          {"default", f.get(defaults)},
                          {"shown", f.shown(defaults)},
                          {"python", f.python},
                          {"sweep", f.sweep},
                          {"flag_sets_false", f.flag_sets_false},
                          {"optional", f.optional},
                          {"since", f.since}};
      if (f.min) d["min"] = *f.min, d["min_open"] = f.min_open;
      if (f.max) d["max"] = *f.max, d["max_open"] = f.max_open;
      if (f.finite) d["finite"] = true;
      if (!f.choices.empty()) d["choices"] = f.choices;
      if (!f.unset_means.empty()) d["unset_means"] = f.unset_means;
      out.push_back(std::move(d));
    }
    return out;
  }

 private:
  OptionField<O>& add(const std::string& name, OptionKind kind) {
    TORCH_CHECK(find(name) == nullptr, what_, ": the field '", name, "' is described twice");
    OptionField<O> f;
    f.name = name;
    f.kind = kind;
    f.flag = "--" + name;
    for (char& c : f.flag) c = c == '_' ? '-' : c;
    f.since = 1;
    fields_.push_back(std::move(f));
    return fields_.back();
  }
  template <typename T>
  static constexpr OptionKind kind_of() {
    if constexpr (std::is_same_v<T, bool>)
      return OptionKind::kFlag;
    else if constexpr (std::is_same_v<T, int64_t>)
      return OptionKind::kInteger;
    else if constexpr (std::is_same_v<T, uint64_t>)
      return OptionKind::kUnsigned;
    else if constexpr (std::is_same_v<T, double>)
      return OptionKind::kNumber;
    else if constexpr (std::is_same_v<T, std::string>)
      return OptionKind::kText;
    else if constexpr (std::is_same_v<T, std::vector<double>>)
      return OptionKind::kNumbers;
    else if constexpr (std::is_same_v<T, std::vector<int64_t>>)
      return OptionKind::kIntegers;
    else
      static_assert(sizeof(T) == 0, "an option of a type the schema does not describe");
  }
  // An optional integer (std::optional<int64_t>): JSON null when unset.
  template <typename Access>
  OptionField<O>& optional_integer(const std::string& name, Access access) {
    OptionField<O>& f = add(name, OptionKind::kInteger);
    f.optional = true;
    f.get = [access](const O& o) {
      const std::optional<int64_t>& v = access(o);
      return v ? nlohmann::json(*v) : nlohmann::json(nullptr);
    };
    f.set = [access, name, what = what_](O& o, const nlohmann::json& j) {
      access(o) = j.is_null() ? std::nullopt : std::optional<int64_t>(read<int64_t>(j, name, what));
    };
    return f;
  }
  // A c10::Device, as its text ("cpu", "cuda:0").
  template <typename Access>
  OptionField<O>& device(const std::string& name, Access access) {
    OptionField<O>& f = add(name, OptionKind::kText);
    f.get = [access](const O& o) { return nlohmann::json(access(o).str()); };
    f.set = [access, name, what = what_](O& o, const nlohmann::json& j) {
      const std::string text = read<std::string>(j, name, what);
      try {
        access(o) = c10::Device(text);
      } catch (const c10::Error&) {
        throw UserError(what + ": " + name + " '" + text + "' is not a device (cpu, cuda or cuda:N)");
      }
    };
    return f;
  }

  // The value of `key` as a T, strictly: an integer is not read from 2.5 or true, a
  // number not from "3"; a UserError names the key and the value otherwise.
  template <typename T>
  static T read(const nlohmann::json& j, const std::string& key, const std::string& what) {
    bool ok = false;
    if constexpr (std::is_same_v<T, bool>) {
      ok = j.is_boolean();
    } else if constexpr (std::is_same_v<T, uint64_t>) {
      ok = j.is_number_unsigned() || (j.is_number_integer() && j.template get<int64_t>() >= 0);
    } else if constexpr (std::is_integral_v<T>) {
      ok = j.is_number_integer() && !(j.is_number_unsigned() && j.template get<uint64_t>() > INT64_MAX);
    } else if constexpr (std::is_floating_point_v<T>) {
      ok = j.is_number();
    } else if constexpr (std::is_same_v<T, std::string>) {
      ok = j.is_string();
    } else if constexpr (std::is_same_v<T, std::vector<int64_t>>) {
      ok = j.is_array();
      for (const auto& x : j) ok = ok && x.is_number_integer();
    } else {
      ok = j.is_array();
      for (const auto& x : j) ok = ok && x.is_number();
    }
    if (!ok) throw UserError(what + ": key '" + key + "' has the wrong type: " + j.dump());
    return j.template get<T>();
  }

  std::string what_;
  int version_;
  bool lenient_ = false;
  std::vector<OptionField<O>> fields_;
};

}  // namespace packtrain
