// A command-line option for an enum, bound to an options struct's field and
// generated from the enum's name table (packtrain/base/enum_names.h): the accepted
// names in --help and in the error, the default from the field's current value.
#pragma once

#include "packtrain/base/enum_names.h"

#include <CLI/CLI.hpp>

#include <string>

namespace packtrain::cli {

template <typename E, std::size_t N>
CLI::Option* add_enum_option(CLI::App* app, const std::string& flag, E& field, const EnumNames<E, N>& names,
                             const std::string& help) {
  CLI::Option* option = app->add_option_function<std::string>(
      flag,
      [&field, &names, flag](const std::string& name) {
        const auto value = names.find(name);
        if (!value) {
          throw CLI::ValidationError(
              flag, "unknown " + std::string(names.what) + " '" + name + "' (expected " + names.expected() + ")");
        }
        field = *value;
      },
      help + " (" + names.expected() + ")");
  option->default_str(std::string(names.name(field)));
  return option;
}

}  // namespace packtrain::cli
