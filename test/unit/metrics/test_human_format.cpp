#include <catch2/catch.hpp>

#include <limits>

#include "metrics/human_format.h"

using namespace trainer::metrics;

TEST_CASE("bytes in binary units", "[metrics]") {
  CHECK(format_bytes(0) == "0 B");
  CHECK(format_bytes(1023) == "1023 B");
  CHECK(format_bytes(1536) == "1.5 KiB");
  CHECK(format_bytes(129394278) == "123.4 MiB");  // 123.4 * 2^20, rounded down to a byte
  CHECK(format_bytes(int64_t{80} << 30) == "80.0 GiB");
  CHECK(format_bytes(int64_t{3} << 40) == "3.0 TiB");
}

TEST_CASE("counts with decimal suffixes", "[metrics]") {
  CHECK(format_count(0) == "0");
  CHECK(format_count(950.4) == "950");
  CHECK(format_count(1234) == "1.23k");
  CHECK(format_count(12345) == "12.3k");
  CHECK(format_count(123456) == "123k");
  CHECK(format_count(4.56e6) == "4.56M");
  CHECK(format_count(1.23e9) == "1.23G");
}

TEST_CASE("durations as H:MM:SS", "[metrics]") {
  CHECK(format_duration(0) == "0:00:00");
  CHECK(format_duration(41) == "0:00:41");
  CHECK(format_duration(40.6) == "0:00:41");
  CHECK(format_duration(3600 + 62) == "1:01:02");
  CHECK(format_duration(27 * 3600 + 2 * 60 + 9) == "27:02:09");
  CHECK(format_duration(-1) == "-");
  CHECK(format_duration(std::numeric_limits<double>::infinity()) == "-");
}
