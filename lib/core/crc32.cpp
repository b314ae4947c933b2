#include "core/crc32.h"

#include <fmt/format.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <vector>

namespace trainer {

uint32_t crc32_update(uint32_t crc, const void* data, size_t size) {
  // zlib's crc32 takes a 32-bit length; feed it in pieces.
  const auto* p = static_cast<const Bytef*>(data);
  while (size > 0) {
    const auto n = static_cast<uInt>(std::min<size_t>(size, size_t(1) << 30));
    crc = static_cast<uint32_t>(::crc32(crc, p, n));
    p += n;
    size -= n;
  }
  return crc;
}

FileChecksum checksum_file(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) throw std::runtime_error(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
  FileChecksum result;
  std::vector<unsigned char> buffer(1 << 20);
  size_t n;
  while ((n = std::fread(buffer.data(), 1, buffer.size(), f)) > 0) {
    result.crc32 = crc32_update(result.crc32, buffer.data(), n);
    result.bytes += n;
  }
  const bool failed = std::ferror(f);
  std::fclose(f);
  if (failed) throw std::runtime_error(fmt::format("{}: read error", path));
  return result;
}

}  // namespace trainer
