// Outputs that name something other than a regular file: a character device
// (/dev/null, /dev/full), a FIFO, a socket, a block device. Every command's outputs
// are written in place into devices and FIFOs (never renamed over them), refused
// for sockets and block devices, and no output replaces a file the run reads (the
// --config file included). Device nodes, FIFOs and sockets are made in the test's
// own directory: the real /dev is never touched.
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "tests/runtime/cli/cli_harness.h"

namespace packtrain::cli_testing {
namespace {

using ::testing::HasSubstr;

// A character device node (major, minor) at `path`; empty, or why not (no
// CAP_MKNOD in this container, a file system mounted nodev).
std::string make_char_device(const std::string& path, unsigned major, unsigned minor) {
  if (::mknod(path.c_str(), S_IFCHR | 0666, makedev(major, minor)) != 0) {
    return "cannot make a device node here (mknod: " + std::string(std::strerror(errno)) + ")";
  }
  const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);  // a nodev mount refuses here
  if (fd < 0) return "the device node cannot be opened (" + std::string(std::strerror(errno)) + ")";
  ::close(fd);
  return {};
}

// Still the device node it was made as (a rename over it would leave a regular file).
::testing::AssertionResult is_char_device(const std::string& path, unsigned major, unsigned minor) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return ::testing::AssertionFailure() << path << " is gone";
  if (!S_ISCHR(st.st_mode)) return ::testing::AssertionFailure() << path << " is no longer a character device";
  if (st.st_rdev != makedev(major, minor)) return ::testing::AssertionFailure() << path << " is another device";
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult is_fifo(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0 || !S_ISFIFO(st.st_mode)) {
    return ::testing::AssertionFailure() << path << " is no longer a FIFO";
  }
  return ::testing::AssertionSuccess();
}

// A CSV of `rows` feature rows (the concrete columns, no target), about 40 bytes a row.
std::string pool_csv(const std::string& path, int rows) {
  std::string text = "cement,slag,ash,water,superplasticizer,coarse,fine,age\n";
  for (int i = 0; i < rows; ++i) {
    text += std::to_string(200 + i % 300) + ",50,20,180,5,950,750," + std::to_string(7 + i % 90) + "\n";
  }
  write_file(path, text);
  return path;
}

class SpecialOutputs : public Cli {
 protected:
  void SetUp() override {
    ckpt_ = path("m.ckpt");
    const Result trained = run(std::string("train ") + kSmall + " --quiet --checkpoint " + ckpt_);
    ASSERT_EQ(trained.status, 0) << trained.out;
  }
  std::string ckpt_;
};

// What `--checkpoint /dev/null` means to a user: keep nothing. Every output flag of
// every command writes into the device in place and leaves it a device.
TEST_F(SpecialOutputs, EveryOutputWritesIntoACharacterDeviceAndLeavesItADevice) {
  const std::string null = path("null");
  if (const std::string why = make_char_device(null, 1, 3); !why.empty()) GTEST_SKIP() << why;
  const std::string rows = concrete_csv("rows.csv", 20, true);
  const std::string pool = pool_csv(path("pool.csv"), 30);
  const std::vector<std::string> commands = {
      std::string("train ") + kSmall + " --quiet --checkpoint " + null + " --export " + null + " --trace " + null +
          " --log " + null,
      "resume " + ckpt_ + " --epochs 10 --quiet --checkpoint " + null,
      "evaluate " + ckpt_ + " " + rows + " --reliability " + null,
      "predict " + ckpt_ + " " + pool + " -o " + null,
      "acquire " + ckpt_ + " " + pool + " --strategy epistemic --count 3 -o " + null,
      "export " + ckpt_ + " " + null,
  };
  for (const std::string& command : commands) {
    const Result r = run(command);
    EXPECT_EQ(r.status, 0) << command << "\n" << r.out;
    EXPECT_TRUE(is_char_device(null, 1, 3)) << command;
  }
  // Nothing was left beside it either: no temporary, no renamed file.
  std::vector<std::string> stray;
  for (const auto& entry : fs::directory_iterator(dir())) {
    if (entry.path().filename().string().starts_with("null.")) stray.push_back(entry.path().filename());
  }
  EXPECT_TRUE(stray.empty()) << stray.front();
}

// /dev/full: a write error (exit 1, the errno text), and the device stays.
TEST_F(SpecialOutputs, AFullDeviceIsAWriteErrorAndStaysADevice) {
  const std::string full = path("full");
  if (const std::string why = make_char_device(full, 1, 7); !why.empty()) GTEST_SKIP() << why;
  const Result r = run("predict " + ckpt_ + " " + pool_csv(path("pool.csv"), 10) + " -o " + full);
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_THAT(r.out, HasSubstr("No space left on device"));
  EXPECT_THAT(r.out, HasSubstr(full));
  EXPECT_TRUE(is_char_device(full, 1, 7));
}

