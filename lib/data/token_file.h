#pragma once
// The token dataset format (docs/data.md has it byte by byte). A dataset with prefix P is two
// little-endian files written by scripts/prepare_data (or write_token_files below):
//
//   P.bin  32-byte header, then the tokens:
//          0  magic "TRAINTOK"   8  u32 version (1)   12 u32 bytes per token (2: uint16, 4: uint32)
//          16 u64 token count    24 u64 largest token id     32 tokens...
//   P.idx  32-byte header, then document boundaries:
//          0  magic "TRAINIDX"   8  u32 version (1)   12 u32 reserved (0)
//          16 u64 document count D   24 u64 token count (the same as P.bin's)
//          32 D + 1 u64 offsets: document d is tokens [offset[d], offset[d + 1]); offset[0] = 0,
//             offset[D] = token count, never decreasing.
#include <cstdint>
#include <string>
#include <vector>

#include "data/mapped_file.h"
#include "data/token_source.h"

namespace trainer::data {

inline constexpr char kTokenMagic[8] = {'T', 'R', 'A', 'I', 'N', 'T', 'O', 'K'};
inline constexpr char kIndexMagic[8] = {'T', 'R', 'A', 'I', 'N', 'I', 'D', 'X'};
inline constexpr uint32_t kTokenFormatVersion = 1;
inline constexpr size_t kTokenHeaderBytes = 32;
inline constexpr size_t kIndexHeaderBytes = 32;

// Bytes per token the writer picks for a vocabulary: 2 when every id fits in uint16, else 4.
int token_bytes_for_vocab(int64_t vocab_size);

// A validated, memory-mapped token dataset. Immutable after open, so safe to read from any thread.
class TokenFile final : public TokenSource {
 public:
  // Opens PREFIX.bin and PREFIX.idx and checks everything the format promises: both files exist,
  // magic, version, bytes per token, sizes that match the headers (truncation), document offsets
  // in range and in order, token counts that agree, and, by scanning every token, that the
  // header's largest id is the real one and is below vocab_size. Each failure is a UserError
  // naming the file and what is wrong.
  static TokenFile open(const std::string& prefix, int64_t vocab_size);

  TokenFile(TokenFile&&) = default;
  const std::string& prefix() const { return prefix_; }
  const std::string& name() const override { return prefix_; }
  std::string format() const override { return "trainer"; }
  uint64_t token_count() const override { return token_count_; }
  uint64_t document_count() const { return document_count_; }
  std::optional<uint64_t> documents() const override { return document_count_; }
  uint64_t max_token_id() const override { return max_token_id_; }
  std::string token_type() const override { return token_bytes_ == 2 ? "uint16" : "uint32"; }
  int token_bytes() const { return token_bytes_; }
  // Where document d starts (d <= document_count(); d == document_count() gives token_count()).
  uint64_t document_offset(uint64_t d) const;

  // Copies tokens [begin, begin + count) to out as int32. Requires begin + count <= token_count().
  void read(uint64_t begin, uint64_t count, int32_t* out) const override;
  std::vector<uint64_t> document_starts(uint64_t begin, uint64_t count) const override;

 private:
  TokenFile(std::string prefix, MappedFile bin, MappedFile idx);
  void validate(int64_t vocab_size);

  std::string prefix_;
  MappedFile bin_, idx_;
  int token_bytes_ = 2;
  uint64_t token_count_ = 0, document_count_ = 0, max_token_id_ = 0;
  const std::byte* tokens_ = nullptr;
  const uint64_t* offsets_ = nullptr;
};

// Writes PREFIX.bin and PREFIX.idx holding `documents` in order, each token as uint16 or
// uint32 (token_bytes_for_vocab). Throws std::invalid_argument for ids outside [0, vocab_size),
// std::runtime_error when a file cannot be written. For tests and tools; training only reads.
void write_token_files(const std::string& prefix, const std::vector<std::vector<int32_t>>& documents,
                       int64_t vocab_size);

}  // namespace trainer::data
