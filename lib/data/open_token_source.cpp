// open_token_source: a data.paths entry to a TokenSource, detecting the format from magic numbers.
#include <fmt/format.h>
#include <glob.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "core/regular_file.h"
#include "data/llmc_shards.h"
#include "data/megatron_file.h"
#include "data/token_file.h"
#include "data/token_source.h"

namespace trainer::data {

namespace {

bool is_file(const std::string& path) {
  struct stat info {};
  return ::stat(path.c_str(), &info) == 0 && S_ISREG(info.st_mode);
}

std::string first_bytes(const std::string& path, size_t n) {
  const RegularFile file(path);
  std::string bytes(size_t(std::min<uint64_t>(n, file.size())), '\0');
  file.read_at(0, bytes.data(), bytes.size());
  return bytes;
}

std::string printable(const std::string& bytes) {
  std::string text;
  for (unsigned char c : bytes)
    text += (c >= 32 && c < 127 && c != '"' && c != '\\') ? std::string(1, char(c)) : fmt::format("\\x{:02x}", c);
  return text;
}

std::vector<std::string> expand_glob(const std::string& pattern) {
  glob_t found{};
  std::vector<std::string> files;
  if (::glob(pattern.c_str(), 0, nullptr, &found) == 0)
    for (size_t i = 0; i < found.gl_pathc; ++i) files.emplace_back(found.gl_pathv[i]);
  ::globfree(&found);
  std::sort(files.begin(), files.end());
  return files;
}

// PREFIX.idx starts with the magic of its format: trainer's TRAINIDX or Megatron's MMIDIDX.
recipe::DataFormat detect_prefix_format(const std::string& prefix) {
  const std::string magic = first_bytes(prefix + ".idx", 9);
  if (magic.size() >= 8 && std::memcmp(magic.data(), kIndexMagic, 8) == 0) return recipe::DataFormat::Trainer;
  if (magic.size() == 9 && std::memcmp(magic.data(), kMegatronMagic, 9) == 0) return recipe::DataFormat::Megatron;
  throw UserError(fmt::format("{}.idx: starts with \"{}\", neither trainer's \"TRAINIDX\" nor Megatron-LM's "
                              "\"MMIDIDX\\x00\\x00\"; set data.format if the files are of a known format",
                              prefix, printable(magic)));
}

}  // namespace

std::unique_ptr<TokenSource> open_token_source(const std::string& path, recipe::DataFormat format,
                                               int64_t vocab_size) {
  using recipe::DataFormat;
  // A glob: llm.c shards, concatenated in name order.
  if (path.find_first_of("*?[") != std::string::npos) {
    if (format != DataFormat::Auto && format != DataFormat::Llmc)
      throw UserError(fmt::format("{}: a glob names llm.c shards, but data.format is \"{}\"", path, format));
    const auto files = expand_glob(path);
    if (files.empty()) throw UserError(fmt::format("{}: no file matches this pattern", path));
    return std::make_unique<LlmcShards>(LlmcShards::open(path, files, vocab_size));
  }
  // One of a prefix's two files names the prefix.
  std::string prefix = path;
  for (const char* extension : {".bin", ".idx"}) {
    const std::string ext = extension;
    if (path.size() > ext.size() && path.ends_with(ext) && is_file(path.substr(0, path.size() - ext.size()) + ".idx") &&
        !is_file(path + ".bin"))
      prefix = path.substr(0, path.size() - ext.size());
  }
  DataFormat chosen = format;
  if (chosen == DataFormat::Auto) {
    if (is_file(prefix + ".idx")) {
      chosen = detect_prefix_format(prefix);
    } else if (is_file(path)) {
      const std::string magic = first_bytes(path, 8);
      int32_t word = 0;
      if (magic.size() >= 4) std::memcpy(&word, magic.data(), 4);
      if (word == kLlmcMagicGpt2 || word == kLlmcMagicLlama3)
        chosen = DataFormat::Llmc;
      else if (magic.size() == 8 && std::memcmp(magic.data(), kTokenMagic, 8) == 0)
        throw UserError(fmt::format("{}: a trainer token file without its index {}.idx", path,
                                    path.ends_with(".bin") ? path.substr(0, path.size() - 4) : path));
      else
        throw UserError(fmt::format("{}: not a known token file: it starts with \"{}\" (expected an llm.c shard, or a "
                                    "prefix P of P.bin and P.idx in trainer's or Megatron-LM's format)",
                                    path, printable(magic)));
    } else if (is_file(prefix + ".bin")) {
      chosen = DataFormat::Trainer;  // reports the missing index
    } else {
      struct stat info {};
      if (::stat(path.c_str(), &info) == 0) RegularFile{path};  // there, but a FIFO, a device or a directory: says which
      throw UserError(fmt::format("{}: no such file, and no {}.bin and {}.idx (data.paths takes a prefix, one of its "
                                  "two files, an llm.c shard or a glob of shards)",
                                  path, prefix, prefix));
    }
  }
  if (chosen == DataFormat::Trainer) return std::make_unique<TokenFile>(TokenFile::open(prefix, vocab_size));
  if (chosen == DataFormat::Megatron) return std::make_unique<MegatronFile>(MegatronFile::open(prefix, vocab_size));
  return std::make_unique<LlmcShards>(LlmcShards::open(path, {path}, vocab_size));
}

}  // namespace trainer::data
