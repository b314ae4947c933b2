#pragma once
// llm.c / nanoGPT token shards (llm.c dev/data/data_common.py): each file is a header of 256
// little-endian int32, [0] magic, [1] version, [2] token count, then the tokens:
//   magic 20240520, version 1: uint16 tokens (GPT-2 data);
//   magic 20240801, version 7: uint32 tokens (Llama 3 data).
// A list of shards (a glob) is one source: their tokens concatenated in name order. The format
// records no document boundaries (llm.c separates documents with an end-of-text token).
#include <cstdint>
#include <string>
#include <vector>

#include "data/mapped_file.h"
#include "data/token_source.h"

namespace trainer::data {

inline constexpr int32_t kLlmcMagicGpt2 = 20240520;
inline constexpr int32_t kLlmcMagicLlama3 = 20240801;
inline constexpr size_t kLlmcHeaderBytes = 256 * 4;

class LlmcShards final : public TokenSource {
 public:
  // `files`: the shards in order (at least one). Validates each header (magic, version, the token
  // count against the file size), the same token width in every shard, and every token in
  // [0, vocab_size). UserError naming the file otherwise.
  static LlmcShards open(const std::string& name, const std::vector<std::string>& files, int64_t vocab_size);
  LlmcShards(LlmcShards&&) = default;

  const std::string& name() const override { return name_; }
  std::string format() const override { return "llmc"; }
  uint64_t token_count() const override { return starts_.back(); }
  std::optional<uint64_t> documents() const override { return std::nullopt; }
  uint64_t max_token_id() const override { return max_token_id_; }
  std::string token_type() const override { return token_bytes_ == 2 ? "uint16" : "uint32"; }
  void read(uint64_t begin, uint64_t count, int32_t* out) const override;

 private:
  LlmcShards() = default;

  std::string name_;
  std::vector<MappedFile> shards_;
  std::vector<uint64_t> starts_ = {0};  // shard k holds tokens [starts_[k], starts_[k + 1])
  size_t token_bytes_ = 2;
  uint64_t max_token_id_ = 0;
};

// Writes one llm.c shard (uint16 tokens with the GPT-2 magic, or uint32 with the Llama 3 one).
// For tests.
void write_llmc_shard(const std::string& path, const std::vector<int32_t>& tokens, bool uint32_tokens);

}  // namespace trainer::data
