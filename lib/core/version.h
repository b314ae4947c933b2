#pragma once
// Build identity, generated at build time by cmake/write_version.cmake.
namespace trainer {
const char* version_string();  // "0.1.0"
const char* git_commit();      // short commit, "-dirty" when the tree had changes, or "unknown"
}  // namespace trainer
