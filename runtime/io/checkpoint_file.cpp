#include "packtrain/runtime/io/checkpoint_file.h"

#include "packtrain/base/fnv1a.h"
#include "packtrain/base/user_error.h"

#include <ATen/core/ivalue.h>
#include <c10/util/Exception.h>
#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/import_read.h>
#include <torch/csrc/jit/serialization/pickle.h>

#include <fcntl.h>
#include <ftw.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

namespace packtrain::runtime {

namespace {

// ---- Atomic writes -------------------------------------------------------------

[[noreturn]] void throw_write_error(const std::filesystem::path& path, const std::string& step, int error) {
  throw WriteError("cannot write '" + path.string() + "': " + step + ": " + std::system_category().message(error));
}

}  // namespace

void remove_stale_temporaries(const std::filesystem::path& target, bool folders) {
  const std::filesystem::path dir = target.has_parent_path() ? target.parent_path() : std::filesystem::path(".");
  const std::string prefix = target.filename().string() + ".tmp.";
  std::error_code ec;
  std::vector<std::filesystem::path> stale;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(prefix, 0) != 0 || entry.is_symlink(ec)) continue;
    if (folders ? !entry.is_directory(ec) : !entry.is_regular_file(ec)) continue;
    const std::string rest = name.substr(prefix.size());
    const size_t dot = rest.find('.');
    const std::string pid_text = rest.substr(0, dot);
    if (pid_text.empty() || pid_text.find_first_not_of("0123456789") != std::string::npos || pid_text.size() > 9) {
      continue;
    }
    const auto pid = static_cast<pid_t>(std::stol(pid_text));
    if (pid != ::getpid() && ::kill(pid, 0) != 0 && errno == ESRCH) stale.push_back(entry.path());
  }
  for (const auto& path : stale) remove_tree(path);
}

bool remove_tree(const std::filesystem::path& path) {
  // Depth first (FTW_DEPTH: a folder after its entries), links as links (FTW_PHYS).
  const auto remove_one = [](const char* entry, const struct stat*, int type, struct FTW*) {
    (void)(type == FTW_DP ? ::rmdir(entry) : ::unlink(entry));  // best effort: go on with the rest
    return 0;
  };
  ::nftw(path.c_str(), remove_one, 16, FTW_DEPTH | FTW_PHYS);
  struct stat st {};
  return ::lstat(path.c_str(), &st) != 0 && errno == ENOENT;
}

namespace {

// The temporary a save writes before renaming it over the target. Until commit()
// the destructor closes and removes it, so a failed save leaves nothing behind.
//
// Created exclusively under an unpredictable name (mkostemp: O_CREAT|O_EXCL, so a
// file or symlink planted at the name makes it pick another, never write through
// it): `<target>.tmp.<pid>.<random>`. Temporaries of processes that no longer run
// (a save killed mid-way) are removed first.
class TemporaryFile {
 public:
  explicit TemporaryFile(std::filesystem::path target) : target_(std::move(target)) {
    remove_stale_temporaries(target_);
    std::string name = target_.string() + ".tmp." + std::to_string(::getpid()) + ".XXXXXX";
    fd_ = ::mkostemp(name.data(), O_CLOEXEC);
    if (fd_ < 0) throw_write_error(target_, "create a temporary file '" + name + "'", errno);
    path_ = name;
    ::fchmod(fd_, 0644);  // mkostemp makes 0600; a checkpoint is an ordinary file
  }
  TemporaryFile(const TemporaryFile&) = delete;
  TemporaryFile& operator=(const TemporaryFile&) = delete;
  ~TemporaryFile() {
    if (fd_ >= 0) ::close(fd_);
    std::error_code ignored;
    if (!committed_) std::filesystem::remove(path_, ignored);
  }

  void write_all(std::string_view bytes) {
    while (!bytes.empty()) {
      const ssize_t n = ::write(fd_, bytes.data(), bytes.size());
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) throw_write_error(target_, "write '" + path_.string() + "'", errno);
      bytes.remove_prefix(static_cast<size_t>(n));
    }
  }

  // Data on disk before the rename makes it visible: otherwise a crash right after
  // the rename could leave `target` naming an empty or partial file.
  void sync_and_close() {
    if (::fsync(fd_) != 0) throw_write_error(target_, "fsync '" + path_.string() + "'", errno);
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) throw_write_error(target_, "close '" + path_.string() + "'", errno);
  }

  // rename(2) replaces the target atomically within one file system.
  void commit() {
    if (::rename(path_.c_str(), target_.c_str()) != 0) {
      throw_write_error(target_, "rename '" + path_.string() + "' over it", errno);
    }
    committed_ = true;
  }

 private:
  std::filesystem::path target_;
  std::filesystem::path path_;
  int fd_ = -1;
  bool committed_ = false;
};

}  // namespace