// A FIFO gets exactly the bytes a regular file would, and stays a FIFO.
TEST_F(SpecialOutputs, AFifoReceivesWhatAFileWouldAndStaysAFifo) {
  const std::string fifo = path("fifo"), pool = pool_csv(path("pool.csv"), 40);
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0) << std::strerror(errno);
  ASSERT_EQ(run("predict " + ckpt_ + " " + pool + " -o " + path("file.csv")).status, 0);
  const Result r = run_command("cat " + fifo + " > " + path("got.csv") + " & reader=$!; '" + binary() + "' predict " +
                               ckpt_ + " " + pool + " -o " + fifo + " 2>&1; status=$?; wait $reader; exit $status");
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(read_file(path("got.csv")), read_file(path("file.csv")));
  EXPECT_TRUE(is_fifo(fifo));
  // A checkpoint through a FIFO is the same bytes as one in a file.
  const Result saved =
      run_command("cat " + fifo + " > " + path("got.ckpt") + " & reader=$!; '" + binary() + "' train " + kSmall +
                  " --quiet --checkpoint " + fifo + " 2>&1; status=$?; wait $reader; exit $status");
  EXPECT_EQ(saved.status, 0) << saved.out;
  EXPECT_EQ(read_file(path("got.ckpt")), read_file(ckpt_)) << "one seed, one checkpoint";
}

// A reader that goes away early: a write error (exit 1), not a death by SIGPIPE.
TEST_F(SpecialOutputs, AFifoWhoseReaderLeavesEarlyIsAWriteError) {
  const std::string fifo = path("fifo"), pool = pool_csv(path("pool.csv"), 4000);  // far beyond a pipe's 64 KiB
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0) << std::strerror(errno);
  const Result r =
      run_command("head -c 10 " + fifo + " > " + path("head.txt") + " & reader=$!; '" + binary() + "' predict " +
                  ckpt_ + " " + pool + " -o " + fifo + " 2>&1; status=$?; wait $reader; exit $status");
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_THAT(r.out, HasSubstr("Broken pipe"));
  EXPECT_TRUE(is_fifo(fifo));
}

// A socket and a block device are never written: exit 2 before any work, the node
// left as it was.
TEST_F(SpecialOutputs, SocketsAndBlockDevicesAreRefusedBeforeAnyWork) {
  const std::string sock = path("sock");
  const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  ASSERT_LT(sock.size(), sizeof(address.sun_path));
  std::strcpy(address.sun_path, sock.c_str());
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0) << std::strerror(errno);
  const std::vector<std::pair<std::string, std::string>> nodes = {{sock, "socket"}};
  std::vector<std::pair<std::string, std::string>> all = nodes;
  // Major 240 is reserved for local use: no driver answers, so even a regression
  // could not write to a real disk.
  const std::string block = path("block");
  if (::mknod(block.c_str(), S_IFBLK | 0600, makedev(240, 0)) == 0) all.push_back({block, "block device"});
  for (const auto& [node, type] : all) {
    for (const std::string& command :
         {std::string("train ") + kSmall + " --quiet --checkpoint " + node,
          "predict " + ckpt_ + " " + pool_csv(path("pool.csv"), 5) + " -o " + node, "export " + ckpt_ + " " + node}) {
      const Result r = run(command);
      EXPECT_EQ(r.status, 2) << command << "\n" << r.out;
      EXPECT_THAT(r.out, HasSubstr("is a " + type));
      EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
    }
  }
  struct stat st {};
  ASSERT_EQ(::lstat(sock.c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  ::close(fd);
}

// A checkpoint that is several files named after its path cannot be a device.
TEST_F(SpecialOutputs, AMemberParallelCheckpointMustBeARegularFile) {
  const std::string null = path("null");
  if (const std::string why = make_char_device(null, 1, 3); !why.empty()) GTEST_SKIP() << why;
  const Result r = run(std::string("train ") + kSmall + " --member-parallel --recalibrate none --checkpoint " + null);
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_THAT(r.out, HasSubstr("several files"));
  EXPECT_TRUE(is_char_device(null, 1, 3));
}

// The --config file is an input like --data: no output replaces it, in either spelling.
TEST_F(Cli, NoOutputReplacesTheConfigFile) {
  const std::string config = path("run.toml");
  const std::string text = "members = 2\nepochs = 2\nhidden = 8\ndevice = \"cpu\"\n";
  write_file(config, text);
  for (const std::string& args :
       {"train --config " + config + " --checkpoint " + config, "train --config=" + config + " --export " + config,
        "train --quiet --trace " + path("./run.toml") + " --config " + config}) {
    const Result r = run(args);
    EXPECT_EQ(r.status, 2) << args << "\n" << r.out;
    EXPECT_THAT(r.out, HasSubstr("same file as the input --config"));
    EXPECT_EQ(read_file(config), text) << args;
  }
}

}  // namespace
}  // namespace packtrain::cli_testing
