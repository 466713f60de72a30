// Checkpoint files: round trip, each way a damaged file is reported, and that a
// save interrupted by a crash leaves the previous checkpoint in place.
#include "packtrain/runtime/io/checkpoint_file.h"

#include "packtrain/base/user_error.h"
#include "tests/support/test_support.h"

#include <ATen/ATen.h>
#include <ATen/core/Dict.h>
#include <ATen/core/List.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <stdexcept>
#include <string>
#include <vector>

namespace packtrain::runtime {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

constexpr size_t kHeaderBytes = 28;  // magic 8, version 4, length 8, checksum 8

c10::impl::GenericDict new_dict() { return c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get()); }

// A payload with every kind of value a checkpoint holds; `seed` varies the tensors.
c10::IValue sample_payload(int64_t seed) {
  at::manual_seed(static_cast<uint64_t>(seed));
  c10::impl::GenericDict nested = new_dict();
  nested.insert("epoch", seed);
  nested.insert("ids", c10::List<int64_t>({3, 1, 4}));
  nested.insert("weights", at::randn({2, 3, 4}, at::kFloat));
  c10::impl::GenericDict d = new_dict();
  d.insert("float", at::randn({5, 3}, at::kFloat));
  d.insert("double", at::randn({4}, at::kDouble));
  d.insert("int64", at::arange(seed, seed + 6, at::kLong));
  d.insert("bool", at::rand({7}).gt(0.5));
  d.insert("step", int64_t{123456789012});
  d.insert("lr", 1e-3 * static_cast<double>(seed));
  d.insert("name", std::string("packtrain run ") + std::to_string(seed));
  d.insert("nested", nested);
  return d;
}

// Deep equality: same kinds, dict keys, list lengths; tensors of equal dtype, on
// the CPU, bitwise equal.
::testing::AssertionResult same(const c10::IValue& a, const c10::IValue& b, const std::string& where = "payload") {
  if (a.tagKind() != b.tagKind()) {
    return ::testing::AssertionFailure() << where << ": kind " << a.tagKind() << " vs " << b.tagKind();
  }
  if (a.isTensor()) {
    const at::Tensor &x = a.toTensor(), &y = b.toTensor();
    const bool ok = x.scalar_type() == y.scalar_type() && y.device().is_cpu() && x.sizes() == y.sizes() && x.equal(y);
    return ok ? ::testing::AssertionSuccess() : ::testing::AssertionFailure() << where << ": tensors differ";
  }
  if (a.isGenericDict()) {
    const auto x = a.toGenericDict(), y = b.toGenericDict();
    if (x.size() != y.size()) return ::testing::AssertionFailure() << where << ": dict sizes differ";
    for (const auto& item : x) {
      const std::string key = item.key().toStringRef();
      if (!y.contains(key)) return ::testing::AssertionFailure() << where << ": key '" << key << "' missing";
      if (auto r = same(item.value(), y.at(key), where + "." + key); !r) return r;
    }
    return ::testing::AssertionSuccess();
  }
  if (a.isList()) {
    const auto x = a.toListRef(), y = b.toListRef();
    if (x.size() != y.size()) return ::testing::AssertionFailure() << where << ": list lengths differ";
    for (size_t i = 0; i < x.size(); ++i) {
      if (auto r = same(x[i], y[i], where + "[" + std::to_string(i) + "]"); !r) return r;
    }
    return ::testing::AssertionSuccess();
  }
  return a == b ? ::testing::AssertionSuccess() : ::testing::AssertionFailure() << where << ": " << a << " vs " << b;
}

// FNV-1a 64, written here from its definition: checks the documented format
// independently of the implementation.
uint64_t fnv1a64(const std::string& bytes) {
  uint64_t hash = 0xcbf29ce484222325ULL;
  for (const unsigned char c : bytes) hash = (hash ^ c) * 0x100000001b3ULL;
  return hash;
}

uint64_t read_le(const std::string& bytes, size_t at, int n) {
  uint64_t value = 0;
  for (int i = 0; i < n; ++i) value |= uint64_t{static_cast<unsigned char>(bytes[at + i])} << (8 * i);
  return value;
}

