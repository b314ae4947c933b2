#include <catch2/catch.hpp>

#include "data/token_file.h"
#include "data_fixture.h"
#include "process.h"

using trainer::data::TokenFile;
using trainer::data::write_token_files;
using trainer::test::read_file;
using trainer::test::TempDir;
using namespace trainer::data::test;

TEST_CASE("data: token files round trip as uint16", "[data]") {
  TempDir dir;
  const std::string prefix = dir.path() + "/small";
  const std::vector<std::vector<int32_t>> documents = {{5, 6, 7}, {}, {255, 0}, {65535 % 300, 299}};
  write_token_files(prefix, documents, 300);
  const TokenFile file = TokenFile::open(prefix, 300);
  CHECK(file.prefix() == prefix);
  CHECK(file.token_bytes() == 2);
  CHECK(file.token_count() == 7);
  CHECK(file.document_count() == 4);
  CHECK(file.max_token_id() == 299);
  CHECK(all_tokens(file) == flatten(documents));
  std::vector<uint64_t> offsets;
  for (uint64_t d = 0; d <= file.document_count(); ++d) offsets.push_back(file.document_offset(d));
  CHECK(offsets == std::vector<uint64_t>{0, 3, 3, 5, 7});
  // The layout is the documented one: a 32-byte header, then 2 bytes per token.
  CHECK(read_file(prefix + ".bin").size() == 32 + 7 * 2);
  CHECK(read_file(prefix + ".idx").size() == 32 + 5 * 8);
  CHECK(read_file(prefix + ".bin").substr(0, 8) == "TRAINTOK");
  CHECK(read_file(prefix + ".idx").substr(0, 8) == "TRAINIDX");
  // A window in the middle.
  std::vector<int32_t> window(3);
  file.read(2, 3, window.data());
  CHECK(window == std::vector<int32_t>{7, 255, 0});
}

TEST_CASE("data: token files round trip as uint32 for vocabularies over 65536", "[data]") {
  TempDir dir;
  const std::string prefix = dir.path() + "/big";
  const std::vector<std::vector<int32_t>> documents = {{0, 65535, 65536, 151935}, {7}};
  write_token_files(prefix, documents, 151936);
  const TokenFile file = TokenFile::open(prefix, 151936);
  CHECK(file.token_bytes() == 4);
  CHECK(file.max_token_id() == 151935);
  CHECK(all_tokens(file) == flatten(documents));
  CHECK(read_file(prefix + ".bin").size() == 32 + 5 * 4);
}

TEST_CASE("data: the writer rejects ids outside the vocabulary", "[data]") {
  TempDir dir;
  CHECK_THROWS_AS(write_token_files(dir.path() + "/x", {{1, 256}}, 256), std::invalid_argument);
  CHECK_THROWS_AS(write_token_files(dir.path() + "/x", {{-1}}, 256), std::invalid_argument);
}

