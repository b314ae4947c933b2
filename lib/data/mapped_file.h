#pragma once
// A file mapped read-only into memory. Token files are read through the page cache: opening is
// instant whatever their size, only the pages that samples touch are read, and every thread and
// every process on a node shares one copy.
#include <cstddef>
#include <cstdint>
#include <string>

namespace trainer::data {

class MappedFile {
 public:
  // Maps the whole file. Throws UserError "PATH: cannot open file (reason)" when it cannot, and
  // "PATH: not a regular file (a FIFO)" for anything but a regular file (never blocks on a FIFO).
  explicit MappedFile(std::string path);
  ~MappedFile();
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::string& path() const { return path_; }
  const std::byte* data() const { return data_; }  // page-aligned; nullptr when the file is empty
  size_t size() const { return size_; }

  // Hints that the whole file is about to be read in order (the validation scan), and that the
  // scan is over (samples then read scattered windows).
  void advise_sequential() const;
  void advise_normal() const;

 private:
  void release();

  std::string path_;
  const std::byte* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace trainer::data
