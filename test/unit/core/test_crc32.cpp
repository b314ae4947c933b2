#include <catch2/catch.hpp>

#include <string>

#include "core/crc32.h"

TEST_CASE("crc32 matches the standard check values (zlib.crc32)", "[core]") {
  const std::string check = "123456789";
  CHECK(trainer::crc32_update(0, check.data(), check.size()) == 0xCBF43926u);
  CHECK(trainer::crc32_update(0, "", 0) == 0u);
  const std::string fox = "The quick brown fox jumps over the lazy dog";
  CHECK(trainer::crc32_update(0, fox.data(), fox.size()) == 0x414FA339u);
  // Incremental equals one-shot.
  uint32_t crc = trainer::crc32_update(0, fox.data(), 5);
  crc = trainer::crc32_update(crc, fox.data() + 5, fox.size() - 5);
  CHECK(crc == 0x414FA339u);
}
