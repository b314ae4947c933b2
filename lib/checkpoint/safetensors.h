#pragma once
// The safetensors file format (readable by Python's `safetensors`): an 8-byte little-endian header
// length, a JSON header {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {...}},
// then the raw little-endian tensor bytes.
#include <ATen/core/Tensor.h>

#include <map>
#include <string>
#include <vector>

#include "checkpoint/file_writer.h"
#include "core/crc32.h"

namespace trainer::checkpoint {

struct SafetensorsEntry {
  std::string name;
  at::Tensor tensor;  // any device; written as its bytes
};

// What a file's header says about one tensor.
struct SafetensorsMeta {
  std::string name;
  c10::ScalarType dtype;
  std::vector<int64_t> shape;
};

// Where everything goes in a file: `prefix` (the 8-byte header length and the JSON header, padded
// to 8 bytes) comes first, then each tensor's bytes at prefix.size() + offsets[i], packed.
struct SafetensorsLayout {
  std::string prefix;
  std::vector<uint64_t> offsets;
  uint64_t data_bytes = 0;
};

// Throws std::runtime_error naming `path` for an unsupported dtype or a repeated name.
SafetensorsLayout layout_safetensors(const std::string& path, const std::vector<SafetensorsMeta>& entries,
                                     const std::map<std::string, std::string>& metadata);

// Writes the file and fsyncs it; returns its size and CRC-32, computed while writing (no second
// read). `writer` (reused for its staging buffers) may be null. Throws std::runtime_error naming
// the file on I/O failure.
FileChecksum write_safetensors(const std::string& path, const std::vector<SafetensorsEntry>& entries,
                               const std::map<std::string, std::string>& metadata = {}, FileWriter* writer = nullptr);

class SafetensorsReader {
 public:
  // Reads and validates the header; a missing, truncated or malformed file throws UserError naming it.
  explicit SafetensorsReader(const std::string& path);
  const std::string& path() const { return path_; }
  std::vector<std::string> names() const;
  bool contains(const std::string& name) const { return entries_.count(name) > 0; }
  std::vector<int64_t> shape(const std::string& name) const;
  // A CPU tensor with the stored dtype and shape.
  at::Tensor read(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  struct Entry {
    c10::ScalarType dtype;
    std::vector<int64_t> shape;
    uint64_t begin = 0, end = 0;
  };
  std::string path_;
  uint64_t data_start_ = 0;
  std::map<std::string, Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace trainer::checkpoint
