#pragma once
// Opening files a user named (recipes, configs, checkpoints, model directories, token data): only
// regular files are read. A FIFO would block the open or the read forever, a device such as
// /dev/zero would stream forever, and a directory cannot be read; each is an error naming the path.
#include <cstddef>
#include <cstdint>
#include <string>

namespace trainer {

// Text files (JSON) larger than this are refused before reading: no recipe, config, index or
// manifest comes near it, and reading one would only exhaust memory.
inline constexpr uint64_t kMaxTextFileBytes = uint64_t(1) << 30;

// A regular file open for reading. Move-only; closes the descriptor when destroyed.
class RegularFile {
 public:
  // Opens `path` (following symbolic links) without blocking (O_NONBLOCK, so a FIFO cannot stall
  // the open) and checks with fstat that what was opened is a regular file. Throws UserError
  // "PATH: cannot open file (reason)" or "PATH: not a regular file (a FIFO)".
  explicit RegularFile(std::string path);
  ~RegularFile();
  RegularFile(RegularFile&& other) noexcept;
  RegularFile& operator=(RegularFile&& other) noexcept;
  RegularFile(const RegularFile&) = delete;
  RegularFile& operator=(const RegularFile&) = delete;

  const std::string& path() const { return path_; }
  int fd() const { return fd_; }
  // The size when opened.
  uint64_t size() const { return size_; }

  // Reads exactly `bytes` bytes at `offset` into `out`. Throws UserError naming the file when it
  // ends before (it shrank since it was opened) or the read fails.
  void read_at(uint64_t offset, void* out, size_t bytes) const;

 private:
  void release();

  std::string path_;
  int fd_ = -1;
  uint64_t size_ = 0;
};

// The whole content of the regular file `path`. Throws UserError naming it when it cannot be
// opened, is not a regular file, or holds more than `max_bytes` bytes.
std::string read_text_file(const std::string& path, uint64_t max_bytes = kMaxTextFileBytes);

// Whether `name` names an entry directly inside a directory: not empty, not "." or "..", no '/'
// and no NUL. Entries that a file we read lists (a manifest's shards, an index's weight files,
// `latest`) must pass, so that nothing outside the directory is ever opened.
bool is_plain_file_name(const std::string& name);

}  // namespace trainer
