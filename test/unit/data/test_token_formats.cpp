// Megatron-LM indexed datasets, llm.c shards and format detection: the tokens read back, and every
// kind of damage reported naming the file, what was found and what was expected.
#include <catch2/catch.hpp>

#include "data/llmc_shards.h"
#include "data/megatron_file.h"
#include "data/token_source.h"
#include "data_fixture.h"
#include "process.h"

using namespace trainer::data;
using namespace trainer::data::test;
using trainer::test::TempDir;

TEST_CASE("data: Megatron indexed datasets read back as uint16 and int32", "[data]") {
  TempDir dir;
  const auto documents = counting_documents({5, 1, 0, 7}, 3);
  for (bool uint16 : {true, false}) {
    const std::string prefix = dir.path() + (uint16 ? "/m16" : "/m32");
    write_megatron_files(prefix, documents, uint16);
    const MegatronFile file = MegatronFile::open(prefix, 100);
    CHECK(file.format() == "megatron");
    CHECK(file.token_type() == (uint16 ? "uint16" : "int32"));
    CHECK(file.token_count() == 13);
    CHECK(file.documents() == 4u);
    CHECK(file.sequence_count() == 4);
    CHECK(file.max_token_id() == 15);
    CHECK(all_tokens(file) == flatten(documents));
    // Detected from the index's magic, through the prefix or either file.
    for (const std::string& path : {prefix, prefix + ".bin", prefix + ".idx"})
      CHECK(open_token_source(path, trainer::recipe::DataFormat::Auto, 100)->format() == "megatron");
  }
}

TEST_CASE("data: damaged Megatron files are errors naming the file", "[data]") {
  TempDir dir;
  const std::string prefix = dir.path() + "/m";
  auto fresh = [&] { write_megatron_files(prefix, counting_documents({4, 6}), false); };
  auto error = [&](int64_t vocab = 100) { return user_error_of([&] { MegatronFile::open(prefix, vocab); }); };
  const std::string idx = prefix + ".idx", bin = prefix + ".bin";
  // Header: 9 magic, 8 version, 1 dtype code, 8 sequences, 8 document indices = 34 bytes.
  fresh();
  patch<char>(idx, 0, 'X');
  CHECK_THAT(error(), Catch::Contains(idx + ": not a Megatron-LM index"));
  fresh();
  patch<uint64_t>(idx, 9, 2);
  CHECK_THAT(error(), Catch::Contains("Megatron index version 2 is not supported (this build reads version 1)"));
  fresh();
  patch<uint8_t>(idx, 17, 6);
  CHECK_THAT(error(), Catch::Contains("dtype code 6 (float64) holds no token ids"));
  fresh();
  resize(idx, 40);
  CHECK_THAT(error(), Catch::Contains(idx + ": 40 bytes, but 2 sequences and 3 document indices take"));
  fresh();
  resize(bin, 30);
  CHECK_THAT(error(), Catch::Contains(bin + ": 30 bytes, but its index " + idx + " lists 10 tokens of int32 (40 bytes)"));
  fresh();
  patch<int64_t>(idx, 34 + 2 * 4 + 8, 20);  // the second sequence's pointer
  CHECK_THAT(error(), Catch::Contains("sequence 1 starts at byte 20 of the .bin, but the sequences before it end at "
                                      "byte 16"));
  fresh();
  patch<int32_t>(bin, 4 * 7, 100);
  CHECK_THAT(error(), Catch::Contains(bin + ": token 7 is 100, outside the model's vocabulary [0, 100)"));
  // Sequence modes (multimodal datasets): text only (0) is read, anything else refused.
  fresh();
  { std::ofstream(idx, std::ios::app | std::ios::binary).write("\0\1", 2); }
  CHECK_THAT(error(), Catch::Contains("sequence 1 has mode 1: a multimodal dataset"));
  fresh();
  { std::ofstream(idx, std::ios::app | std::ios::binary).write("\0\0", 2); }
  CHECK(error().empty());
}

