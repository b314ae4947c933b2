#pragma once
// CRC-32C (Castagnoli), the checksum of TensorFlow's TFRecord framing, with TFRecord's masking
// (rotate right by 15, add 0xa282ead8), which TensorBoard's reader checks on every record.
#include <cstddef>
#include <cstdint>

namespace trainer {

uint32_t crc32c(const void* data, size_t size);
uint32_t masked_crc32c(const void* data, size_t size);

}  // namespace trainer
