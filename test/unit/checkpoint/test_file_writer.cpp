// FileWriter: the bytes on disk are the pieces in order, the size and CRC-32 match a reread,
// across staging-buffer boundaries and on both the O_DIRECT and the page-cache path (the one taken
// where a file system refuses O_DIRECT).
#include <ATen/ATen.h>
#include <catch2/catch.hpp>

#include <filesystem>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "checkpoint/file_writer.h"
#include "core/crc32.h"
#include "process.h"

using namespace trainer;

TEST_CASE("FileWriter writes the pieces in order with the right size and CRC-32", "[checkpoint]") {
  test::TempDir dir;
  // 40 MiB + odd sizes: crosses the 16 MiB staging buffers and ends mid-block.
  const at::Tensor big = at::randint(0, 255, {40 << 20}, at::kByte);
  const std::string a = "header", b(4093, 'x');
  const at::Tensor tail = at::randint(0, 255, {12345}, at::kByte);
  const std::vector<checkpoint::FileWriter::Piece> pieces = {
      {a.data(), a.size()}, {big.data_ptr(), size_t(big.numel())}, {b.data(), b.size()}, {tail.data_ptr(), size_t(tail.numel())}};
  std::string expected = a;
  expected.append(static_cast<const char*>(big.data_ptr()), size_t(big.numel()));
  expected += b;
  expected.append(static_cast<const char*>(tail.data_ptr()), size_t(tail.numel()));

  const bool direct = GENERATE(true, false);
  checkpoint::FileWriter writer(direct);
  // The second write reuses the staging buffers; a shorter file after a longer one must not keep the old tail.
  for (const std::string name : {"one.bin", "two.bin"}) {
    const std::string path = dir.path() + "/" + name;
    const FileChecksum sum = writer.write(path, pieces);
    CHECK(sum.bytes == expected.size());
    const FileChecksum reread = checksum_file(path);
    CHECK(reread.bytes == expected.size());
    CHECK(reread.crc32 == sum.crc32);
    CHECK(test::read_file(path) == expected);
  }
  const std::string path = dir.path() + "/one.bin";
  writer.write(path, {{a.data(), a.size()}});
  CHECK(test::read_file(path) == a);
  if (!direct) CHECK_FALSE(writer.last_was_direct());
}

TEST_CASE("FileWriter names the file when it cannot be created", "[checkpoint]") {
  test::TempDir dir;
  checkpoint::FileWriter writer;
  const std::string path = dir.path() + "/missing/x.bin";
  try {
    writer.write(path, {{"x", 1}});
    FAIL("no error");
  } catch (const std::runtime_error& e) {
    CHECK(std::string(e.what()).find(path) != std::string::npos);
  }
}

TEST_CASE("FileWriter writes an aligned image as it is", "[checkpoint]") {
  test::TempDir dir;
  const bool direct = GENERATE(true, false);
  const size_t size = (5 << 20) + 1234, room = (size + 4095) / 4096 * 4096;
  void* image = nullptr;
  REQUIRE(::posix_memalign(&image, checkpoint::FileWriter::kAlignment, room) == 0);
  const at::Tensor bytes = at::randint(0, 255, {int64_t(size)}, at::kByte);
  std::memcpy(image, bytes.data_ptr(), size);
  checkpoint::FileWriter writer(direct);
  const std::string path = dir.path() + "/image.bin";
  const FileChecksum sum = writer.write_aligned(path, image, size);
  if (!direct) CHECK_FALSE(writer.last_was_direct());
  CHECK(sum.bytes == size);
  CHECK(sum.crc32 == crc32_update(0, bytes.data_ptr(), size));
  CHECK(test::read_file(path) == std::string(static_cast<const char*>(bytes.data_ptr()), size));
  std::free(image);
}
