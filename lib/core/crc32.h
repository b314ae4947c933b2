#pragma once
// CRC-32 (the zlib / IEEE 802.3 polynomial), as Python's zlib.crc32 computes it, so a checkpoint's
// checksums can be verified outside trainer. zlib's implementation: about 4 GB/s per core here.
#include <cstddef>
#include <cstdint>
#include <string>

namespace trainer {

// Continues a running CRC (start with 0).
uint32_t crc32_update(uint32_t crc, const void* data, size_t size);

// The CRC-32 and size of a whole file; throws std::runtime_error naming it when it cannot be read.
struct FileChecksum {
  uint64_t bytes = 0;
  uint32_t crc32 = 0;
};
FileChecksum checksum_file(const std::string& path);

}  // namespace trainer
