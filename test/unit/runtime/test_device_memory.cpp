// The memory check's view of a container's limit (runtime/device_memory.h): the page cache that a
// build or a data read leaves in the cgroup is room, not use.
#include <catch2/catch.hpp>

#include <filesystem>

#include "process.h"
#include "runtime/device_memory.h"

using trainer::test::TempDir;

namespace {
constexpr double kGiB = double(1ull << 30);
}

TEST_CASE("device memory: a cgroup v2 limit counts the page cache as room", "[runtime][memory]") {
  TempDir root;
  root.write("memory.max", std::to_string(int64_t(24 * kGiB)) + "\n");
  root.write("memory.current", std::to_string(int64_t(23.5 * kGiB)) + "\n");  // mostly cache, after a build
  root.write("memory.stat", "anon " + std::to_string(int64_t(2 * kGiB)) + "\nfile " + std::to_string(int64_t(21 * kGiB)) +
                                "\nactive_file " + std::to_string(int64_t(6 * kGiB)) + "\ninactive_file " +
                                std::to_string(int64_t(15 * kGiB)) + "\nshmem 0\n");
  CHECK(trainer::runtime::cgroup_memory_room(root.path()) == Approx(21.5 * kGiB));  // 24 - (23.5 - 21)
}

TEST_CASE("device memory: a cgroup v1 limit counts the page cache as room - and no limit is no number",
          "[runtime][memory]") {
  TempDir root;
  std::filesystem::create_directories(root.path() + "/memory");
  root.write("memory/memory.limit_in_bytes", std::to_string(int64_t(8 * kGiB)) + "\n");
  root.write("memory/memory.usage_in_bytes", std::to_string(int64_t(7 * kGiB)) + "\n");
  root.write("memory/memory.stat", "cache 1\ninactive_file 1\ntotal_inactive_file " + std::to_string(int64_t(3 * kGiB)) +
                                       "\ntotal_active_file " + std::to_string(int64_t(1 * kGiB)) + "\n");
  CHECK(trainer::runtime::cgroup_memory_room(root.path()) == Approx(5 * kGiB));  // 8 - (7 - 4)

  root.write("memory/memory.limit_in_bytes", "9223372036854771712\n");  // v1's "no limit"
  CHECK(trainer::runtime::cgroup_memory_room(root.path()) == -1);
  TempDir v2;
  v2.write("memory.max", "max\n");
  v2.write("memory.current", "1000\n");
  CHECK(trainer::runtime::cgroup_memory_room(v2.path()) == -1);
  TempDir empty;
  CHECK(trainer::runtime::cgroup_memory_room(empty.path()) == -1);
}
