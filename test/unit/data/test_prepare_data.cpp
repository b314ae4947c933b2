#include <catch2/catch.hpp>

#include "data/token_file.h"
#include "data_fixture.h"
#include "process.h"

using trainer::data::TokenFile;
using trainer::data::write_token_files;
using trainer::test::read_file;
using trainer::test::run_process;
using trainer::test::source_dir;
using trainer::test::TempDir;

namespace {
// scripts/prepare_data through python3 from PATH (run_process does not search PATH itself).
trainer::test::ProcessResult prepare_data(std::vector<std::string> args) {
  std::vector<std::string> argv = {"/usr/bin/env", "python3", source_dir() + "/scripts/prepare_data"};
  argv.insert(argv.end(), args.begin(), args.end());
  return run_process(argv, 60);
}

std::vector<int32_t> all_tokens(const TokenFile& file) {
  std::vector<int32_t> out(file.token_count());
  file.read(0, file.token_count(), out.data());
  return out;
}

std::vector<int32_t> bytes_of(const std::string& text) {
  std::vector<int32_t> out;
  for (unsigned char c : text) out.push_back(c);
  return out;
}

bool python_has(const std::string& module) {
  return run_process({"/usr/bin/env", "python3", "-c", "import " + module}, 60).exit_code == 0;
}
}  // namespace

TEST_CASE("data: prepare_data with the byte tokenizer writes each file's bytes as a document", "[data]") {
  TempDir dir;
  const std::string first = "hello, world\n", second = "caf\xc3\xa9 \xff\x00 end";  // UTF-8, a stray byte, a NUL
  const std::string a = dir.write("a.txt", first), b = dir.write("b.txt", std::string(second.data(), second.size()));
  const std::string prefix = dir.path() + "/out";
  const auto result = prepare_data({"--out", prefix, a, b});
  INFO(result.out << result.err);
  REQUIRE(result.exit_code == 0);
  const size_t tokens = first.size() + second.size();
  CHECK(result.out == "wrote " + prefix + ".bin and " + prefix + ".idx: " + std::to_string(tokens) +
                          " tokens, 2 documents, max token id 255 (uint16, tokenizer byte, vocab 256)\n");

  const TokenFile file = TokenFile::open(prefix, 256);
  CHECK(file.document_count() == 2);
  CHECK(file.document_offset(1) == first.size());
  CHECK(all_tokens(file) == bytes_of(first + second));

  // The C++ writer and the script agree byte for byte: one format, two writers.
  write_token_files(dir.path() + "/cpp", {bytes_of(first), bytes_of(second)}, 256);
  CHECK(read_file(dir.path() + "/cpp.bin") == read_file(prefix + ".bin"));
  CHECK(read_file(dir.path() + "/cpp.idx") == read_file(prefix + ".idx"));
}

TEST_CASE("data: prepare_data --split-lines makes a document of each non-empty line", "[data]") {
  TempDir dir;
  const std::string text = dir.write("lines.txt", "one\r\ntwo\n\nthree");
  const auto result = prepare_data({"--out", dir.path() + "/lines", "--split-lines", "--eos", "256", text});
  INFO(result.out << result.err);
  REQUIRE(result.exit_code == 0);
  CHECK_THAT(result.out, Catch::Matchers::Contains("14 tokens, 3 documents, max token id 256 (uint16, tokenizer "
                                                   "byte, vocab 257)"));
  const TokenFile file = TokenFile::open(dir.path() + "/lines", 257);
  auto expected = bytes_of("one");
  expected.push_back(256);
  for (int32_t t : bytes_of("two")) expected.push_back(t);
  expected.push_back(256);
  for (int32_t t : bytes_of("three")) expected.push_back(t);
  expected.push_back(256);
  CHECK(all_tokens(file) == expected);
  CHECK(file.document_offset(1) == 4);
  CHECK(file.document_offset(2) == 8);
}

TEST_CASE("data: prepare_data reports bad input with exit code 2", "[data]") {
  TempDir dir;
  const std::string text = dir.write("t.txt", "x");
  auto missing = prepare_data({"--out", dir.path() + "/o", dir.path() + "/nope.txt"});
  CHECK(missing.exit_code == 2);
  CHECK(missing.err == "prepare_data: " + dir.path() + "/nope.txt: no such file\n");
  auto no_dir = prepare_data({"--out", dir.path() + "/sub/o", text});
  CHECK(no_dir.exit_code == 2);
  CHECK_THAT(no_dir.err, Catch::Matchers::Contains("does not exist"));
  auto usage = prepare_data({text});
  CHECK(usage.exit_code == 2);
  CHECK_THAT(usage.err, Catch::Matchers::Contains("--out"));
  if (!python_has("tokenizers")) {
    auto hf = prepare_data({"--out", dir.path() + "/o", "--tokenizer", dir.path() + "/tokenizer.json", text});
    CHECK(hf.exit_code == 2);
    CHECK_THAT(hf.err, Catch::Matchers::Contains("needs the Python package 'tokenizers'"));
  }
  // Nothing half-written is left behind.
  CHECK_FALSE(std::filesystem::exists(dir.path() + "/o.bin"));
  CHECK_FALSE(std::filesystem::exists(dir.path() + "/o.bin.tmp"));
}

TEST_CASE("data: prepare_data with a Hugging Face tokenizer.json", "[data]") {
  if (!python_has("tokenizers")) {
    WARN("skipped: the Python package 'tokenizers' is not installed");
    return;
  }
  TempDir dir;
  // A word-level tokenizer small enough to write by hand.
  const std::string tokenizer = dir.write("tokenizer.json", R"({
    "version": "1.0", "truncation": null, "padding": null, "added_tokens": [], "normalizer": null,
    "pre_tokenizer": {"type": "Whitespace"}, "post_processor": null, "decoder": null,
    "model": {"type": "WordLevel", "vocab": {"[UNK]": 0, "hello": 1, "world": 2}, "unk_token": "[UNK]"}})");
  const std::string text = dir.write("t.txt", "hello world\nworld of hello\n");
  const auto result = prepare_data({"--out", dir.path() + "/hf", "--tokenizer", tokenizer, "--split-lines", text});
  INFO(result.out << result.err);
  REQUIRE(result.exit_code == 0);
  const TokenFile file = TokenFile::open(dir.path() + "/hf", 3);
  CHECK(all_tokens(file) == std::vector<int32_t>{1, 2, 2, 0, 1});
  CHECK(file.document_count() == 2);
}