TEST_CASE("data: llm.c shards read back - one source across several files", "[data]") {
  TempDir dir;
  write_llmc_shard(dir.path() + "/train_000.bin", {1, 2, 3, 4}, false);
  write_llmc_shard(dir.path() + "/train_001.bin", {5, 6, 7}, false);
  const auto source = open_token_source(dir.path() + "/train_*.bin", trainer::recipe::DataFormat::Auto, 256);
  CHECK(source->format() == "llmc");
  CHECK(source->token_type() == "uint16");
  CHECK(source->token_count() == 7);
  CHECK_FALSE(source->documents());
  CHECK(source->max_token_id() == 7);
  CHECK(all_tokens(*source) == std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7});
  std::vector<int32_t> across(4);
  source->read(2, 4, across.data());  // a window that crosses from one shard into the next
  CHECK(across == std::vector<int32_t>{3, 4, 5, 6});
  write_llmc_shard(dir.path() + "/llama.bin", {70000, 1}, true);
  const auto wide = open_token_source(dir.path() + "/llama.bin", trainer::recipe::DataFormat::Auto, 128256);
  CHECK(wide->token_type() == "uint32");
  CHECK(all_tokens(*wide) == std::vector<int32_t>{70000, 1});
}

TEST_CASE("data: damaged llm.c shards are errors naming the file", "[data]") {
  TempDir dir;
  const std::string shard = dir.path() + "/s.bin";
  auto fresh = [&] { write_llmc_shard(shard, {1, 2, 3}, false); };
  auto error = [&](const std::string& path, int64_t vocab = 256) {
    return user_error_of([&] { open_token_source(path, trainer::recipe::DataFormat::Llmc, vocab); });
  };
  fresh();
  patch<int32_t>(shard, 0, 12345);
  CHECK_THAT(error(shard), Catch::Contains(shard + ": not an llm.c shard: magic 12345 where 20240520 (uint16 tokens) "
                                                   "or 20240801 (uint32 tokens) is expected"));
  fresh();
  patch<int32_t>(shard, 4, 3);
  CHECK_THAT(error(shard), Catch::Contains("llm.c shard version 3 with magic 20240520 is not supported; expected version 1"));
  fresh();
  resize(shard, 1024 + 4);
  CHECK_THAT(error(shard), Catch::Contains("1028 bytes, but the header promises 3 tokens of 2 bytes after the 1024-byte "
                                           "header (1030 bytes): truncated or oversized"));
  fresh();
  resize(shard, 1024 + 8);
  CHECK_THAT(error(shard), Catch::Contains("truncated or oversized"));
  fresh();
  resize(shard, 100);
  CHECK_THAT(error(shard), Catch::Contains("truncated: 100 bytes, shorter than the 1024-byte header"));
  fresh();
  CHECK_THAT(error(shard, 3), Catch::Contains(shard + ": token 2 is 3, outside the model's vocabulary [0, 3)"));
  write_llmc_shard(dir.path() + "/mix_0.bin", {1}, false);
  write_llmc_shard(dir.path() + "/mix_1.bin", {1}, true);
  CHECK_THAT(error(dir.path() + "/mix_*.bin"), Catch::Contains("one source needs one token width"));
  CHECK_THAT(error(dir.path() + "/none_*.bin"), Catch::Contains(dir.path() + "/none_*.bin: no file matches this pattern"));
}

TEST_CASE("data: format detection names what it found", "[data]") {
  TempDir dir;
  const std::string other = dir.write("other.bin", "hello, this is text and no token file");
  CHECK_THAT(user_error_of([&] { open_token_source(other, trainer::recipe::DataFormat::Auto, 256); }),
             Catch::Contains(other + ": not a known token file: it starts with \"hello, t\""));
  CHECK_THAT(user_error_of([&] { open_token_source(dir.path() + "/missing", trainer::recipe::DataFormat::Auto, 256); }),
             Catch::Contains(dir.path() + "/missing: no such file, and no " + dir.path() + "/missing.bin and"));
  dir.write("odd.bin", "x");
  dir.write("odd.idx", "NOTANIDX!");
  CHECK_THAT(user_error_of([&] { open_token_source(dir.path() + "/odd", trainer::recipe::DataFormat::Auto, 256); }),
             Catch::Contains("odd.idx: starts with \"NOTANIDX!\", neither trainer's"));
  write_token_files(dir.path() + "/ours", {{1, 2, 3}}, 256);
  CHECK(open_token_source(dir.path() + "/ours", trainer::recipe::DataFormat::Auto, 256)->format() == "trainer");
  // A forced format reads the files as that format (and says what is wrong with them).
  CHECK_THAT(user_error_of([&] { open_token_source(dir.path() + "/ours", trainer::recipe::DataFormat::Megatron, 256); }),
             Catch::Contains("not a Megatron-LM index"));
}
