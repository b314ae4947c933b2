#include "data/token_file.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cstdio>
#include <cstring>
#include <stdexcept>

#include "core/error.h"

namespace trainer::data {

// The format is little-endian and read in place; a big-endian host would need byte swapping.
static_assert(std::endian::native == std::endian::little, "token files are read in place as little-endian");

namespace {

template <typename T>
T load(const std::byte* at) {
  T value;
  std::memcpy(&value, at, sizeof(T));
  return value;
}

std::string printable_magic(const std::byte* at) {
  std::string text;
  for (int i = 0; i < 8; ++i) {
    const auto c = static_cast<unsigned char>(at[i]);
    text += (c >= 32 && c < 127 && c != '"' && c != '\\') ? std::string(1, static_cast<char>(c)) : fmt::format("\\x{:02x}", c);
  }
  return text;
}

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw UserError(fmt::format("{}: {}", path, what));
}

// Checks the parts of the header the two files share: size, magic, version.
void check_header(const MappedFile& file, const char (&magic)[8], size_t header_bytes, const char* kind) {
  if (file.size() < header_bytes)
    fail(file.path(), fmt::format("truncated: {} bytes, shorter than the {}-byte header of a {} file", file.size(),
                                  header_bytes, kind));
  if (std::memcmp(file.data(), magic, 8) != 0)
    fail(file.path(), fmt::format("not a {} file: it starts with \"{}\" where \"{}\" is expected (write it with "
                                  "scripts/prepare_data)",
                                  kind, printable_magic(file.data()), std::string(magic, 8)));
  const auto version = load<uint32_t>(file.data() + 8);
  if (version != kTokenFormatVersion)
    fail(file.path(), fmt::format("format version {} is not supported (this build reads version {})", version,
                                  kTokenFormatVersion));
}

// The largest token and the first position holding `limit` or more (or count when none does).
template <typename T>
std::pair<uint64_t, uint64_t> scan(const T* tokens, uint64_t count, uint64_t limit) {
  T largest = 0;
  for (uint64_t i = 0; i < count; ++i) largest = std::max(largest, tokens[i]);
  uint64_t first_over = count;
  if (largest >= limit) first_over = std::find_if(tokens, tokens + count, [&](T t) { return t >= limit; }) - tokens;
  return {largest, first_over};
}

template <typename T>
void widen(const T* tokens, uint64_t count, int32_t* out) {
  for (uint64_t i = 0; i < count; ++i) out[i] = static_cast<int32_t>(tokens[i]);
}

}  // namespace

int token_bytes_for_vocab(int64_t vocab_size) { return vocab_size <= 65536 ? 2 : 4; }

TokenFile TokenFile::open(const std::string& prefix, int64_t vocab_size) {
  // Both files are opened first, so a missing one is reported before the other's contents.
  MappedFile bin(prefix + ".bin");
  MappedFile idx(prefix + ".idx");
  TokenFile file(prefix, std::move(bin), std::move(idx));
  file.validate(vocab_size);
  return file;
}

TokenFile::TokenFile(std::string prefix, MappedFile bin, MappedFile idx)
    : prefix_(std::move(prefix)), bin_(std::move(bin)), idx_(std::move(idx)) {}

void TokenFile::validate(int64_t vocab_size) {
  // --- PREFIX.bin: header and size (the tokens are scanned last, after every cheap check).
  const std::string& bin_path = bin_.path();
  check_header(bin_, kTokenMagic, kTokenHeaderBytes, "token (.bin)");
  const auto token_bytes = load<uint32_t>(bin_.data() + 12);
  if (token_bytes != 2 && token_bytes != 4)
    fail(bin_path, fmt::format("header says {} bytes per token; only 2 (uint16) and 4 (uint32) exist", token_bytes));
  token_bytes_ = static_cast<int>(token_bytes);
  token_count_ = load<uint64_t>(bin_.data() + 16);
  max_token_id_ = load<uint64_t>(bin_.data() + 24);
  const uint64_t payload = bin_.size() - kTokenHeaderBytes;
  if (token_count_ > payload / token_bytes || payload != token_count_ * token_bytes)
    fail(bin_path, fmt::format("{}: the header says {} tokens of {} bytes ({} + {} x {} bytes) but the file has {} bytes",
                               token_count_ > payload / token_bytes ? "truncated" : "has trailing bytes", token_count_,
                               token_bytes, kTokenHeaderBytes, token_count_, token_bytes, bin_.size()));
  if (max_token_id_ >= static_cast<uint64_t>(vocab_size))
    fail(bin_path, fmt::format("holds token ids up to {} (header), outside the vocabulary of model.vocab_size={}; "
                               "the tokenizer and the model disagree",
                               max_token_id_, vocab_size));
  tokens_ = bin_.data() + kTokenHeaderBytes;

  // --- PREFIX.idx: header, size, offsets.
  const std::string& idx_path = idx_.path();
  check_header(idx_, kIndexMagic, kIndexHeaderBytes, "document index (.idx)");
  document_count_ = load<uint64_t>(idx_.data() + 16);
  const auto idx_tokens = load<uint64_t>(idx_.data() + 24);
  const uint64_t idx_payload = idx_.size() - kIndexHeaderBytes;
  const bool idx_truncated = document_count_ >= idx_payload / 8;  // fewer than document_count + 1 offsets
  if (idx_truncated || idx_payload != (document_count_ + 1) * 8)
    fail(idx_path, fmt::format("{}: the header says {} documents ({} offsets of 8 bytes after the {}-byte header) but "
                               "the file has {} bytes",
                               idx_truncated ? "truncated" : "has trailing bytes", document_count_,
                               document_count_ + 1, kIndexHeaderBytes, idx_.size()));
  if (idx_tokens != token_count_)
    fail(idx_path, fmt::format("indexes {} tokens but {} holds {}; the two files are not from the same dataset",
                               idx_tokens, bin_path, token_count_));
  offsets_ = reinterpret_cast<const uint64_t*>(idx_.data() + kIndexHeaderBytes);
  if (offsets_[0] != 0) fail(idx_path, fmt::format("document offset 0 is {}; the first document must start at 0", offsets_[0]));
  for (uint64_t d = 0; d < document_count_; ++d)
    if (offsets_[d + 1] < offsets_[d] || offsets_[d + 1] > token_count_)
      fail(idx_path, fmt::format("document offset {} is {}, out of range (after {}, at most the token count {})",
                                 d + 1, offsets_[d + 1], offsets_[d], token_count_));
  if (offsets_[document_count_] != token_count_)
    fail(idx_path, fmt::format("the last document ends at {} but {} holds {} tokens", offsets_[document_count_],
                               bin_path, token_count_));

  // The header's largest id is only a claim; scanning proves it (memory-mapped, this runs at
  // the speed of the page cache or the disk).
  bin_.advise_sequential();
  const auto [largest, first_over] =
      token_bytes_ == 2 ? scan(reinterpret_cast<const uint16_t*>(tokens_), token_count_, vocab_size)
                        : scan(reinterpret_cast<const uint32_t*>(tokens_), token_count_, vocab_size);
  bin_.advise_normal();
  if (first_over < token_count_) {
    int32_t token = 0;
    read(first_over, 1, &token);
    fail(bin_path, fmt::format("token id {} at position {} is outside the vocabulary of model.vocab_size={} (the "
                               "header claims the largest id is {}; the file is corrupt)",
                               static_cast<uint32_t>(token), first_over, vocab_size, max_token_id_));
  }
  if (token_count_ > 0 && largest != max_token_id_)
    fail(bin_path, fmt::format("corrupt: the header says the largest token id is {} but the tokens' largest is {}",
                               max_token_id_, largest));
}

