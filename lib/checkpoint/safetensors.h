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

// The format's name of a dtype ("F32", "BF16", "I32", ...); "unsupported" for others.
std::string safetensors_dtype_name(c10::ScalarType dtype);

class SafetensorsReader {
 public:
  // Reads and validates the header as the format requires, before anything is allocated: only a
  // regular file; a header length inside the file; a JSON object (nesting limited) followed only by
  // spaces; every tensor an object with a known dtype, a shape of sizes >= 0, and data_offsets
  // [begin, end] whose length is the shape's bytes (no 64-bit overflow) inside the data; the tensors
  // tile the data exactly (no overlap, no gap, no trailing bytes); __metadata__ an object of strings.
  // Each failure throws UserError naming the file and the tensor or field.
  explicit SafetensorsReader(const std::string& path);
  const std::string& path() const { return path_; }
  std::vector<std::string> names() const;
  bool contains(const std::string& name) const { return entries_.count(name) > 0; }
  std::vector<int64_t> shape(const std::string& name) const;
  c10::ScalarType dtype(const std::string& name) const;
  // A CPU tensor with the stored dtype and shape. UserError naming the file when it is no longer a
  // regular file or has shrunk since the header was read.
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
