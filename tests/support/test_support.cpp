#include "tests/support/test_support.h"

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <c10/util/Exception.h>
#include <c10/util/Logging.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <stdexcept>
#include <string_view>

namespace packtrain::testing {

double max_abs_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a.detach().to(at::kDouble).cpu() - b.detach().to(at::kDouble).cpu()).abs().max().item<double>();
}

namespace {
::testing::AssertionResult compare(const at::Tensor& actual, const at::Tensor& expected, double tolerance,
                                   bool bitwise) {
  if (actual.sizes() != expected.sizes()) {
    return ::testing::AssertionFailure() << "shapes differ: actual " << actual.sizes() << ", expected "
                                         << expected.sizes();
  }
  if (actual.numel() == 0) return ::testing::AssertionSuccess();
  const at::Tensor a = actual.detach().to(at::kDouble).cpu().flatten();
  const at::Tensor e = expected.detach().to(at::kDouble).cpu().flatten();
  const bool ok = bitwise ? at::equal(actual.detach().cpu(), expected.detach().cpu())
                          : (a - e).abs().le(tolerance).all().item<bool>();
  if (ok) return ::testing::AssertionSuccess();
  const at::Tensor diff = (a - e).abs().nan_to_num(std::numeric_limits<double>::infinity());
  const int64_t worst = diff.argmax().item<int64_t>();
  std::ostringstream where;
  where << "worst element at flat index " << worst << " of shape " << actual.sizes() << ": actual "
        << std::setprecision(17) << a[worst].item<double>() << ", expected " << e[worst].item<double>() << ", |diff| "
        << diff[worst].item<double>();
  if (!bitwise) where << " > tolerance " << tolerance;
  return ::testing::AssertionFailure() << where.str();
}
}  // namespace

::testing::AssertionResult all_close(const at::Tensor& actual, const at::Tensor& expected, double tolerance) {
  return compare(actual, expected, tolerance, /*bitwise=*/false);
}

::testing::AssertionResult all_equal(const at::Tensor& actual, const at::Tensor& expected) {
  return compare(actual, expected, 0.0, /*bitwise=*/true);
}

std::vector<c10::Device> test_devices() { return {c10::Device(c10::kCPU), c10::Device(c10::kCUDA, 0)}; }

std::string device_unavailable_reason(const c10::Device& device) {
  if (device.is_cuda() && !at::hasCUDA()) {
    return "no CUDA device on this machine: the CUDA instance of this test runs on a GPU machine";
  }
  return {};
}

std::string device_name(const ::testing::TestParamInfo<c10::Device>& info) {
  return info.param.is_cuda() ? "cuda" : "cpu";
}

int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = 0;
  socklen_t length = sizeof(address);
  int port = 0;
  if (fd >= 0 && ::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0) {
    port = ntohs(address.sin_port);
  }
  if (fd >= 0) ::close(fd);
  EXPECT_GT(port, 0) << "no free port";
  return port;
}

std::string env_or(const char* name, const std::string& fallback) {
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0' ? std::string(value) : fallback;
}

void DeviceTest::SetUp() {
  const std::string reason = device_unavailable_reason(device());
  if (!reason.empty()) GTEST_SKIP() << reason;
}

ScopedTempDir::ScopedTempDir(const std::string& prefix) {
  std::string pattern = (std::filesystem::temp_directory_path() / (prefix + "_XXXXXX")).string();
  if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("cannot create a temporary directory " + pattern);
  path_ = pattern;
}

ScopedTempDir::~ScopedTempDir() {
  std::error_code ec;
  std::vector<std::filesystem::path> files;
  for (const auto& entry : std::filesystem::directory_iterator(path_, ec)) files.push_back(entry.path());
  for (const auto& file : files) std::filesystem::remove(file, ec);
  std::filesystem::remove(path_, ec);
}

}  // namespace packtrain::testing

namespace {
// Warnings about the machine, not the code: printed, never a failure. Gloo's, when
// this host's name does not resolve (packtrain binds local groups to loopback, so
// only a group the test makes over another address can meet it).
constexpr std::string_view kEnvironmentWarnings[] = {"Unable to resolve hostname to a (local) address"};

// Fails the running test when LibTorch warns (TORCH_WARN): a warning is a bug here.
class FailingWarningHandler : public c10::WarningHandler {
 public:
  void process(const c10::Warning& warning) override {
    for (const std::string_view known : kEnvironmentWarnings) {
      if (warning.msg().find(known) != std::string::npos) {
        std::fprintf(stderr, "[environment warning, not a failure] %s\n", warning.msg().c_str());
        return;
      }
    }
    ADD_FAILURE() << "LibTorch warned during the test: " << warning.msg();
  }
};
}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  static FailingWarningHandler handler;
  c10::WarningUtils::set_warning_handler(&handler);
  return RUN_ALL_TESTS();
}
