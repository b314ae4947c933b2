#include "data/mapped_file.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "core/error.h"

namespace trainer::data {

namespace {
[[noreturn]] void fail(const std::string& path, const char* what, int error) {
  throw UserError(fmt::format("{}: {} ({})", path, what, std::strerror(error)));
}
}  // namespace

MappedFile::MappedFile(std::string path) : path_(std::move(path)) {
  const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(path_, "cannot open file", errno);
  struct stat info {};
  if (::fstat(fd, &info) != 0) {
    const int error = errno;
    ::close(fd);
    fail(path_, "cannot read file size", error);
  }
  if (!S_ISREG(info.st_mode)) {
    ::close(fd);
    throw UserError(fmt::format("{}: not a regular file", path_));
  }
  size_ = static_cast<size_t>(info.st_size);
  if (size_ > 0) {
    void* mapped = ::mmap(nullptr, size_, PROT_READ, MAP_SHARED, fd, 0);
    if (mapped == MAP_FAILED) {
      const int error = errno;
      ::close(fd);
      fail(path_, "cannot map file into memory", error);
    }
    data_ = static_cast<const std::byte*>(mapped);
  }
  // The mapping keeps the file alive; the descriptor is no longer needed.
  ::close(fd);
}

MappedFile::~MappedFile() { release(); }

MappedFile::MappedFile(MappedFile&& other) noexcept
    : path_(std::move(other.path_)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    release();
    path_ = std::move(other.path_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

void MappedFile::release() {
  if (data_) ::munmap(const_cast<std::byte*>(data_), size_);
  data_ = nullptr;
  size_ = 0;
}

void MappedFile::advise_sequential() const {
  if (data_) ::madvise(const_cast<std::byte*>(data_), size_, MADV_SEQUENTIAL);
}

void MappedFile::advise_normal() const {
  if (data_) ::madvise(const_cast<std::byte*>(data_), size_, MADV_NORMAL);
}

}  // namespace trainer::data
