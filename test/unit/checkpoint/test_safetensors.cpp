// SafetensorsReader against malformed files: each class of damage a download, a failing disk or a
// hostile model directory can produce is a UserError naming the file and the tensor or field,
// raised before anything is allocated from the header's numbers.
#include <ATen/ATen.h>
#include <catch2/catch.hpp>
#include <sys/stat.h>

#include <fmt/format.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "checkpoint/safetensors.h"
#include "core/error.h"
#include "process.h"

using namespace trainer;
using namespace trainer::checkpoint;
using Catch::Matchers::Contains;

namespace {

// A file of an 8-byte length, `header` and `data_bytes` zero bytes; `length` overrides the field.
std::string write_file(const test::TempDir& dir, const std::string& header, size_t data_bytes,
                       std::optional<uint64_t> length = std::nullopt) {
  const uint64_t field = length.value_or(header.size());
  std::string bytes(reinterpret_cast<const char*>(&field), 8);
  bytes += header;
  bytes.append(data_bytes, '\0');
  return dir.write("w.safetensors", bytes);
}

std::string error_of(const std::string& path) {
  try {
    SafetensorsReader reader(path);
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

// The error for a file whose header is `header` followed by `data_bytes` bytes.
std::string error_for(const std::string& header, size_t data_bytes) {
  test::TempDir dir;
  return error_of(write_file(dir, header, data_bytes));
}

}  // namespace

TEST_CASE("a well-formed file reads back - tensors in any header order", "[checkpoint]") {
  test::TempDir dir;
  const std::string path = dir.path() + "/ok.safetensors";
  const at::Tensor a = at::arange(6, at::kFloat).view({2, 3}), b = at::arange(4, at::kLong);
  write_safetensors(path, {{"b", b}, {"a", a}, {"empty", at::empty({0, 5})}}, {{"format", "pt"}});
  const SafetensorsReader reader(path);
  CHECK(reader.names() == std::vector<std::string>{"a", "b", "empty"});
  CHECK(at::equal(reader.read("a"), a));
  CHECK(at::equal(reader.read("b"), b));
  CHECK(reader.dtype("b") == at::kLong);
  CHECK(reader.read("empty").sizes().vec() == std::vector<int64_t>{0, 5});
  CHECK(reader.metadata().at("format") == "pt");
  // Written by hand as another writer might: no padding, tensors listed out of offset order.
  const std::string path2 = write_file(
      dir, R"({"y":{"dtype":"F32","shape":[1],"data_offsets":[4,8]},"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 8);
  CHECK(error_of(path2).empty());
}

TEST_CASE("a file written by Python's safetensors reads - padding - empty __metadata__ - scalar - no elements", "[checkpoint]") {
  // save_file({"scalar": tensor(1.5), "zero": zeros(0, 4), "x": arange(3, dtype=int32)}, path,
  // metadata={}) of safetensors 0.8.0: the header padded with 4 spaces, the empty tensor placed
  // between the others at [4, 4].
  const std::string header =
      R"({"__metadata__":{},"scalar":{"dtype":"F32","shape":[],"data_offsets":[0,4]},"zero":{"dtype":"F32",)"
      R"("shape":[0,4],"data_offsets":[4,4]},"x":{"dtype":"I32","shape":[3],"data_offsets":[4,16]}}    )";
  REQUIRE(header.size() == 192);
  const unsigned char data[] = {0, 0, 0xc0, 0x3f, 0, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0};
  test::TempDir dir;
  const std::string path = write_file(dir, header + std::string(reinterpret_cast<const char*>(data), sizeof(data)), 0,
                                     header.size());
  const SafetensorsReader reader(path);
  CHECK(reader.names() == std::vector<std::string>{"scalar", "x", "zero"});
  CHECK(reader.metadata().empty());
  CHECK(reader.read("scalar").dim() == 0);
  CHECK(reader.read("scalar").item<float>() == 1.5f);
  CHECK(at::equal(reader.read("x"), at::arange(3, at::kInt)));
  CHECK(reader.read("zero").sizes().vec() == std::vector<int64_t>{0, 4});
}

TEST_CASE("data_offsets that are empty short or of the wrong type name the tensor", "[checkpoint]") {
  const auto with_offsets = [](const std::string& offsets) {
    return error_for(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":)" + offsets + "}}", 8);
  };
  for (const char* bad : {"[]", "[0]", "[0,8,8]", "[\"0\",\"8\"]", "[0,8.0]", "[-1,7]", "{}", "null", "8"}) {
    INFO(bad);
    CHECK_THAT(with_offsets(bad), Contains("w.safetensors: tensor t: data_offsets") &&
                                      Contains("must be two integers >= 0"));
  }
  CHECK_THAT(with_offsets("[8,0]"), Contains("tensor t: data_offsets [8,0] end before they begin"));
  CHECK_THAT(with_offsets("[0,4]"), Contains("tensor t: data_offsets [0,4] hold 4 bytes, but shape [2] of F32 takes 8"));
  CHECK(with_offsets("[0,8]").empty());
}

TEST_CASE("entries dtypes and shapes of the wrong type are errors naming the field", "[checkpoint]") {
  CHECK_THAT(error_for(R"({"t":[1,2]})", 0), Contains("w.safetensors: tensor t: found [1,2] (a list), expected an object"));
  CHECK_THAT(error_for(R"({"t":{"dtype":"F32","shape":[1]}})", 4), Contains("tensor t: no data_offsets"));
  CHECK_THAT(error_for(R"({"t":{"dtype":7,"shape":[1],"data_offsets":[0,4]}})", 4),
             Contains("tensor t: dtype 7 is not supported"));
  CHECK_THAT(error_for(R"({"t":{"dtype":"I8","shape":[1],"data_offsets":[0,1]}})", 1),
             Contains("tensor t: dtype \"I8\" is not supported"));
  CHECK_THAT(error_for(R"({"t":{"dtype":"F32","shape":"4","data_offsets":[0,4]}})", 4),
             Contains("tensor t: shape \"4\" is a string, expected a list of sizes"));
  CHECK_THAT(error_for(R"({"t":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4),
             Contains("tensor t: shape [-1] holds -1, expected sizes that are integers >= 0"));
  CHECK_THAT(error_for(R"({"t":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}})", 4),
             Contains("tensor t: shape [1.5] holds 1.5"));
}

TEST_CASE("sizes that overflow 64-bit arithmetic are errors - not wrapped around", "[checkpoint]") {
  // 2^32 * 2^32 elements, and 2^62 elements of 4 bytes: both wrap to small numbers in 64 bits.
  CHECK_THAT(error_for(R"({"t":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0]}})", 0),
             Contains("tensor t: shape [4294967296,4294967296] multiplies to 2^63 or more"));
  // No element, but strides past 64 bits: refused here, not by at::empty as an internal error.
  CHECK_THAT(error_for(R"({"t":{"dtype":"F32","shape":[0,4611686018427387904,4],"data_offsets":[0,0]}})", 0),
             Contains("tensor t: shape [0,4611686018427387904,4] multiplies to 2^63 or more (sizes of 0 counted as 1)"));
  CHECK(error_for(R"({"t":{"dtype":"F32","shape":[4611686018427387904,0],"data_offsets":[0,0]}})", 0).empty());
  CHECK_THAT(error_for(R"({"t":{"dtype":"F32","shape":[4611686018427387904],"data_offsets":[0,0]}})", 0),
             Contains("tensor t: shape [4611686018427387904] of F32 takes more bytes than 64 bits count"));
  CHECK_THAT(error_for(R"({"t":{"dtype":"F32","shape":[18446744073709551615],"data_offsets":[0,4]}})", 4),
             Contains("tensor t: shape"));
  CHECK_THAT(error_for(R"({"t":{"dtype":"U8","shape":[1],"data_offsets":[18446744073709551615,0]}})", 1),
             Contains("tensor t: data_offsets [18446744073709551615,0] end before they begin"));
  CHECK_THAT(error_for(R"({"t":{"dtype":"U8","shape":[1],"data_offsets":[18446744073709551614,18446744073709551615]}})", 1),
             Contains("tensor t: data_offsets [18446744073709551614,18446744073709551615] end past the 1 bytes of data"));
}

TEST_CASE("tensors must tile the data exactly - no overlap gap or trailing bytes", "[checkpoint]") {
  const std::string a = R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  CHECK_THAT(error_for("{" + a + R"(,"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12),
             Contains("w.safetensors: tensors a and b overlap"));
  CHECK_THAT(error_for("{" + a + R"(,"b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 8),
             Contains("tensors a and b overlap"));
  CHECK_THAT(error_for("{" + a + R"(,"b":{"dtype":"F32","shape":[1],"data_offsets":[12,16]}})", 16),
             Contains("bytes [8, 12) of the data belong to no tensor (tensor b begins at 12)"));
  CHECK_THAT(error_for("{" + a + "}", 9), Contains("1 bytes follow the last tensor, which ends at byte 8 of the 9"));
  CHECK_THAT(error_for("{" + a + "}", 7), Contains("tensor a: data_offsets [0,8] end past the 7 bytes of data"));
  CHECK(error_for("{" + a + "}", 8).empty());
}

TEST_CASE("header lengths outside the file or off by one are errors", "[checkpoint]") {
  test::TempDir dir;
  const std::string header = R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}}   )";
  CHECK_THAT(error_of(write_file(dir, header, 4, UINT64_MAX)),
             Contains("w.safetensors: the header length field says 18446744073709551615 bytes, but only"));
  CHECK_THAT(error_of(write_file(dir, header, 4, uint64_t(1) << 40)), Contains("the header length field says 1099511627776"));
  // One byte short: the JSON still parses (padding), but the data would start one byte early.
  CHECK_THAT(error_of(write_file(dir, header, 4, header.size() - 1)), Contains("1 bytes follow the last tensor"));
  // One byte long: the header swallows the first data byte.
  CHECK_THAT(error_of(write_file(dir, header, 4, header.size() + 1)),
             Contains("is not a JSON object followed only by spaces"));
  CHECK_THAT(error_of(dir.write("short.safetensors", "abc")), Contains("short.safetensors: 3 bytes, too short"));
  CHECK_THAT(error_of(write_file(dir, "", 0)), Contains("is not a JSON object"));
  CHECK_THAT(error_of(write_file(dir, "{\"a\": }", 0)), Contains("w.safetensors (header):1:7: malformed JSON"));
  CHECK_THAT(error_of(write_file(dir, "{}\n", 0)), Contains("is not a JSON object followed only by spaces"));
  CHECK(error_of(write_file(dir, "{}", 0)).empty());
}

TEST_CASE("__metadata__ must be an object of strings and nesting is limited", "[checkpoint]") {
  CHECK_THAT(error_for(R"({"__metadata__":[1]})", 0), Contains("w.safetensors: __metadata__ is a list"));
  CHECK_THAT(error_for(R"({"__metadata__":{"format":{"a":1}}})", 0),
             Contains("__metadata__.format is {\"a\":1} (an object), expected a string"));
  std::string deep = R"({"__metadata__":{"x":)";  // appended, not added: GCC 12 warns falsely on operator+ here
  deep.append(200000, '[').append(200000, ']').append("}}");
  CHECK_THAT(error_for(deep, 0), Contains("w.safetensors (header):1:") && Contains("JSON nested deeper than 128"));
}

TEST_CASE("only regular files are read - FIFOs and devices are refused at once", "[checkpoint]") {
  test::TempDir dir;
  const std::string fifo = dir.path() + "/model.safetensors";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  CHECK(error_of(fifo) == fifo + ": not a regular file (a FIFO); expected a file");
  const std::string link = dir.path() + "/zero.safetensors";
  std::filesystem::create_symlink("/dev/zero", link);
  CHECK_THAT(error_of(link), Contains("zero.safetensors: not a regular file (a character device)"));
}
