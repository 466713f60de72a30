// One name table per enum: to_string, parse and the "expected a, b or c" list of an
// enum are all generated from it, so a value is named in exactly one place.
//
//   inline constexpr EnumNames<Activation, 4> kActivationNames{
//       "activation", {{{Activation::kRelu, "relu"}, {Activation::kGelu, "gelu"}, ...}}};
//   kActivationNames.name(Activation::kRelu)   // "relu"
//   kActivationNames.parse("gelu")             // Activation::kGelu
//   kActivationNames.parse("elu")              // c10::Error: unknown activation 'elu' (expected relu, gelu, silu or
//   tanh)
#pragma once

#include <c10/util/Exception.h>

#include <array>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace packtrain {

template <typename E, std::size_t N>
struct EnumNames {
  std::string_view what;  // what a value is, for errors: "activation", "batch order"
  std::array<std::pair<E, std::string_view>, N> entries;

  constexpr std::string_view name(E value) const {
    for (const auto& [e, n] : entries) {
      if (e == value) return n;
    }
    return "unknown";
  }
  constexpr std::optional<E> find(std::string_view name) const {
    for (const auto& [e, n] : entries) {
      if (n == name) return e;
    }
    return std::nullopt;
  }
  // "a, b or c"
  std::string expected() const {
    std::string out;
    for (std::size_t i = 0; i < N; ++i) {
      if (i > 0) out += i + 1 == N ? " or " : ", ";
      out += entries[i].second;
    }
    return out;
  }
  // c10::Error naming the value and the expected names when `name` is none of them.
  E parse(std::string_view name) const {
    const std::optional<E> e = find(name);
    TORCH_CHECK(e.has_value(), "unknown ", what, " '", std::string(name), "' (expected ", expected(), ")");
    return *e;
  }
};

}  // namespace packtrain
