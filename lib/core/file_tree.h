#pragma once
// Removing a directory tree. Programs linked with the libtorch wheel must not call
// std::filesystem::remove_all: the wheel exports its own copy of libstdc++'s filesystem code
// (pytorch/pytorch#133437) and that remove_all crashes. This uses POSIX nftw instead.
#include <string>

namespace trainer {

// Deletes `path` and everything below it (symlinks are removed, not followed). A missing path is
// not an error. Throws std::runtime_error naming the entry that could not be removed.
void remove_tree(const std::string& path);

}  // namespace trainer
