#pragma once
// A sequence of tokens on disk, whatever its format: trainer's own TRAINTOK/TRAINIDX files
// (token_file.h), Megatron-LM's indexed datasets (megatron_file.h) and llm.c / nanoGPT token shards
// (llmc_shards.h). A dataset of data.source "tokens" reads samples as windows over the
// concatenated tokens of each source (token_dataset.h), so the same tokens in any format give the
// same samples (DESIGN.md invariant 2). Every source is validated when opened (sizes, headers, and
// every token below the model's vocabulary), with a UserError naming the file.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "recipe/choices.h"

namespace trainer::data {

class TokenSource {
 public:
  virtual ~TokenSource() = default;
  virtual const std::string& name() const = 0;  // what data.paths said (a prefix, a file or a glob)
  virtual std::string format() const = 0;       // "trainer", "megatron" or "llmc"
  virtual uint64_t token_count() const = 0;
  virtual std::optional<uint64_t> documents() const = 0;  // none where the format does not record them
  virtual uint64_t max_token_id() const = 0;
  virtual std::string token_type() const = 0;  // "uint16", "int32", ...
  // Copies tokens [begin, begin + count) to out as int32. Requires begin + count <= token_count().
  virtual void read(uint64_t begin, uint64_t count, int32_t* out) const = 0;
  // The offsets in [begin, begin + count) at which a document starts, in order, from the format's
  // document index. Formats without one (documents() empty) throw std::logic_error.
  virtual std::vector<uint64_t> document_starts(uint64_t begin, uint64_t count) const;
};

// The entries of the sorted `starts` (n of them) in [begin, begin + count), by binary search.
std::vector<uint64_t> starts_within(const uint64_t* starts, size_t n, uint64_t begin, uint64_t count);

// Opens `path` as `format` (data.format; detected from the files' magic numbers for auto): a prefix P (P.bin + P.idx: trainer or
// Megatron), one of those two files, an llm.c shard, or a glob ("shards/train_*.bin") of llm.c
// shards that together form one source, in name order. Throws UserError naming the path.
std::unique_ptr<TokenSource> open_token_source(const std::string& path, recipe::DataFormat format,
                                               int64_t vocab_size);

}  // namespace trainer::data
