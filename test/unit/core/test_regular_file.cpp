#include <catch2/catch.hpp>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>

#include "core/error.h"
#include "core/json_file.h"
#include "core/regular_file.h"
#include "process.h"

using trainer::UserError;
using trainer::test::TempDir;

namespace {
std::string error_of_read(const std::string& path, uint64_t max_bytes = trainer::kMaxTextFileBytes) {
  try {
    trainer::read_text_file(path, max_bytes);
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST_CASE("read_text_file reads a regular file whole", "[core]") {
  TempDir dir;
  const std::string path = dir.write("a.json", "{\"a\": 1}\n");
  CHECK(trainer::read_text_file(path) == "{\"a\": 1}\n");
  CHECK(trainer::read_text_file(dir.write("empty", "")).empty());
}

TEST_CASE("a FIFO in place of a file is refused at once - never a hang", "[core]") {
  TempDir dir;
  const std::string fifo = dir.path() + "/config.json";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  const auto start = std::chrono::steady_clock::now();
  CHECK(error_of_read(fifo) == fifo + ": not a regular file (a FIFO); expected a file");
  CHECK_THROWS_AS(trainer::read_json_file(fifo), UserError);
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(5));
}

TEST_CASE("devices directories and links to them are refused naming the path", "[core]") {
  TempDir dir;
  CHECK(error_of_read("/dev/zero") == "/dev/zero: not a regular file (a character device); expected a file");
  CHECK(error_of_read(dir.path()).find(dir.path() + ": not a regular file (a directory)") == 0);
  const std::string link = dir.path() + "/model.safetensors";
  std::filesystem::create_symlink("/dev/zero", link);
  CHECK(error_of_read(link) == link + ": not a regular file (a character device); expected a file");
  CHECK(error_of_read(dir.path() + "/missing").find(dir.path() + "/missing: cannot open file (") == 0);
  // A link to a regular file is that file.
  const std::string target = dir.write("target", "x");
  std::filesystem::create_symlink(target, dir.path() + "/to_target");
  CHECK(trainer::read_text_file(dir.path() + "/to_target") == "x");
}

TEST_CASE("text files over the size limit are refused before reading", "[core]") {
  TempDir dir;
  const std::string path = dir.write("big.json", std::string(100, ' '));
  CHECK(error_of_read(path, 99) == path + ": 100 bytes, more than the 99 bytes a text file read by trainer may hold");
  CHECK(error_of_read(path, 100).empty());
}

TEST_CASE("RegularFile reads ranges and reports a short file", "[core]") {
  TempDir dir;
  const trainer::RegularFile file(dir.write("data", "0123456789"));
  CHECK(file.size() == 10);
  char buffer[4] = {};
  file.read_at(3, buffer, 4);
  CHECK(std::string(buffer, 4) == "3456");
  CHECK_THROWS_AS(file.read_at(8, buffer, 4), UserError);
}

TEST_CASE("plain file names stay inside their directory", "[core]") {
  using trainer::is_plain_file_name;
  CHECK(is_plain_file_name("model-00001-of-00002.safetensors"));
  CHECK(is_plain_file_name("..hidden"));
  CHECK(is_plain_file_name("a..b"));
  CHECK_FALSE(is_plain_file_name(""));
  CHECK_FALSE(is_plain_file_name("."));
  CHECK_FALSE(is_plain_file_name(".."));
  CHECK_FALSE(is_plain_file_name("/etc/passwd"));
  CHECK_FALSE(is_plain_file_name("../x"));
  CHECK_FALSE(is_plain_file_name("sub/x"));
  CHECK_FALSE(is_plain_file_name("x/"));
  CHECK_FALSE(is_plain_file_name(std::string("a\0b", 3)));
}
