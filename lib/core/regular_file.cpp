#include "core/regular_file.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "core/error.h"

namespace trainer {

namespace {

// What a non-regular file is, for messages.
const char* kind_of(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a plain file";
}

}  // namespace

RegularFile::RegularFile(std::string path) : path_(std::move(path)) {
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer. It changes nothing
  // for regular files.
  fd_ = ::open(path_.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd_ < 0) throw UserError(fmt::format("{}: cannot open file ({})", path_, std::strerror(errno)));
  struct stat info {};
  if (::fstat(fd_, &info) != 0) {
    const int error = errno;
    release();
    throw UserError(fmt::format("{}: cannot read the file's size ({})", path_, std::strerror(error)));
  }
  if (!S_ISREG(info.st_mode)) {
    release();
    throw UserError(fmt::format("{}: not a regular file ({}); expected a file", path_, kind_of(info.st_mode)));
  }
  size_ = uint64_t(info.st_size);
}

RegularFile::~RegularFile() { release(); }

RegularFile::RegularFile(RegularFile&& other) noexcept
    : path_(std::move(other.path_)), fd_(std::exchange(other.fd_, -1)), size_(std::exchange(other.size_, 0)) {}

RegularFile& RegularFile::operator=(RegularFile&& other) noexcept {
  if (this != &other) {
    release();
    path_ = std::move(other.path_);
    fd_ = std::exchange(other.fd_, -1);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

void RegularFile::release() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

void RegularFile::read_at(uint64_t offset, void* out, size_t bytes) const {
  auto* at = static_cast<char*>(out);
  while (bytes > 0) {
    const ssize_t got = ::pread(fd_, at, bytes, off_t(offset));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) throw UserError(fmt::format("{}: cannot read ({})", path_, std::strerror(errno)));
    if (got == 0)
      throw UserError(fmt::format("{}: the file ends at byte {}, before the {} more bytes expected there (truncated "
                                  "while reading?)",
                                  path_, offset, bytes));
    at += got;
    offset += uint64_t(got);
    bytes -= size_t(got);
  }
}

std::string read_text_file(const std::string& path, uint64_t max_bytes) {
  const RegularFile file(path);
  if (file.size() > max_bytes)
    throw UserError(fmt::format("{}: {} bytes, more than the {} bytes a text file read by trainer may hold", path,
                                file.size(), max_bytes));
  std::string text(size_t(file.size()), '\0');
  file.read_at(0, text.data(), text.size());
  return text;
}

bool is_plain_file_name(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos &&
         name.find('\0') == std::string::npos;
}

}  // namespace trainer
