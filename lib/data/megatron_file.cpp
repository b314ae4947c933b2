#include "data/megatron_file.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <stdexcept>

#include "core/error.h"

namespace trainer::data {

namespace {

constexpr size_t kHeaderBytes = 34;

template <typename T>
T load(const std::byte* at) {
  T value;
  std::memcpy(&value, at, sizeof(T));
  return value;
}

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw UserError(fmt::format("{}: {}", path, what));
}

// Bytes per token of a dtype code, 0 for codes that hold no token ids.
size_t bytes_of(int code) {
  switch (code) {
    case 1: case 2: return 1;
    case 3: case 8: return 2;
    case 4: return 4;
    case 5: return 8;
    default: return 0;
  }
}

const char* type_name(int code) {
  switch (code) {
    case 1: return "uint8";
    case 2: return "int8";
    case 3: return "int16";
    case 4: return "int32";
    case 5: return "int64";
    case 6: return "float64";
    case 7: return "float32";
    case 8: return "uint16";
    default: return "unknown";
  }
}

// Calls f with the tokens as their C++ type.
template <typename F>
void with_tokens(int code, const std::byte* data, F&& f) {
  switch (code) {
    case 1: f(reinterpret_cast<const uint8_t*>(data)); break;
    case 2: f(reinterpret_cast<const int8_t*>(data)); break;
    case 3: f(reinterpret_cast<const int16_t*>(data)); break;
    case 4: f(reinterpret_cast<const int32_t*>(data)); break;
    case 5: f(reinterpret_cast<const int64_t*>(data)); break;
    case 8: f(reinterpret_cast<const uint16_t*>(data)); break;
    default: throw std::logic_error("MegatronFile: unchecked dtype code");
  }
}

}  // namespace

MegatronFile::MegatronFile(std::string prefix, MappedFile bin, MappedFile idx)
    : prefix_(std::move(prefix)), bin_(std::move(bin)), idx_(std::move(idx)) {}

MegatronFile MegatronFile::open(const std::string& prefix, int64_t vocab_size) {
  MappedFile bin(prefix + ".bin");
  MappedFile idx(prefix + ".idx");
  MegatronFile file(prefix, std::move(bin), std::move(idx));
  file.validate(vocab_size);
  return file;
}

std::string MegatronFile::token_type() const { return type_name(dtype_code_); }

void MegatronFile::validate(int64_t vocab_size) {
  const std::string& ipath = idx_.path();
  const std::byte* h = idx_.data();
  if (idx_.size() < kHeaderBytes)
    fail(ipath, fmt::format("truncated: {} bytes, shorter than the {}-byte header of a Megatron index", idx_.size(),
                            kHeaderBytes));
  if (std::memcmp(h, kMegatronMagic, 9) != 0) fail(ipath, "not a Megatron-LM index: it does not start with \"MMIDIDX\\0\\0\"");
  const auto version = load<uint64_t>(h + 9);
  if (version != 1) fail(ipath, fmt::format("Megatron index version {} is not supported (this build reads version 1)", version));
  dtype_code_ = int(load<uint8_t>(h + 17));
  token_bytes_ = bytes_of(dtype_code_);
  if (token_bytes_ == 0)
    fail(ipath, fmt::format("dtype code {} ({}) holds no token ids; expected 1-5 or 8 (integers)", dtype_code_,
                            type_name(dtype_code_)));
  sequence_count_ = load<uint64_t>(h + 18);
  const uint64_t doc_entries = load<uint64_t>(h + 26);
  const uint64_t S = sequence_count_;
  // Sizes in 128-bit arithmetic would be overkill: counts beyond the file size are caught first.
  if (S > idx_.size() || doc_entries > idx_.size())
    fail(ipath, fmt::format("the header counts {} sequences and {} document indices, more than a {}-byte file holds",
                            S, doc_entries, idx_.size()));
  const uint64_t base = kHeaderBytes + S * 4 + S * 8 + doc_entries * 8;
  bool has_modes = false;
  if (idx_.size() == base + S && S > 0) {
    has_modes = true;
  } else if (idx_.size() != base) {
    fail(ipath, fmt::format("{} bytes, but {} sequences and {} document indices take {} bytes (or {} with sequence "
                            "modes): truncated or not a Megatron index",
                            idx_.size(), S, doc_entries, base, base + S));
  }
  const std::byte* lengths = h + kHeaderBytes;
  const std::byte* pointers = lengths + S * 4;
  const std::byte* docs = pointers + S * 8;
  uint64_t tokens = 0;
  for (uint64_t i = 0; i < S; ++i) {
    const auto length = load<int32_t>(lengths + i * 4);
    const auto pointer = load<int64_t>(pointers + i * 8);
    if (length < 0) fail(ipath, fmt::format("sequence {} has length {}", i, length));
    if (uint64_t(pointer) != tokens * token_bytes_)
      fail(ipath, fmt::format("sequence {} starts at byte {} of the .bin, but the sequences before it end at byte {}: "
                              "only back-to-back sequences (as IndexedDatasetBuilder writes them) are supported",
                              i, pointer, tokens * token_bytes_));
    tokens += uint64_t(length);
  }
  if (doc_entries < 1 || load<int64_t>(docs) != 0 || uint64_t(load<int64_t>(docs + (doc_entries - 1) * 8)) != S)
    fail(ipath, fmt::format("document indices must run from 0 to the sequence count {}", S));
  for (uint64_t d = 1; d < doc_entries; ++d)
    if (load<int64_t>(docs + d * 8) < load<int64_t>(docs + (d - 1) * 8))
      fail(ipath, fmt::format("document index {} goes backwards", d));
  documents_ = doc_entries - 1;
  // Sequences lie back to back (checked above): document d starts at its first sequence's pointer.
  document_offsets_.clear();
  for (uint64_t d = 0; d < documents_; ++d) {
    const auto sequence = uint64_t(load<int64_t>(docs + d * 8));
    document_offsets_.push_back(sequence < S ? uint64_t(load<int64_t>(pointers + sequence * 8)) / token_bytes_
                                             : tokens);
  }
  if (has_modes) {
    const std::byte* modes = docs + doc_entries * 8;
    for (uint64_t i = 0; i < S; ++i)
      if (load<int8_t>(modes + i) != 0)
        fail(ipath, fmt::format("sequence {} has mode {}: a multimodal dataset; trainer reads text sequences (mode 0) "
                                "only",
                                i, int(load<int8_t>(modes + i))));
  }
  token_count_ = tokens;
  if (bin_.size() != tokens * token_bytes_)
    fail(bin_.path(), fmt::format("{} bytes, but its index {} lists {} tokens of {} ({} bytes): truncated, or not the "
                                  "data of this index",
                                  bin_.size(), ipath, tokens, type_name(dtype_code_), tokens * token_bytes_));
  // Every token must be an id of the model's vocabulary.
  bin_.advise_sequential();
  with_tokens(dtype_code_, bin_.data(), [&](auto* t) {
    int64_t largest = 0;
    for (uint64_t i = 0; i < tokens; ++i) {
      const int64_t id = int64_t(t[i]);
      if (id < 0 || id >= vocab_size)
        fail(bin_.path(), fmt::format("token {} is {}, outside the model's vocabulary [0, {}) (model.vocab_size)", i,
                                      id, vocab_size));
      largest = std::max(largest, id);
    }
    max_token_id_ = uint64_t(largest);
  });
  bin_.advise_normal();
}