uint64_t TokenFile::document_offset(uint64_t d) const { return offsets_[d]; }

std::vector<uint64_t> TokenFile::document_starts(uint64_t begin, uint64_t count) const {
  return starts_within(offsets_, size_t(document_count_), begin, count);  // offset[D] is the end, no start
}

void TokenFile::read(uint64_t begin, uint64_t count, int32_t* out) const {
  if (token_bytes_ == 2)
    widen(reinterpret_cast<const uint16_t*>(tokens_) + begin, count, out);
  else
    widen(reinterpret_cast<const uint32_t*>(tokens_) + begin, count, out);
}

namespace {

class OutputFile {
 public:
  explicit OutputFile(std::string path) : path_(std::move(path)), file_(std::fopen(path_.c_str(), "wb")) {
    if (!file_) throw std::runtime_error(fmt::format("{}: cannot create file", path_));
  }
  ~OutputFile() {
    if (file_) std::fclose(file_);
  }
  void write(const void* data, size_t bytes) {
    if (bytes && std::fwrite(data, 1, bytes, file_) != bytes)
      throw std::runtime_error(fmt::format("{}: write failed", path_));
  }
  template <typename T>
  void put(T value) {
    write(&value, sizeof(T));
  }
  void close() {
    const int status = std::fclose(std::exchange(file_, nullptr));
    if (status != 0) throw std::runtime_error(fmt::format("{}: write failed", path_));
  }

 private:
  std::string path_;
  std::FILE* file_;
};

template <typename T>
void write_tokens(OutputFile& out, const std::vector<std::vector<int32_t>>& documents) {
  std::vector<T> buffer;
  for (const auto& document : documents) {
    buffer.assign(document.begin(), document.end());
    out.write(buffer.data(), buffer.size() * sizeof(T));
  }
}

}  // namespace

void write_token_files(const std::string& prefix, const std::vector<std::vector<int32_t>>& documents,
                       int64_t vocab_size) {
  uint64_t token_count = 0, max_token_id = 0;
  std::vector<uint64_t> offsets = {0};
  for (const auto& document : documents) {
    for (int32_t token : document) {
      if (token < 0 || token >= vocab_size)
        throw std::invalid_argument(fmt::format("write_token_files: token id {} outside [0, {})", token, vocab_size));
      max_token_id = std::max<uint64_t>(max_token_id, token);
    }
    token_count += document.size();
    offsets.push_back(token_count);
  }
  const uint32_t token_bytes = token_bytes_for_vocab(vocab_size);

  OutputFile bin(prefix + ".bin");
  bin.write(kTokenMagic, 8);
  bin.put<uint32_t>(kTokenFormatVersion);
  bin.put<uint32_t>(token_bytes);
  bin.put<uint64_t>(token_count);
  bin.put<uint64_t>(max_token_id);
  if (token_bytes == 2)
    write_tokens<uint16_t>(bin, documents);
  else
    write_tokens<uint32_t>(bin, documents);
  bin.close();

  OutputFile idx(prefix + ".idx");
  idx.write(kIndexMagic, 8);
  idx.put<uint32_t>(kTokenFormatVersion);
  idx.put<uint32_t>(0);
  idx.put<uint64_t>(documents.size());
  idx.put<uint64_t>(token_count);
  idx.write(offsets.data(), offsets.size() * sizeof(uint64_t));
  idx.close();
}

}  // namespace trainer::data