void append_le(std::string& out, uint64_t value, int n) {
  for (int i = 0; i < n; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

class CheckpointFile : public ::testing::Test {
 protected:
  fs::path path(const std::string& name) const { return dir_ / name; }

  static std::string read(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  }
  static void write(const fs::path& p, const std::string& bytes) {
    std::ofstream(p, std::ios::binary | std::ios::trunc) << bytes;
  }

  // The UserError message load_checkpoint gives, or why there was none.
  static std::string load_error(const fs::path& p) {
    try {
      load_checkpoint(p);
    } catch (const UserError& e) {
      return e.what();
    } catch (const std::exception& e) {
      return std::string("not a UserError: ") + e.what();
    }
    return "no error";
  }

  // A valid checkpoint's bytes, changed by `edit`, written to a new file.
  fs::path damaged(const std::string& name, const std::function<void(std::string&)>& edit) {
    save_checkpoint(path("good.ckpt"), sample_payload(1));
    std::string bytes = read(path("good.ckpt"));
    edit(bytes);
    write(path(name), bytes);
    return path(name);
  }

  packtrain::testing::ScopedTempDir temp_{"packtrain_checkpoint"};
  const fs::path dir_ = temp_.path();
};

TEST_F(CheckpointFile, RoundTrip_AllValueKinds) {
  const c10::IValue payload = sample_payload(3);
  save_checkpoint(path("a.ckpt"), payload);
  EXPECT_TRUE(same(payload, load_checkpoint(path("a.ckpt"))));
}

TEST_F(CheckpointFile, CudaTensors_LoadOnCpu) {
  const std::string reason = packtrain::testing::device_unavailable_reason(c10::Device(c10::kCUDA, 0));
  if (!reason.empty()) GTEST_SKIP() << reason;
  const c10::IValue payload = sample_payload(4);
  c10::impl::GenericDict on_gpu = new_dict();
  for (const auto& item : payload.toGenericDict()) {
    const c10::IValue& v = item.value();
    on_gpu.insert(item.key(), v.isTensor() ? c10::IValue(v.toTensor().cuda()) : v);
  }
  save_checkpoint(path("gpu.ckpt"), on_gpu);
  EXPECT_TRUE(same(payload, load_checkpoint(path("gpu.ckpt"))));
}

TEST_F(CheckpointFile, Header_IsTheDocumentedLayout) {
  save_checkpoint(path("a.ckpt"), sample_payload(2));
  const std::string bytes = read(path("a.ckpt"));
  ASSERT_GT(bytes.size(), kHeaderBytes);
  EXPECT_EQ(bytes.substr(0, 8), "PKTRNCK1");
  EXPECT_EQ(read_le(bytes, 8, 4), 1u);
  EXPECT_EQ(read_le(bytes, 12, 8), bytes.size() - kHeaderBytes);
  EXPECT_EQ(read_le(bytes, 20, 8), fnv1a64(bytes.substr(kHeaderBytes)));
}

TEST_F(CheckpointFile, Missing_NamesFile) {
  const std::string error = load_error(path("nowhere.ckpt"));
  EXPECT_THAT(error, HasSubstr(path("nowhere.ckpt").string()));
  EXPECT_THAT(error, HasSubstr("no such file"));
}

TEST_F(CheckpointFile, Empty_NotACheckpoint) {
  write(path("empty.ckpt"), "");
  const std::string error = load_error(path("empty.ckpt"));
  EXPECT_THAT(error, HasSubstr(path("empty.ckpt").string()));
  EXPECT_THAT(error, HasSubstr("empty file"));
}

TEST_F(CheckpointFile, WrongMagic_NotACheckpoint) {
  const fs::path p = damaged("magic.ckpt", [](std::string& b) { b.replace(0, 8, "PK\x03\x04ZIP!"); });
  const std::string error = load_error(p);
  EXPECT_THAT(error, HasSubstr(p.string()));
  EXPECT_THAT(error, HasSubstr("not a packtrain checkpoint"));
}

TEST_F(CheckpointFile, OtherVersion_Unsupported) {
  const fs::path p = damaged("version.ckpt", [](std::string& b) { b[8] = 2; });
  const std::string error = load_error(p);
  EXPECT_THAT(error, HasSubstr(p.string()));
  EXPECT_THAT(error, HasSubstr("unsupported format version 2"));
}

TEST_F(CheckpointFile, Truncated_ByOneByte) {
  size_t payload = 0;
  const fs::path p = damaged("short.ckpt", [&](std::string& b) {
    payload = b.size() - kHeaderBytes;
    b.pop_back();
  });
  const std::string error = load_error(p);
  EXPECT_THAT(error, HasSubstr(p.string()));
  EXPECT_THAT(error, HasSubstr("truncated: " + std::to_string(payload - 1) + " of " + std::to_string(payload) +
                               " payload bytes"));
}

TEST_F(CheckpointFile, Truncated_ToHalf) {
  size_t payload = 0, kept = 0;
  const fs::path p = damaged("half.ckpt", [&](std::string& b) {
    payload = b.size() - kHeaderBytes;
    b.resize(b.size() / 2);
    kept = b.size() - kHeaderBytes;
  });
  const std::string error = load_error(p);
  EXPECT_THAT(error, HasSubstr(p.string()));
  EXPECT_THAT(error,
              HasSubstr("truncated: " + std::to_string(kept) + " of " + std::to_string(payload) + " payload bytes"));
}

TEST_F(CheckpointFile, Truncated_InsideHeader) {
  const fs::path p = damaged("header.ckpt", [](std::string& b) { b.resize(12); });
  EXPECT_THAT(load_error(p), HasSubstr("truncated: header has 12 of 28 bytes"));
}

TEST_F(CheckpointFile, FlippedPayloadByte_Corrupted) {
  const fs::path p =
      damaged("flipped.ckpt", [](std::string& b) { b[kHeaderBytes + (b.size() - kHeaderBytes) / 2] ^= 0x10; });
  const std::string error = load_error(p);
  EXPECT_THAT(error, HasSubstr(p.string()));
  EXPECT_THAT(error, HasSubstr("corrupted: payload checksum"));
}

TEST_F(CheckpointFile, TrailingBytes_Corrupted) {
  const fs::path p = damaged("long.ckpt", [](std::string& b) { b += "xyz"; });
  EXPECT_THAT(load_error(p), HasSubstr("corrupted: 3 unexpected bytes after"));
}

TEST_F(CheckpointFile, UndecodablePayload_NamesFile) {
  const std::string garbage = "this is not a pickled torch archive";
  std::string bytes = "PKTRNCK1";
  append_le(bytes, 1, 4);
  append_le(bytes, garbage.size(), 8);
  append_le(bytes, fnv1a64(garbage), 8);
  write(path("garbage.ckpt"), bytes + garbage);
  const std::string error = load_error(path("garbage.ckpt"));
  EXPECT_THAT(error, HasSubstr(path("garbage.ckpt").string()));
  EXPECT_THAT(error, HasSubstr("payload cannot be decoded"));
  EXPECT_EQ(error.find('\n'), std::string::npos) << "one line: " << error;
}

TEST_F(CheckpointFile, CrashMidSave_KeepsPreviousFile) {
  const c10::IValue a = sample_payload(1), b = sample_payload(2);
  save_checkpoint(path("b_size.ckpt"), b);
  const auto b_size = static_cast<int64_t>(fs::file_size(path("b_size.ckpt")));
  const fs::path target = path("run.ckpt");
  save_checkpoint(target, a);

  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // the child only saves, and never returns into the test runner
    try {
      save_checkpoint(target, b, /*crash_after_bytes=*/b_size / 2);
    } catch (...) {
      std::_Exit(1);
    }
    std::_Exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 70) << "the crash hook should have ended the child";

  EXPECT_TRUE(same(a, load_checkpoint(target))) << "a crash mid-save must leave the previous checkpoint";
  // The crashed save's temporary, <target>.tmp.<its pid>.<random>, half written.
  const std::string prefix = target.filename().string() + ".tmp." + std::to_string(child) + ".";
  const auto partials = [&] {
    std::vector<fs::path> found;
    for (const auto& entry : fs::directory_iterator(dir_)) {
      if (entry.path().filename().string().rfind(prefix, 0) == 0) found.push_back(entry.path());
    }
    return found;
  };
  ASSERT_EQ(partials().size(), 1u);
  EXPECT_EQ(static_cast<int64_t>(fs::file_size(partials()[0])), b_size / 2);

  save_checkpoint(target, b);
  EXPECT_TRUE(same(b, load_checkpoint(target)));
  EXPECT_TRUE(partials().empty()) << "the next save removes the temporaries of saves whose process is gone";
}

// A symlink planted where a save puts its temporary (any name an attacker can
// predict: <target>.tmp.<pid>, with or without a suffix) is never written through.
TEST_F(CheckpointFile, ASymlinkAtTheTemporaryNameIsNotFollowed) {
  const fs::path victim = path("victim.txt"), target = path("run.ckpt");
  { std::ofstream(victim) << "precious"; }
  const std::string pid = std::to_string(::getpid());
  fs::create_symlink(victim, target.string() + ".tmp." + pid);
  fs::create_symlink(victim, target.string() + ".tmp");
  save_checkpoint(target, sample_payload(1));
  EXPECT_TRUE(same(sample_payload(1), load_checkpoint(target)));
  std::ifstream in(victim);
  std::string content((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(content, "precious") << "the symlink's target was overwritten";
  EXPECT_TRUE(fs::is_symlink(target.string() + ".tmp." + pid)) << "a planted link is left alone, not followed";
}

TEST_F(CheckpointFile, SaveReplacesAndLeavesNoTemporary) {
  save_checkpoint(path("run.ckpt"), sample_payload(1));
  save_checkpoint(path("run.ckpt"), sample_payload(2));
  EXPECT_TRUE(same(sample_payload(2), load_checkpoint(path("run.ckpt"))));
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir_)) names.push_back(entry.path().filename().string());
  EXPECT_EQ(names, std::vector<std::string>{"run.ckpt"});
}

TEST_F(CheckpointFile, MissingDirectory_ThrowsNamingPathLeavesNothing) {
  const fs::path target = path("missing") / "run.ckpt";
  try {
    save_checkpoint(target, sample_payload(1));
    ADD_FAILURE() << "saving into a missing directory should throw";
  } catch (const std::runtime_error& e) {
    EXPECT_THAT(e.what(), HasSubstr(target.string()));
    EXPECT_THAT(e.what(), HasSubstr("No such file or directory"));
  }
  EXPECT_FALSE(fs::exists(path("missing")));
  EXPECT_TRUE(fs::is_empty(dir_));
}

TEST_F(CheckpointFile, WriteFileAtomically_WritesExactBytes) {
  const std::string bytes("binary\0data\n\xff", 13);
  write_file_atomically(path("raw.bin"), bytes);
  EXPECT_EQ(read(path("raw.bin")), bytes);
  write_file_atomically(path("raw.bin"), "shorter");
  EXPECT_EQ(read(path("raw.bin")), "shorter");
}

}  // namespace
}  // namespace packtrain::runtime
