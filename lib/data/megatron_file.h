#pragma once
// Megatron-LM's indexed dataset (megatron/core/datasets/indexed_dataset.py), read in place from
// the memory-mapped files. PREFIX.idx, little-endian:
//   0  magic "MMIDIDX\0\0" (9 bytes)   9 u64 version (1)   17 u8 dtype code
//   18 u64 sequence count S            26 u64 document index count D
//   34 S x i32 sequence lengths (tokens), S x i64 sequence pointers (byte offsets into .bin),
//      D x i64 document indices (sequence numbers; 0 first, S last: document d is sequences
//      [doc[d], doc[d+1])), and in multimodal datasets S x i8 sequence modes.
// PREFIX.bin: the sequences' tokens, back to back, in the dtype of the code (1 uint8, 2 int8,
// 3 int16, 4 int32, 5 int64, 8 uint16; 6 and 7 are floats and hold no tokens).
#include <cstdint>
#include <string>
#include <vector>

#include "data/mapped_file.h"
#include "data/token_source.h"

namespace trainer::data {

inline constexpr char kMegatronMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};

class MegatronFile final : public TokenSource {
 public:
  // Validates everything the reader relies on: magic, version, dtype code, the .idx size against
  // its counts (with or without the modes array; modes other than 0, text, are refused), sequence
  // pointers that lay the sequences back to back from byte 0, the .bin size against the lengths,
  // document indices from 0 to S in order, and every token in [0, vocab_size). UserError naming
  // the file otherwise.
  static MegatronFile open(const std::string& prefix, int64_t vocab_size);
  MegatronFile(MegatronFile&&) = default;

  const std::string& name() const override { return prefix_; }
  std::string format() const override { return "megatron"; }
  uint64_t token_count() const override { return token_count_; }
  std::optional<uint64_t> documents() const override { return documents_; }
  uint64_t max_token_id() const override { return max_token_id_; }
  std::string token_type() const override;
  uint64_t sequence_count() const { return sequence_count_; }
  void read(uint64_t begin, uint64_t count, int32_t* out) const override;
  std::vector<uint64_t> document_starts(uint64_t begin, uint64_t count) const override;

 private:
  MegatronFile(std::string prefix, MappedFile bin, MappedFile idx);
  void validate(int64_t vocab_size);

  std::string prefix_;
  MappedFile bin_, idx_;
  int dtype_code_ = 0;
  size_t token_bytes_ = 0;
  uint64_t token_count_ = 0, sequence_count_ = 0, documents_ = 0, max_token_id_ = 0;
  std::vector<uint64_t> document_offsets_;  // the token offset where each document starts
};

// Writes PREFIX.bin/.idx as Megatron's IndexedDatasetBuilder does, one sequence per document,
// tokens as int32 (dtype code 4) or uint16 (8). For tests; the reference writer is Megatron's own.
void write_megatron_files(const std::string& prefix, const std::vector<std::vector<int32_t>>& documents,
                          bool uint16_tokens);

}  // namespace trainer::data
