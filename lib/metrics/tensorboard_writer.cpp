#include "metrics/tensorboard_writer.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <stdexcept>

#include "core/crc32c.h"
#include "core/error.h"

namespace trainer::metrics {

namespace {

// Protocol-buffer wire format: a field's key is (number << 3 | wire type).
void varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(char((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out.push_back(char(v));
}

template <typename T>
void little_endian(std::string& out, T v) {
  for (size_t i = 0; i < sizeof(T); ++i) out.push_back(char((v >> (8 * i)) & 0xFF));
}

void key(std::string& out, int field, int wire_type) { varint(out, uint64_t(field) << 3 | uint64_t(wire_type)); }

void bytes_field(std::string& out, int field, const std::string& bytes) {
  key(out, field, 2);
  varint(out, bytes.size());
  out += bytes;
}

double seconds_since_epoch() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

std::string encode_event(double wall_time, int64_t step, const std::string& file_version,
                         const std::vector<std::pair<std::string, double>>& scalars) {
  std::string event;
  uint64_t wall_bits;
  std::memcpy(&wall_bits, &wall_time, sizeof wall_bits);
  key(event, 1, 1);  // Event.wall_time: double
  little_endian(event, wall_bits);
  key(event, 2, 0);  // Event.step: int64
  varint(event, uint64_t(step));
  if (!file_version.empty()) bytes_field(event, 3, file_version);  // Event.file_version
  if (!scalars.empty()) {
    std::string summary;
    for (const auto& [tag, value] : scalars) {
      std::string v;
      bytes_field(v, 1, tag);  // Summary.Value.tag
      const float f = float(value);
      uint32_t bits;
      std::memcpy(&bits, &f, sizeof bits);
      key(v, 2, 5);  // Summary.Value.simple_value: float
      little_endian(v, bits);
      bytes_field(summary, 1, v);  // Summary.value (repeated)
    }
    bytes_field(event, 5, summary);  // Event.summary
  }
  return event;
}

TensorBoardWriter::TensorBoardWriter(const std::string& dir) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error)
    throw UserError(fmt::format("logging.tensorboard_dir: cannot create {}: {}", dir, error.message()));
  char host[256] = "localhost";
  ::gethostname(host, sizeof host - 1);
  path_ = fmt::format("{}/events.out.tfevents.{}.{}.{}.trainer", dir, int64_t(seconds_since_epoch()), host, ::getpid());
  file_ = std::fopen(path_.c_str(), "wb");
  if (!file_)
    throw UserError(fmt::format("logging.tensorboard_dir: cannot write {}: {}", path_, std::strerror(errno)));
  write_record(encode_event(seconds_since_epoch(), 0, "brain.Event:2", {}));
  std::fflush(file_);
}

TensorBoardWriter::~TensorBoardWriter() {
  if (file_) std::fclose(file_);
}

void TensorBoardWriter::add_scalars(int64_t step, const std::vector<std::pair<std::string, double>>& scalars) {
  write_record(encode_event(seconds_since_epoch(), step, "", scalars));
  if (std::fflush(file_) != 0) throw std::runtime_error(fmt::format("cannot write {}: {}", path_, std::strerror(errno)));
}

void TensorBoardWriter::write_record(const std::string& record) {
  // TFRecord: uint64 length, masked CRC-32C of those 8 bytes, the data, masked CRC-32C of the data.
  std::string frame;
  little_endian(frame, uint64_t(record.size()));
  little_endian(frame, masked_crc32c(frame.data(), 8));
  frame += record;
  little_endian(frame, masked_crc32c(record.data(), record.size()));
  if (std::fwrite(frame.data(), 1, frame.size(), file_) != frame.size())
    throw std::runtime_error(fmt::format("cannot write {}: {}", path_, std::strerror(errno)));
}

}  // namespace trainer::metrics
