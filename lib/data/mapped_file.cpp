#include "data/mapped_file.h"

#include <fmt/format.h>
#include <sys/mman.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "core/error.h"
#include "core/regular_file.h"

namespace trainer::data {

MappedFile::MappedFile(std::string path) : path_(std::move(path)) {
  // Only a regular file: a FIFO would block, a device such as /dev/zero has no size to map.
  const RegularFile file(path_);
  size_ = static_cast<size_t>(file.size());
  if (size_ > 0) {
    void* mapped = ::mmap(nullptr, size_, PROT_READ, MAP_SHARED, file.fd(), 0);
    if (mapped == MAP_FAILED)
      throw UserError(fmt::format("{}: cannot map file into memory ({})", path_, std::strerror(errno)));
    data_ = static_cast<const std::byte*>(mapped);
  }
  // The mapping keeps the file alive; the descriptor closes with `file`.
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
