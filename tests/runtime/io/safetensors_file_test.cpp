// Safetensors files: what write_safetensors writes reads back (every dtype the trunk
// loader meets, metadata, an empty tensor), and each way a damaged or hostile file is
// refused by name before any tensor is read. (Against Hugging Face's own reader and
// writer: python/tests/test_pretrained_trunk.py.)
#include "packtrain/runtime/io/safetensors_file.h"

#include "packtrain/base/user_error.h"
#include "tests/support/test_support.h"

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

namespace packtrain::runtime {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

// A file of an 8-byte little-endian header length, `header` and `data`.
void write_raw(const fs::path& path, const std::string& header, const std::string& data, int64_t length = -1) {
  const uint64_t n = length < 0 ? header.size() : static_cast<uint64_t>(length);
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[static_cast<size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xff);
  std::ofstream(path, std::ios::binary) << bytes << header << data;
}

TEST(SafetensorsFile, WhatIsWrittenReadsBackInEveryDtype) {
  const packtrain::testing::ScopedTempDir dir("safetensors");
  const fs::path path = dir.path() / "w.safetensors";
  const std::vector<std::pair<std::string, at::Tensor>> tensors{
      {"a.weight", at::randn({3, 5})},
      {"b.bf16", at::randn({7}).to(at::kBFloat16)},
      {"c.half", at::randn({2, 2}).to(at::kHalf)},
      {"d.ids", at::arange(6, at::kLong).view({2, 3})},
      {"e.empty", at::empty({0, 4})},
      {"f.strided", at::randn({4, 6}).t()},  // not contiguous: written as its values
  };
  write_safetensors(path, tensors, {{"format", "pt"}});
  const SafetensorsFile file(path);
  EXPECT_EQ(file.metadata().at("format"), "pt");
  ASSERT_EQ(file.names().size(), tensors.size());
  for (const auto& [name, t] : tensors) {
    const at::Tensor back = file.tensor(name);
    EXPECT_EQ(back.scalar_type(), t.scalar_type()) << name;
    EXPECT_TRUE(at::equal(back, t)) << name;
  }
  // The data section starts 8-byte aligned, as Hugging Face's writer leaves it.
  std::ifstream in(path, std::ios::binary);
  uint64_t n = 0;
  in.read(reinterpret_cast<char*>(&n), 8);
  EXPECT_EQ(n % 8, 0u);
  EXPECT_THAT([&] { file.tensor("absent"); }, ThrowsMessage<UserError>(HasSubstr("has no tensor 'absent'")));
}

TEST(SafetensorsFile, ADamagedOrHostileFileIsRefusedByName) {
  const packtrain::testing::ScopedTempDir dir("safetensors");
  const fs::path path = dir.path() / "bad.safetensors";
  const auto refused = [&](const std::string& expected) {
    EXPECT_THAT([&] { SafetensorsFile file(path); }, ThrowsMessage<UserError>(HasSubstr(expected))) << expected;
  };
  const std::string good = R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  write_raw(path, good, std::string(8, '\0'));
  EXPECT_NO_THROW(SafetensorsFile{path});

  std::ofstream(path, std::ios::binary) << "abc";
  refused("shorter (3 bytes) than the 8-byte header length");
  write_raw(path, good, std::string(8, '\0'), 1 << 20);
  refused("header length 1048576 runs past the file's");
  write_raw(path, "{not json", "");
  refused("its JSON header does not parse");
  write_raw(path, "[1, 2]", "");
  refused("its JSON header is not an object");
  write_raw(path, R"({"t":{"dtype":"F33","shape":[2],"data_offsets":[0,8]}})", std::string(8, '\0'));
  refused("tensor 't': unknown dtype \"F33\"");
  write_raw(path, R"({"t":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", std::string(8, '\0'));
  refused("tensor 't': shape [3] of F32 needs 12 bytes, data_offsets [0,8] hold 8");
  write_raw(path, R"({"t":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", std::string(8, '\0'));
  refused("tensor 't': shape [-2] is not a list of sizes");
  write_raw(path, R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,80]}})", std::string(8, '\0'));
  refused("tensor 't': data_offsets [0,80] lie outside the file's 8 bytes of data");
  write_raw(path, R"({"t":{"dtype":"F32","shape":[2]}})", std::string(8, '\0'));
  refused("tensor 't': its entry needs dtype, shape and data_offsets");
  write_raw(
      path,
      R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"u":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
      std::string(8, '\0'));
  refused("two tensors' data_offsets overlap at byte 4");
  write_raw(path, R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", std::string(8, '\0'));
  refused("bytes 0..4 of its data belong to no tensor");
  write_raw(path, good, std::string(12, '\0'));
  refused("it holds 12 bytes of data, its header accounts for 8");
  write_raw(path, R"({"__metadata__":{"format":1}})", "");
  refused("__metadata__ value 'format' is not a string");

  const fs::path fifo = dir.path() / "fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_THAT([&] { SafetensorsFile file(fifo); }, ThrowsMessage<UserError>(HasSubstr("not a regular file")));
  EXPECT_THAT([&] { SafetensorsFile file(dir.path() / "absent"); },
              ThrowsMessage<UserError>(HasSubstr("cannot open it")));
}

// A file cut short while it is being read (another process rewriting it in place)
// is an error naming the file, not SIGBUS: the reader reads, it does not map.
TEST(SafetensorsFile, TruncatedWhileOpenIsAnErrorNamingTheFile) {
  const packtrain::testing::ScopedTempDir dir("safetensors");
  const fs::path path = dir.path() / "w.safetensors";
  write_safetensors(path, {{"a", at::randn({64})}, {"b", at::randn({1024})}}, {});
  const SafetensorsFile file(path);
  EXPECT_TRUE(at::equal(file.tensor("a"), file.tensor("a")));
  fs::resize_file(path, fs::file_size(path) - 2048);  // b's bytes gone
  EXPECT_THAT([&] { (void)file.tensor("b"); },
              ThrowsMessage<UserError>(AllOf(HasSubstr(path.string()), HasSubstr("truncated or rewritten"))));
}

}  // namespace
}  // namespace packtrain::runtime