void MegatronFile::read(uint64_t begin, uint64_t count, int32_t* out) const {
  if (begin + count > token_count_) throw std::out_of_range(fmt::format("{}: read past the end", prefix_));
  with_tokens(dtype_code_, bin_.data() + begin * token_bytes_, [&](auto* t) {
    for (uint64_t i = 0; i < count; ++i) out[i] = int32_t(t[i]);
  });
}

std::vector<uint64_t> MegatronFile::document_starts(uint64_t begin, uint64_t count) const {
  return starts_within(document_offsets_.data(), document_offsets_.size(), begin, count);
}

void write_megatron_files(const std::string& prefix, const std::vector<std::vector<int32_t>>& documents,
                          bool uint16_tokens) {
  std::ofstream bin(prefix + ".bin", std::ios::binary), idx(prefix + ".idx", std::ios::binary);
  const uint8_t code = uint16_tokens ? 8 : 4;
  const size_t bytes = uint16_tokens ? 2 : 4;
  std::vector<int32_t> lengths;
  std::vector<int64_t> pointers, doc_indices = {0};
  int64_t offset = 0;
  for (const auto& document : documents) {
    for (int32_t t : document) {
      if (uint16_tokens) {
        const uint16_t v = uint16_t(t);
        bin.write(reinterpret_cast<const char*>(&v), 2);
      } else {
        bin.write(reinterpret_cast<const char*>(&t), 4);
      }
    }
    lengths.push_back(int32_t(document.size()));
    pointers.push_back(offset);
    offset += int64_t(document.size() * bytes);
    doc_indices.push_back(int64_t(lengths.size()));
  }
  const uint64_t version = 1, sequences = lengths.size(), entries = doc_indices.size();
  idx.write(kMegatronMagic, 9);
  idx.write(reinterpret_cast<const char*>(&version), 8);
  idx.write(reinterpret_cast<const char*>(&code), 1);
  idx.write(reinterpret_cast<const char*>(&sequences), 8);
  idx.write(reinterpret_cast<const char*>(&entries), 8);
  idx.write(reinterpret_cast<const char*>(lengths.data()), std::streamsize(lengths.size() * 4));
  idx.write(reinterpret_cast<const char*>(pointers.data()), std::streamsize(pointers.size() * 8));
  idx.write(reinterpret_cast<const char*>(doc_indices.data()), std::streamsize(doc_indices.size() * 8));
  if (!bin || !idx) throw std::runtime_error(fmt::format("{}: cannot write the Megatron files", prefix));
}

}  // namespace trainer::data
