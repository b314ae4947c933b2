#include "data/llmc_shards.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <stdexcept>

#include "core/error.h"

namespace trainer::data {

namespace {

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw UserError(fmt::format("{}: {}", path, what));
}

template <typename T>
uint64_t check_tokens(const std::string& path, const T* tokens, uint64_t count, int64_t vocab_size) {
  uint64_t largest = 0;
  for (uint64_t i = 0; i < count; ++i) {
    if (int64_t(tokens[i]) >= vocab_size)
      fail(path, fmt::format("token {} is {}, outside the model's vocabulary [0, {}) (model.vocab_size)", i,
                             uint64_t(tokens[i]), vocab_size));
    largest = std::max<uint64_t>(largest, tokens[i]);
  }
  return largest;
}

}  // namespace

LlmcShards LlmcShards::open(const std::string& name, const std::vector<std::string>& files, int64_t vocab_size) {
  if (files.empty()) throw UserError(fmt::format("{}: no llm.c shard matches", name));
  LlmcShards source;
  source.name_ = name;
  for (size_t k = 0; k < files.size(); ++k) {
    MappedFile shard(files[k]);
    const std::string& path = shard.path();
    if (shard.size() < kLlmcHeaderBytes)
      fail(path, fmt::format("truncated: {} bytes, shorter than the 1024-byte header of an llm.c shard", shard.size()));
    int32_t header[3];
    std::memcpy(header, shard.data(), sizeof(header));
    size_t bytes = 0;
    if (header[0] == kLlmcMagicGpt2 && header[1] == 1)
      bytes = 2;
    else if (header[0] == kLlmcMagicLlama3 && header[1] == 7)
      bytes = 4;
    else if (header[0] == kLlmcMagicGpt2 || header[0] == kLlmcMagicLlama3)
      fail(path, fmt::format("llm.c shard version {} with magic {} is not supported; expected version {}", header[1],
                             header[0], header[0] == kLlmcMagicGpt2 ? 1 : 7));
    else
      fail(path, fmt::format("not an llm.c shard: magic {} where {} (uint16 tokens) or {} (uint32 tokens) is expected",
                             header[0], kLlmcMagicGpt2, kLlmcMagicLlama3));
    if (k > 0 && bytes != source.token_bytes_)
      fail(path, fmt::format("{}-byte tokens, but {} has {}-byte tokens: one source needs one token width", bytes,
                             files[0], source.token_bytes_));
    source.token_bytes_ = bytes;
    if (header[2] < 0) fail(path, fmt::format("negative token count {}", header[2]));
    const uint64_t count = uint64_t(header[2]);
    if (shard.size() != kLlmcHeaderBytes + count * bytes)
      fail(path, fmt::format("{} bytes, but the header promises {} tokens of {} bytes after the 1024-byte header ({} "
                             "bytes): truncated or oversized",
                             shard.size(), count, bytes, kLlmcHeaderBytes + count * bytes));
    const std::byte* data = shard.data() + kLlmcHeaderBytes;
    const uint64_t largest = bytes == 2 ? check_tokens(path, reinterpret_cast<const uint16_t*>(data), count, vocab_size)
                                        : check_tokens(path, reinterpret_cast<const uint32_t*>(data), count, vocab_size);
    source.max_token_id_ = std::max(source.max_token_id_, largest);
    source.starts_.push_back(source.starts_.back() + count);
    source.shards_.push_back(std::move(shard));
  }
  return source;
}

void LlmcShards::read(uint64_t begin, uint64_t count, int32_t* out) const {
  if (begin + count > token_count()) throw std::out_of_range(fmt::format("{}: read past the end", name_));
  // A window may cross from one shard into the next.
  size_t k = size_t(std::upper_bound(starts_.begin(), starts_.end(), begin) - starts_.begin()) - 1;
  while (count > 0) {
    const uint64_t local = begin - starts_[k], here = std::min(count, starts_[k + 1] - begin);
    const std::byte* data = shards_[k].data() + kLlmcHeaderBytes + local * token_bytes_;
    if (token_bytes_ == 2)
      for (uint64_t i = 0; i < here; ++i) out[i] = int32_t(reinterpret_cast<const uint16_t*>(data)[i]);
    else
      for (uint64_t i = 0; i < here; ++i) out[i] = int32_t(reinterpret_cast<const uint32_t*>(data)[i]);
    out += here;
    begin += here;
    count -= here;
    ++k;
  }
}

void write_llmc_shard(const std::string& path, const std::vector<int32_t>& tokens, bool uint32_tokens) {
  std::vector<int32_t> header(256, 0);
  header[0] = uint32_tokens ? kLlmcMagicLlama3 : kLlmcMagicGpt2;
  header[1] = uint32_tokens ? 7 : 1;
  header[2] = int32_t(tokens.size());
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(header.data()), std::streamsize(header.size() * 4));
  for (int32_t t : tokens) {
    if (uint32_tokens) {
      const uint32_t v = uint32_t(t);
      out.write(reinterpret_cast<const char*>(&v), 4);
    } else {
      const uint16_t v = uint16_t(t);
      out.write(reinterpret_cast<const char*>(&v), 2);
    }
  }
  if (!out) throw std::runtime_error(fmt::format("{}: cannot write", path));
}

}  // namespace trainer::data
