#pragma once
// Checkpoint directories (DESIGN.md section 7), written by one process for now:
//   DIR/step-00000100/manifest.json   step, consumed samples, recipe, mesh, every tensor's global
//                                     shape, dtype and shards (file, offsets, shape)
//   DIR/step-00000100/shard-00000.safetensors
//   DIR/latest                        name of the newest committed step directory
// A step directory is written under a temporary name and renamed into place once complete
// (manifest last), then `latest` is replaced atomically; so a crash leaves the previous
// checkpoint intact. Tensor names are global; shapes and offsets are recorded for resharding.
#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/safetensors.h"

namespace trainer::checkpoint {

struct TensorRecord {
  std::string name;
  at::Tensor tensor;                  // the local slice
  std::vector<int64_t> global_shape;  // of the whole tensor
  std::vector<int64_t> offsets;       // of the local slice in the global tensor
};

struct CheckpointContent {
  int64_t step = 0;              // optimizer steps completed
  int64_t consumed_samples = 0;  // global samples consumed (the data position)
  nlohmann::json recipe;         // the resolved recipe
  nlohmann::json mesh;           // world size and parallel sizes
  nlohmann::json extra;          // anything else (e.g. RNG states), stored in the manifest
  std::vector<TensorRecord> tensors;
};

// Writes DIR/step-NNNNNNNN and moves `latest` to it; deletes older committed checkpoints beyond
// `keep` (0: keep all). Returns the step directory. Throws std::runtime_error on I/O failure,
// leaving any previous checkpoint untouched.
std::string save_checkpoint(const std::string& dir, const CheckpointContent& content, int64_t keep);

// The newest committed checkpoint under DIR (by `latest`, else the highest step directory that
// has a manifest), or nothing. Step directories without a manifest are skipped with a warning.
std::optional<std::string> find_latest_checkpoint(const std::string& dir);

class LoadedCheckpoint {
 public:
  // Opens a step directory, or a checkpoint directory (then its latest). UserError when there is
  // no committed checkpoint or a file is missing or damaged.
  explicit LoadedCheckpoint(const std::string& path);
  const std::string& path() const { return path_; }
  const nlohmann::json& manifest() const { return manifest_; }
  int64_t step() const { return manifest_.at("step").get<int64_t>(); }
  int64_t consumed_samples() const { return manifest_.at("consumed_samples").get<int64_t>(); }
  bool contains(const std::string& name) const;
  std::vector<int64_t> global_shape(const std::string& name) const;
  // The slice [offsets, offsets + shape) of a global tensor (CPU, stored dtype).
  at::Tensor read(const std::string& name, const std::vector<int64_t>& offsets, const std::vector<int64_t>& shape) const;
  // The whole global tensor.
  at::Tensor read(const std::string& name) const;

 private:
  std::string path_;
  nlohmann::json manifest_;
  std::vector<std::unique_ptr<SafetensorsReader>> shards_;
};

}  // namespace trainer::checkpoint
