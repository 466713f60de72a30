// Shared test helpers: the one tolerance check, device parameters, and a main that
// fails any test during which LibTorch logs a warning.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

namespace packtrain::testing {

// Max |a - b| over all elements; a and b must have equal shapes.
double max_abs_diff(const at::Tensor& a, const at::Tensor& b);

// The one tolerance helper: passes when max |actual - expected| <= tolerance,
// otherwise fails naming the worst element (index, both values, the difference).
::testing::AssertionResult all_close(const at::Tensor& actual, const at::Tensor& expected, double tolerance);
// Bitwise-equal values (torch::equal); on failure names the worst element.
::testing::AssertionResult all_equal(const at::Tensor& actual, const at::Tensor& expected);

// Devices a device-parameterized test runs on: CPU and CUDA, always both, so the
// CUDA instances exist and skip with their reason on a machine without a GPU.
std::vector<c10::Device> test_devices();
// Empty when `device` can run here, else why not ("no CUDA device: ...").
std::string device_unavailable_reason(const c10::Device& device);
std::string device_name(const ::testing::TestParamInfo<c10::Device>& info);

// $NAME when set and not empty, else `fallback`: how a test reads a path compiled
// into it (PACKTRAIN_BINARY, PACKTRAIN_SOURCE_DIR, PACKTRAIN_TEST_PYTHON), so that
// binaries built on one machine run from a bundle on another
// (scripts/device/bundle.sh).
std::string env_or(const char* name, const std::string& fallback);

// A TCP port nothing listens on now (the kernel picks it), for ranks started by hand
// or in threads (fails the test when the kernel gives none).
int free_port();

// A fresh directory under the system temp dir (prefix + random suffix), removed with
// its files when the object goes — file by file: libtorch exports a broken copy of
// std::filesystem::remove_all that interposes on libstdc++'s.
class ScopedTempDir {
 public:
  explicit ScopedTempDir(const std::string& prefix);
  ~ScopedTempDir();
  ScopedTempDir(const ScopedTempDir&) = delete;
  ScopedTempDir& operator=(const ScopedTempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

// Base for device-parameterized tests: SetUp skips with the printed reason.
class DeviceTest : public ::testing::TestWithParam<c10::Device> {
 protected:
  void SetUp() override;
  c10::Device device() const { return GetParam(); }
};

}  // namespace packtrain::testing

#define PACKTRAIN_INSTANTIATE_DEVICE_TESTS(Suite)                                                     \
  INSTANTIATE_TEST_SUITE_P(Devices, Suite, ::testing::ValuesIn(::packtrain::testing::test_devices()), \
                           ::packtrain::testing::device_name)
