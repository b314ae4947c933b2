#include "core/file_tree.h"

#include <fmt/format.h>
#include <ftw.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <sys/stat.h>

namespace trainer {

namespace {
int remove_entry(const char* path, const struct stat*, int type, struct FTW*) {
  const int rc = (type == FTW_DP) ? ::rmdir(path) : ::unlink(path);
  return rc == 0 || errno == ENOENT ? 0 : -1;
}
}  // namespace

void remove_tree(const std::string& path) {
  struct stat info;
  if (::lstat(path.c_str(), &info) != 0) {
    if (errno == ENOENT) return;
    throw std::runtime_error(fmt::format("{}: cannot remove: {}", path, std::strerror(errno)));
  }
  if (::nftw(path.c_str(), remove_entry, 32, FTW_DEPTH | FTW_PHYS) != 0)
    throw std::runtime_error(fmt::format("{}: cannot remove: {}", path, std::strerror(errno)));
}

}  // namespace trainer
