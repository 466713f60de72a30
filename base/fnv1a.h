// FNV-1a 64: the one hash behind checkpoint checksums and data fingerprints. A few
// lines with no dependency, enough to catch accidental damage and changed data
// (flipped bits, edited rows, a file copied over another); not meant to resist
// tampering.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace packtrain {

class Fnv1a {
 public:
  Fnv1a& add(const void* data, size_t bytes) {
    const auto* p = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i < bytes; ++i) hash_ = (hash_ ^ p[i]) * 0x100000001b3ULL;
    return *this;
  }
  Fnv1a& add(std::string_view bytes) { return add(bytes.data(), bytes.size()); }
  uint64_t value() const { return hash_; }

 private:
  uint64_t hash_ = 0xcbf29ce484222325ULL;
};

inline uint64_t fnv1a64(std::string_view bytes) { return Fnv1a().add(bytes).value(); }

}  // namespace packtrain
