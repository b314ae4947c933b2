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

#include "core/crc32c.h"

TEST_CASE("crc32c matches the Castagnoli check values - masked as TFRecord masks it", "[core]") {
  const std::string check = "123456789";
  CHECK(trainer::crc32c(check.data(), check.size()) == 0xE3069283u);
  CHECK(trainer::crc32c("", 0) == 0u);
  // RFC 3720 (iSCSI) test vector: 32 bytes of zeros.
  const std::string zeros(32, '\0');
  CHECK(trainer::crc32c(zeros.data(), zeros.size()) == 0x8A9136AAu);
  // TFRecord's mask: rotate right by 15 bits, add 0xa282ead8.
  const uint32_t crc = 0xE3069283u;
  CHECK(trainer::masked_crc32c(check.data(), check.size()) == uint32_t(((crc >> 15) | (crc << 17)) + 0xa282ead8u));
}
