// Documents inside a sample (data.document_masking): cut after separator tokens, or at the
// document index of trainer's and Megatron's formats (the same starts from either), and refused
// with the key to set where the data has neither.
#include <catch2/catch.hpp>

#include <set>

#include "data/dataset.h"
#include "data/documents.h"
#include "data/llmc_shards.h"
#include "data/megatron_file.h"
#include "data/token_dataset.h"
#include "data/token_file.h"
#include "data/token_source.h"
#include "data_fixture.h"
#include "process.h"

using namespace trainer::data;
using namespace trainer::data::test;
using trainer::test::TempDir;

TEST_CASE("documents: a separator ends its document - the token after it starts the next", "[data][documents]") {
  const std::vector<int32_t> tokens = {5, 9, 7, 9, 9, 3};
  const SampleDocuments d = sample_documents(tokens.data(), int64_t(tokens.size()), {}, 9);
  CHECK(d.document == std::vector<int32_t>{0, 0, 1, 1, 2, 3});
  CHECK(d.position == std::vector<int32_t>{0, 1, 0, 1, 0, 0});
  // From a document index: starts at 2 and 3 (a start at 0 is the sample's own first document).
  const SampleDocuments e = sample_documents(tokens.data(), int64_t(tokens.size()), {0, 2, 3}, std::nullopt);
  CHECK(e.document == std::vector<int32_t>{0, 0, 1, 2, 2, 2});
  CHECK(e.position == std::vector<int32_t>{0, 1, 0, 0, 1, 2});
}

TEST_CASE("documents: trainer's and Megatron's document indexes give every window the same starts", "[data][documents]") {
  TempDir dir;
  // Token ids are their offsets, so a sample's tokens say where it lies; an empty document too.
  const std::vector<int> lengths = {3, 1, 5, 0, 2, 7, 1, 4};
  const auto documents = counting_documents(lengths);
  std::set<int32_t> starts;
  int32_t offset = 0;
  for (int n : lengths) {
    starts.insert(offset);
    offset += n;
  }
  write_token_files(dir.path() + "/t", documents, 65536);
  write_megatron_files(dir.path() + "/m", documents, false);
  std::vector<std::unique_ptr<TokenSource>> trainer_source, megatron_source;
  trainer_source.push_back(std::make_unique<TokenFile>(TokenFile::open(dir.path() + "/t", 65536)));
  megatron_source.push_back(std::make_unique<MegatronFile>(MegatronFile::open(dir.path() + "/m", 65536)));
  const TokenDataset trainer_data(std::move(trainer_source), {}, 3), megatron_data(std::move(megatron_source), {}, 3);
  const int64_t seq_len = 5;
  for (uint64_t i = 0; i < 8; ++i) {
    std::vector<int32_t> tokens(seq_len + 1);
    trainer_data.sample(i, seq_len, tokens.data());
    std::vector<int64_t> expected;
    for (int64_t p = 1; p <= seq_len; ++p)
      if (starts.count(tokens[size_t(p)])) expected.push_back(p);
    INFO("sample " << i << " from token " << tokens[0]);
    CHECK(trainer_data.document_starts(i, seq_len) == expected);
    CHECK(megatron_data.document_starts(i, seq_len) == expected);
  }
}

TEST_CASE("documents: masking without a document index or a separator is refused naming the key", "[data][documents]") {
  TempDir dir;
  write_llmc_shard(dir.path() + "/train_000.bin", {1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, false);
  trainer::recipe::Recipe recipe;
  recipe.model.vocab_size = 256;
  recipe.training.seq_len = 4;
  recipe.data.source = trainer::recipe::DataSource::Tokens;
  recipe.data.paths = {dir.path() + "/train_000.bin"};
  recipe.data.document_masking = true;
  const std::string message = user_error_of([&] { open_dataset(recipe); });
  CHECK(message.find("train_000.bin") != std::string::npos);
  CHECK(message.find("data.document_separator_token") != std::string::npos);
  // With a separator the shard opens; it has no index of its own.
  recipe.data.document_separator_token = 5;
  const auto data = open_dataset(recipe);
  CHECK(!data->document_starts(0, 4).has_value());
}
