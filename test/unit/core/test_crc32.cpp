#include <catch2/catch.hpp>

#include <string>

#include "core/crc32.h"

TEST_CASE("crc32 matches the standard check values (zlib.crc32)", "[core]") {
  const std::string check = "123456789";
  CHECK(trainer::crc32_update(0, check.data(), check.size()) == 0xCBF43926u);
  CHECK(trainer::crc32_update(0, "", 0) == 0u);
  const std::string fox = "The quick brown fox jumps over the lazy dog";
  CHECK(trainer::crc32_update(0, fox.data(), fox.size()) == 0x414FA339u);
  // Incremental equals one-shot, across the 8-byte fast path.
  uint32_t crc = trainer::crc32_update(0, fox.data(), 5);
  crc = trainer::crc32_update(crc, fox.data() + 5, fox.size() - 5);
  CHECK(crc == 0x414FA339u);
}

TEST_CASE("crc32_concat joins the checksums of consecutive pieces", "[core]") {
  const std::string fox = "The quick brown fox jumps over the lazy dog";
  for (size_t cut : {size_t(0), size_t(1), size_t(17), fox.size()}) {
    const uint32_t a = trainer::crc32_update(0, fox.data(), cut);
    const uint32_t b = trainer::crc32_update(0, fox.data() + cut, fox.size() - cut);
    CHECK(trainer::crc32_concat(a, b, fox.size() - cut) == 0x414FA339u);
  }
}