void sync_directory_of(const std::filesystem::path& path) {
  std::filesystem::path dir = path.parent_path();
  if (dir.empty()) dir = ".";
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw_write_error(path, "open directory '" + dir.string() + "' to sync it", errno);
  const int synced = ::fsync(fd);
  const int error = errno;
  ::close(fd);
  if (synced != 0) throw_write_error(path, "fsync directory '" + dir.string() + "'", error);
}

namespace {

// ---- Container format ----------------------------------------------------------

constexpr std::string_view kMagic = "PKTRNCK1";
constexpr uint32_t kFormatVersion = 1;
constexpr size_t kVersionAt = 8, kLengthAt = 12, kChecksumAt = 20, kHeaderBytes = 28;

// Byte by byte, so the file layout does not depend on the host's endianness.
void append_le(std::string& out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

uint64_t read_le(std::string_view in, size_t at, int bytes) {
  uint64_t value = 0;
  for (int i = 0; i < bytes; ++i) value |= uint64_t{static_cast<unsigned char>(in[at + i])} << (8 * i);
  return value;
}

std::string hex(uint64_t value) {
  std::ostringstream out;
  out << "0x" << std::hex << value;
  return out.str();
}

// ---- Loading -------------------------------------------------------------------

[[noreturn]] void fail(const std::filesystem::path& path, const std::string& problem) {
  throw UserError("checkpoint '" + path.string() + "': " + problem);
}

std::ifstream open_regular_file(const std::filesystem::path& path) {
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  if (!std::filesystem::exists(status)) fail(path, "no such file");
  if (!std::filesystem::is_regular_file(status)) fail(path, "not a regular file");
  return std::ifstream(path, std::ios::binary);
}

std::string read_whole_file(const std::filesystem::path& path) {
  std::ifstream in = open_regular_file(path);
  std::string bytes{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  if (in.bad() || !in.is_open()) fail(path, "cannot be read");
  return bytes;
}

void check_header(const std::filesystem::path& path, std::string_view file) {
  if (file.empty()) fail(path, "empty file (0 bytes), not a packtrain checkpoint");
  if (file.substr(0, kMagic.size()) != kMagic.substr(0, std::min(file.size(), kMagic.size()))) {
    fail(path, "not a packtrain checkpoint (does not start with \"PKTRNCK1\")");
  }
  if (file.size() < kHeaderBytes) {
    fail(path,
         "truncated: header has " + std::to_string(file.size()) + " of " + std::to_string(kHeaderBytes) + " bytes");
  }
  const uint64_t version = read_le(file, kVersionAt, 4);
  if (version != kFormatVersion) {
    fail(path, "unsupported format version " + std::to_string(version) + " (this build reads version " +
                   std::to_string(kFormatVersion) + ")");
  }
}

// The payload, once the header, length and checksum all agree.
std::string_view checked_payload(const std::filesystem::path& path, std::string_view file) {
  check_header(path, file);
  const uint64_t expected = read_le(file, kLengthAt, 8);
  const std::string_view payload = file.substr(kHeaderBytes);
  if (payload.size() < expected) {
    fail(path, "truncated: " + std::to_string(payload.size()) + " of " + std::to_string(expected) +
                   " payload bytes (was the save interrupted or the copy incomplete?)");
  }
  if (payload.size() > expected) {
    fail(path, "corrupted: " + std::to_string(payload.size() - expected) + " unexpected bytes after the " +
                   std::to_string(expected) + "-byte payload");
  }
  const uint64_t stored = read_le(file, kChecksumAt, 8);
  const uint64_t actual = fnv1a64(payload);
  if (stored != actual) {
    fail(path, "corrupted: payload checksum " + hex(actual) + " does not match the stored " + hex(stored) +
                   " (the file changed after it was written)");
  }
  return payload;
}

std::string first_line(const char* text) {
  const std::string s(text);
  return s.substr(0, s.find('\n'));
}

// The payload, read in place (torch::jit::StringViewReader is not exported).
class PayloadReader final : public caffe2::serialize::ReadAdapterInterface {
 public:
  explicit PayloadReader(std::string_view data) : data_(data) {}
  size_t size() const override { return data_.size(); }
  size_t read(uint64_t pos, void* buf, size_t n, const char* /*what*/ = "") const override {
    if (pos >= data_.size()) return 0;
    n = std::min<size_t>(n, data_.size() - pos);
    std::memcpy(buf, data_.data() + pos, n);
    return n;
  }

 private:
  std::string_view data_;
};

c10::IValue decode_payload(const std::filesystem::path& path, std::string_view payload) {
  try {
    caffe2::serialize::PyTorchStreamReader reader(std::make_shared<PayloadReader>(payload));
    // As torch::jit::pickle_load does, but with every tensor mapped to the CPU: a
    // checkpoint saved from GPU tensors loads on a machine without one.
    return torch::jit::readArchiveAndTensors("data", /*pickle_prefix=*/"", /*tensor_prefix=*/"",
                                             /*type_resolver=*/std::nullopt, /*obj_loader=*/std::nullopt,
                                             c10::Device(c10::kCPU), reader);
  } catch (const c10::Error& e) {
    fail(path, "payload cannot be decoded: " + first_line(e.what_without_backtrace()));
  } catch (const std::exception& e) {
    fail(path, "payload cannot be decoded: " + first_line(e.what()));
  }
}

}  // namespace

OutputTarget output_target(const std::filesystem::path& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return {OutputKind::kFile, "nothing"};
  if (S_ISREG(st.st_mode)) return {OutputKind::kFile, "regular file"};
  if (S_ISCHR(st.st_mode)) return {OutputKind::kStream, "character device"};
  if (S_ISFIFO(st.st_mode)) return {OutputKind::kStream, "FIFO"};
  if (S_ISDIR(st.st_mode)) return {OutputKind::kRefused, "directory"};
  if (S_ISBLK(st.st_mode)) return {OutputKind::kRefused, "block device"};
  if (S_ISSOCK(st.st_mode)) return {OutputKind::kRefused, "socket"};
  return {OutputKind::kRefused, "special file"};
}

namespace {

// A character device or FIFO written in place. SIGPIPE (a FIFO's reader gone) is
// held back for this thread while writing, so it surfaces as EPIPE, a WriteError,
// instead of ending the process; a SIGPIPE this write raised is then consumed.
void write_in_place(const std::filesystem::path& path, std::string_view bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) throw_write_error(path, "open it for writing", errno);
  sigset_t pipe_only, previous;
  sigemptyset(&pipe_only);
  sigaddset(&pipe_only, SIGPIPE);
  ::pthread_sigmask(SIG_BLOCK, &pipe_only, &previous);
  int error = 0;
  while (!bytes.empty()) {
    const ssize_t n = ::write(fd, bytes.data(), bytes.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      error = errno;
      break;
    }
    bytes.remove_prefix(static_cast<size_t>(n));
  }
  if (error == EPIPE && !sigismember(&previous, SIGPIPE)) {
    const struct timespec no_wait {};
    ::sigtimedwait(&pipe_only, nullptr, &no_wait);
  }
  ::pthread_sigmask(SIG_SETMASK, &previous, nullptr);
  if (::close(fd) != 0 && error == 0) error = errno;
  if (error != 0) throw_write_error(path, "write it", error);
}

}  // namespace

void write_file_atomically(const std::filesystem::path& path, std::string_view bytes, int64_t crash_after_bytes) {
  const OutputTarget target = output_target(path);
  if (target.kind == OutputKind::kStream) {
    write_in_place(path, bytes);
    return;
  }
  if (target.kind == OutputKind::kRefused) {
    throw WriteError("cannot write '" + path.string() + "': it is a " + target.type +
                     "; an output is a regular file, a character device (such as /dev/null) or a FIFO");
  }
  TemporaryFile temporary(path);
  if (crash_after_bytes >= 0 && static_cast<uint64_t>(crash_after_bytes) <= bytes.size()) {
    temporary.write_all(bytes.substr(0, static_cast<size_t>(crash_after_bytes)));
    std::_Exit(70);  // test hook: a crash mid-save (no destructors, no cleanup)
  }
  temporary.write_all(bytes);
  temporary.sync_and_close();
  temporary.commit();
  sync_directory_of(path);
}

void save_checkpoint(const std::filesystem::path& path, const c10::IValue& payload, int64_t crash_after_bytes) {
  const std::vector<char> pickled = torch::jit::pickle_save(payload);
  const std::string_view body(pickled.data(), pickled.size());
  std::string file;
  file.reserve(kHeaderBytes + body.size());
  file.append(kMagic);
  append_le(file, kFormatVersion, 4);
  append_le(file, body.size(), 8);
  append_le(file, fnv1a64(body), 8);
  file.append(body);
  write_file_atomically(path, file, crash_after_bytes);
}

c10::IValue load_checkpoint(const std::filesystem::path& path) {
  const std::string file = read_whole_file(path);
  return decode_payload(path, checked_payload(path, file));
}

uint64_t checkpoint_checksum(const std::filesystem::path& path) {
  std::ifstream in = open_regular_file(path);
  if (!in) fail(path, "cannot be read");
  std::string header(kHeaderBytes, '\0');
  in.read(header.data(), static_cast<std::streamsize>(header.size()));
  header.resize(static_cast<size_t>(in.gcount()));
  check_header(path, header);
  return read_le(header, kChecksumAt, 8);
}

}  // namespace packtrain::runtime