TEST_CASE("data: damaged token files are user errors naming the file and the problem", "[data]") {
  TempDir dir;
  const std::string prefix = dir.path() + "/corpus";
  const std::string bin = prefix + ".bin", idx = prefix + ".idx";
  write_token_files(prefix, counting_documents({40, 60}), 256);  // ids 0..99
  REQUIRE(user_error_of([&] { TokenFile::open(prefix, 256); }).empty());
  const std::string good_bin = read_file(bin), good_idx = read_file(idx);
  auto restore = [&] {
    dir.write("corpus.bin", good_bin);
    dir.write("corpus.idx", good_idx);
  };
  auto open_error = [&](int64_t vocab = 256) { return user_error_of([&] { TokenFile::open(prefix, vocab); }); };
  using Catch::Matchers::Contains;
  using Catch::Matchers::StartsWith;

  SECTION("missing .bin") {
    std::filesystem::remove(bin);
    CHECK_THAT(open_error(), StartsWith(bin + ": cannot open file"));
  }
  SECTION("missing .idx") {
    std::filesystem::remove(idx);
    CHECK_THAT(open_error(), StartsWith(idx + ": cannot open file"));
  }
  SECTION("empty .bin") {
    resize(bin, 0);
    CHECK_THAT(open_error(), StartsWith(bin + ": truncated: 0 bytes, shorter than the 32-byte header"));
  }
  SECTION("truncated .bin") {
    resize(bin, good_bin.size() - 1);
    CHECK(open_error() == bin + ": truncated: the header says 100 tokens of 2 bytes (32 + 100 x 2 bytes) but the file "
                                "has 231 bytes");
  }
  SECTION("trailing bytes in .bin") {
    dir.write("corpus.bin", good_bin + "xy");
    CHECK_THAT(open_error(), StartsWith(bin + ": has trailing bytes"));
  }
  SECTION("wrong magic in .bin") {
    dir.write("corpus.bin", "GPT2TOKS" + good_bin.substr(8));
    CHECK_THAT(open_error(), StartsWith(bin + ": not a token (.bin) file: it starts with \"GPT2TOKS\" where "
                                              "\"TRAINTOK\" is expected"));
  }
  SECTION("a .bin given as the .idx") {
    dir.write("corpus.idx", good_bin);
    CHECK_THAT(open_error(), StartsWith(idx + ": not a document index (.idx) file"));
  }
  SECTION("wrong version") {
    patch<uint32_t>(bin, 8, 2);
    CHECK(open_error() == bin + ": format version 2 is not supported (this build reads version 1)");
  }
  SECTION("impossible token width") {
    patch<uint32_t>(bin, 12, 3);
    CHECK_THAT(open_error(), StartsWith(bin + ": header says 3 bytes per token"));
  }
  SECTION("token ids beyond the vocabulary, by the header") {
    CHECK_THAT(open_error(64), StartsWith(bin + ": holds token ids up to 99 (header), outside the vocabulary of "
                                                "model.vocab_size=64"));
  }
  SECTION("a token beyond the vocabulary that the header hides") {
    patch<uint16_t>(bin, 32 + 2 * 17, 300);
    CHECK(open_error() == bin + ": token id 300 at position 17 is outside the vocabulary of model.vocab_size=256 "
                                "(the header claims the largest id is 99; the file is corrupt)");
  }
  SECTION("a header whose largest id is wrong") {
    patch<uint64_t>(bin, 24, 120);
    CHECK(open_error() == bin + ": corrupt: the header says the largest token id is 120 but the tokens' largest is 99");
  }
  SECTION("truncated .idx") {
    resize(idx, good_idx.size() - 8);
    CHECK_THAT(open_error(), StartsWith(idx + ": truncated: the header says 2 documents"));
  }
  SECTION(".idx of another dataset") {
    patch<uint64_t>(idx, 24, 99);
    CHECK_THAT(open_error(), StartsWith(idx + ": indexes 99 tokens but " + bin + " holds 100"));
  }
  SECTION("document offset out of range") {
    patch<uint64_t>(idx, 32 + 8, 1000);
    CHECK(open_error() == idx + ": document offset 1 is 1000, out of range (after 0, at most the token count 100)");
  }
  SECTION("document offsets out of order") {
    patch<uint64_t>(idx, 32 + 8, 50);
    patch<uint64_t>(idx, 32 + 16, 20);
    CHECK_THAT(open_error(), StartsWith(idx + ": document offset 2 is 20, out of range"));
  }
  SECTION("first offset not zero") {
    patch<uint64_t>(idx, 32, 1);
    CHECK_THAT(open_error(), StartsWith(idx + ": document offset 0 is 1"));
  }
  SECTION("last document ends early") {
    patch<uint64_t>(idx, 32 + 16, 90);
    CHECK(open_error() == idx + ": the last document ends at 90 but " + bin + " holds 100 tokens");
  }
  restore();
  CHECK(open_error().empty());
}
