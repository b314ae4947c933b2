#pragma once
// Helpers for the data tests: token files written to a temporary directory, and byte surgery
// on them to produce each kind of damage open() must report.
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "data/token_file.h"
#include "data/token_source.h"
#include "process.h"

namespace trainer::data::test {

// documents[d] = {base + offset, ...}: token ids that say where they came from.
inline std::vector<std::vector<int32_t>> counting_documents(const std::vector<int>& lengths, int32_t base = 0) {
  std::vector<std::vector<int32_t>> documents;
  int32_t next = base;
  for (int length : lengths) {
    documents.emplace_back();
    for (int i = 0; i < length; ++i) documents.back().push_back(next++);
  }
  return documents;
}

// Every token of a source, as read through the interface training uses.
inline std::vector<int32_t> all_tokens(const TokenSource& source) {
  std::vector<int32_t> out(source.token_count());
  source.read(0, source.token_count(), out.data());
  return out;
}

// The documents' tokens back to back: what every format stores.
inline std::vector<int32_t> flatten(const std::vector<std::vector<int32_t>>& documents) {
  std::vector<int32_t> out;
  for (const auto& d : documents) out.insert(out.end(), d.begin(), d.end());
  return out;
}

// Overwrites bytes of a file at an offset.
template <typename T>
void patch(const std::string& path, size_t offset, T value) {
  std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
  file.seekp(static_cast<std::streamoff>(offset));
  file.write(reinterpret_cast<const char*>(&value), sizeof(T));
  REQUIRE(file.good());
}

inline void resize(const std::string& path, size_t size) { std::filesystem::resize_file(path, size); }

// The message of the UserError that f throws ("" when it throws none).
template <typename F>
std::string user_error_of(F&& f) {
  try {
    f();
  } catch (const trainer::UserError& e) {
    return e.what();
  }
  return "";
}

}  // namespace trainer::data::test
