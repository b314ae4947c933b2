#pragma once
// TensorBoard event files (logging.tensorboard_dir), written by rank 0: TFRecord framing (length,
// masked CRC-32C of the length, the record, masked CRC-32C of the record) around tensorflow.Event
// protocol buffers: a first event with file_version "brain.Event:2", then one event per logged
// step whose Summary holds a simple_value per scalar. The few protobuf fields are encoded here by
// hand (varint, fixed64, fixed32, length-delimited): linking a second protobuf runtime next to
// libtorch's risks clashing symbols, and the test reads the files with TensorBoard's own reader.
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

namespace trainer::metrics {

class TensorBoardWriter {
 public:
  // Creates `dir` (and its parents) and a new event file in it,
  // events.out.tfevents.<unix seconds>.<host>.<pid>.trainer. Throws trainer::UserError naming the
  // directory and the system's reason when it cannot be created or written.
  explicit TensorBoardWriter(const std::string& dir);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  // One event at `step` (wall time now) with one scalar per (tag, value), flushed to the file.
  // Throws std::runtime_error naming the file when writing fails.
  void add_scalars(int64_t step, const std::vector<std::pair<std::string, double>>& scalars);

  const std::string& path() const { return path_; }

 private:
  void write_record(const std::string& record);

  std::string path_;
  FILE* file_ = nullptr;
};

// The protobuf bytes of a tensorflow.Event (exposed for tests): wall_time, step, and either a
// file_version or a Summary of simple values.
std::string encode_event(double wall_time, int64_t step, const std::string& file_version,
                         const std::vector<std::pair<std::string, double>>& scalars);

}  // namespace trainer::metrics
