// An options schema's fields as command-line flags (packtrain/base/option_schema.h):
// one flag per field that has one, bound to the options struct, with the schema's
// help, group, range check ("--members: must be > 0, got 0") and default, so a
// field described once appears here, in --help and in config files with no edit.
// A sweepable number takes a comma list (`--lr 1e-3,3e-3`) into `sweeps`, a sweepable
// integer list /-separated lists (`--channels 8,16/16,32`) into `list_sweeps`.
#pragma once

#include "packtrain/base/number_text.h"
#include "packtrain/base/option_schema.h"
#include "packtrain/runtime/cli/range_checks.h"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

namespace packtrain::cli {

namespace detail {

// The CLI11 check of a bounded number: the field's own rule, before conversion; a
// closed range as the CLI's other ranges say it (range_checks.h's between(): "must
// be between -1000000 and 1000000"), with no type label, which --help would show.
template <typename O>
CLI::Validator field_bounds(const OptionField<O>& f) {
  const bool closed = f.min && f.max && !f.min_open && !f.max_open;
  const std::string rule = closed ? fmt::format("between {} and {}", *f.min, *f.max) : f.rule();
  const std::string label = rule == "> 0" ? "POSITIVE" : rule == ">= 0" ? "NONNEGATIVE" : "";
  return bound(label, rule, [f](double v) { return f.accepts(v); });
}

// `texts` joined by commas, appended piece by piece (GCC 12 warns -Wstringop-overflow,
// falsely, on `(cond ? "" : ",") + text`).
inline std::string comma_joined(const std::vector<std::string>& texts) {
  std::string out;
  for (size_t i = 0; i < texts.size(); ++i) {
    if (i > 0) out += ',';
    out += texts[i];
  }
  return out;
}

// A sweep axis: `--lr 1e-3,3e-3`, the flag repeated, or a config file's
// `lr = [1e-3, 3e-3]` (CLI11 hands its elements over one by one). All of them are
// joined and read strictly (base/number_text.h), so a flag and a config file agree:
// an empty element, nan, inf or a repeated value is an error naming it.
inline CLI::Option* add_number_list(CLI::App* app, const std::string& flag, std::vector<double>& values,
                                    const std::string& help) {
  CLI::Option* option = app->add_option_function<std::vector<std::string>>(
      flag,
      [&values, flag](const std::vector<std::string>& texts) {
        const std::string joined = comma_joined(texts);
        try {
          values = parse_number_list(joined, flag);
          check_distinct(values, flag);
        } catch (const UserError& e) {
          throw CLI::ValidationError(e.what());
        }
      },
      help);
  std::vector<std::string> texts;
  for (const double v : values) texts.push_back(number_text(v));
  const std::string shown = comma_joined(texts);
  option->type_name("FLOAT")->default_str("[" + shown + "]");  // as CLI11 shows a vector<double>'s
  return option;
}

// A sweep of integer lists: `--channels 8,16/16,32` (/ between the lists), the flag
// repeated, or a config file's `channels = [8, 16]` (one list) or
// `channels = "8,16/16,32"`. Each count must meet the field's bounds and be whole;
// the lists must be distinct. The first list is the options' own value.
template <typename O>
CLI::Option* add_integer_lists(CLI::App* app, const OptionField<O>& f, O& options,
                               std::vector<std::vector<int64_t>>& lists) {
  CLI::Option* option = app->add_option_function<std::vector<std::string>>(
      f.flag,
      [&options, &lists, &f](const std::vector<std::string>& texts) {
        const std::string joined = comma_joined(texts);
        try {
          std::vector<std::vector<int64_t>> parsed;
          size_t begin = 0;
          for (;;) {
            const size_t slash = joined.find('/', begin);
            const std::string part = joined.substr(begin, slash == std::string::npos ? slash : slash - begin);
            std::vector<int64_t> list;
            for (const double v : parse_number_list(part, f.flag)) {
              if (!(v == std::floor(v) && std::abs(v) <= 1e15) || !f.accepts(v)) {
                throw UserError(f.flag + ": each count must be a whole number " + f.rule() + ", got " + number_text(v) +
                                " in '" + joined + "'");
              }
              list.push_back(static_cast<int64_t>(v));
            }
            if (std::find(parsed.begin(), parsed.end(), list) != parsed.end()) {
              throw UserError(f.flag + ": the list '" + part + "' is given twice in '" + joined + "'");
            }
            parsed.push_back(std::move(list));
            if (slash == std::string::npos) break;
            begin = slash + 1;
          }
          f.set(options, nlohmann::json(parsed.front()));
          lists = std::move(parsed);
        } catch (const UserError& e) {
          throw CLI::ValidationError(e.what());
        }
      },
      f.help);
  // "LISTS" (8,16/16,32 in the help text), not "INT...": make_integer_options_exact
  // would read the lists as one integer.
  option->type_name("LISTS")->default_str(f.shown(options));
  return option;
}

template <typename T, typename O>
CLI::Option* add_typed(CLI::App* app, const OptionField<O>& f, O& options, const std::string& help) {
  return app->add_option_function<T>(
      f.flag, [&options, &f](const T& v) { f.set(options, nlohmann::json(v)); }, help);
}

}  // namespace detail

// Adds the flags of `schema`'s fields to `app`. `sweeps` receives each sweepable
// field's values (its default first; a schema with sweepable fields needs it);
// `options` and `sweeps` must outlive parsing.
// A sweepable integer list (channels) puts its lists into `list_sweeps` (its
// default, one list, first).
template <typename O>
void add_schema_flags(CLI::App* app, const OptionSchema<O>& schema, O& options,
                      std::map<std::string, std::vector<double>>* sweeps = nullptr,
                      std::map<std::string, std::vector<std::vector<int64_t>>>* list_sweeps = nullptr) {
  for (const OptionField<O>& f : schema.fields()) {
    if (f.flag.empty()) continue;
    CLI::Option* option = nullptr;
    if (f.sweep && f.kind == OptionKind::kIntegers) {
      TORCH_CHECK(list_sweeps != nullptr, f.name, " is a sweepable list: add_schema_flags needs somewhere to put them");
      std::vector<std::vector<int64_t>>& lists = (*list_sweeps)[f.name];
      lists = {f.get(options).template get<std::vector<int64_t>>()};
      option = detail::add_integer_lists(app, f, options, lists);
    } else if (f.sweep) {
      TORCH_CHECK(sweeps != nullptr, f.name, " is sweepable: add_schema_flags needs somewhere to put its values");
      std::vector<double>& values = (*sweeps)[f.name];
      values = {f.get(options).template get<double>()};
      option = detail::add_number_list(app, f.flag, values, f.help);
    } else if (f.kind == OptionKind::kFlag) {  // --layer-norm sets true, --eager sets capture false
      option = app->add_flag_callback(
          f.flag, [&options, &f] { f.set(options, nlohmann::json(!f.flag_sets_false)); }, f.help);
    } else if (f.kind == OptionKind::kChoice || !f.choices.empty()) {
      std::string expected;
      for (size_t i = 0; i < f.choices.size(); ++i) {
        expected += (i == 0 ? "" : i + 1 == f.choices.size() ? " or " : ", ") + f.choices[i];
      }
      option = app->add_option_function<std::string>(
          f.flag,
          [&options, &f, expected](const std::string& name) {
            if (std::find(f.choices.begin(), f.choices.end(), name) == f.choices.end()) {
              throw CLI::ValidationError(f.flag,
                                         "unknown " + f.choice_what + " '" + name + "' (expected " + expected + ")");
            }
            f.set(options, nlohmann::json(name));
          },
          f.help + " (" + expected + ")");
    } else if (f.optional) {  // an integer or "auto" (unset: the run picks)
      option = app->add_option_function<std::string>(
          f.flag,
          [&options, &f](const std::string& text) {
            if (text == "auto") return f.set(options, nlohmann::json(nullptr));
            const auto v = parse_integer<int64_t>(text);
            if (!v) throw CLI::ValidationError(f.flag, "must be an integer or auto, got " + text);
            f.set(options, nlohmann::json(*v));
          },
          f.help + (f.unset_means.empty() ? "" : " (auto: " + f.unset_means + ")"));
      option->type_name("AUTO|INT");
    } else if (f.kind == OptionKind::kIntegers) {  // --buckets 32,64,128
      option = detail::add_typed<std::vector<int64_t>>(app, f, options, f.help)->delimiter(',');
      option->type_name("INT");
    } else if (f.kind == OptionKind::kNumbers) {  // --member-lrs 0.01,0.003 (not swept; values may repeat)
      // Read as the sweep lists are (parse_number_list): an empty element is named, never dropped.
      option = app->add_option_function<std::vector<std::string>>(
          f.flag,
          [&options, &f](const std::vector<std::string>& texts) {
            try {
              f.set(options, nlohmann::json(parse_number_list(detail::comma_joined(texts), f.flag)));
            } catch (const UserError& e) {
              throw CLI::ValidationError(e.what());
            }
          },
          f.help);
      option->type_name("FLOAT");
    } else if (f.kind == OptionKind::kInteger) {
      option = detail::add_typed<int64_t>(app, f, options, f.help);
    } else if (f.kind == OptionKind::kUnsigned) {
      option = detail::add_typed<uint64_t>(app, f, options, f.help)->check(non_negative());
    } else if (f.kind == OptionKind::kNumber) {
      option = detail::add_typed<double>(app, f, options, f.help);
    } else {
      option = detail::add_typed<std::string>(app, f, options, f.help);
    }
    if (f.bounded() && !f.sweep && f.kind != OptionKind::kFlag) option->check(detail::field_bounds(f));
    if (f.kind != OptionKind::kFlag && !f.sweep)
      option->default_str(f.optional && f.get(options).is_null() ? "auto" : f.shown(options));
    if (!f.group.empty()) option->group(f.group);
  }
}

// The flags of `schema` as a markdown table (flag, default, meaning), in --help's
// order: the docs' table of them is this text (`packtrain info --options`; a test
// keeps docs/guide.md's copy current).
template <typename O>
std::string option_table_markdown(const OptionSchema<O>& schema, const O& defaults) {
  std::string out = "| option | default | meaning |\n|---|---|---|\n";
  for (const OptionField<O>& f : schema.fields()) {
    if (f.flag.empty()) continue;
    std::string shown = f.kind == OptionKind::kFlag ? "off" : f.shown(defaults);
    if (f.optional && f.get(defaults).is_null()) shown = "auto: " + f.unset_means;
    std::string meaning = f.help;
    if (!f.choices.empty()) {
      meaning += ": ";
      for (size_t i = 0; i < f.choices.size(); ++i) meaning += (i == 0 ? "`" : ", `") + f.choices[i] + "`";
    }
    if (f.bounded()) meaning += " (" + f.rule() + ")";
    for (char& c : meaning) c = c == '|' ? '/' : c;
    out += "| `" + f.flag + "` | " + shown + " | " + meaning + " |\n";
  }
  return out;
}

}  // namespace packtrain::cli
