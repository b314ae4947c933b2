#include "checkpoint/dir_check.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <vector>

#include "core/error.h"

namespace trainer::checkpoint {

namespace fs = std::filesystem;

void check_checkpoint_dir(const std::string& dir, int64_t rank, uint64_t bytes_needed) {
  auto fail = [&](const std::string& why) {
    throw UserError(fmt::format("checkpoint.dir {}: {}; choose a directory this job can write (or drop "
                                "checkpoint.dir to train without checkpoints)",
                                dir, why));
  };
  std::error_code error;
  fs::create_directories(dir, error);
  if (error) fail(fmt::format("cannot be created ({})", error.message()));
  if (!fs::is_directory(dir, error)) fail("exists but is not a directory");

  const std::string probe = (fs::path(dir) / fmt::format(".write-test-rank{}-{}", rank, ::getpid())).string();
  const int fd = ::open(probe.c_str(), O_CREAT | O_WRONLY | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail(fmt::format("cannot create a file in it ({})", std::strerror(errno)));
  const std::vector<char> block(4096, 0);
  const bool written = ::write(fd, block.data(), block.size()) == ssize_t(block.size()) && ::fsync(fd) == 0;
  const int write_errno = errno;
  ::close(fd);
  ::unlink(probe.c_str());
  if (!written) fail(fmt::format("writing a test file failed ({})", std::strerror(write_errno)));

  struct statvfs stats {};
  if (bytes_needed > 0 && ::statvfs(dir.c_str(), &stats) == 0) {
    const uint64_t free_bytes = uint64_t(stats.f_bavail) * uint64_t(stats.f_frsize);
    if (free_bytes < bytes_needed)
      fail(fmt::format("{:.1f} MiB free, but a checkpoint needs about {:.1f} MiB here", double(free_bytes) / 1048576.0,
                       double(bytes_needed) / 1048576.0));
  }
}

}  // namespace trainer::checkpoint
