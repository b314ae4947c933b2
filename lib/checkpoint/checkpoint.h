#pragma once
// Checkpoint directories (DESIGN.md section 7, docs/checkpoint.md):
//   DIR/step-00000100/manifest.json              step, consumed samples, recipe, mesh, files with
//                                                sizes and CRC-32s, every tensor's global shape,
//                                                dtype and shards (file, offsets, shape)
//   DIR/step-00000100/shard-RRRRR.safetensors    what rank RRRRR wrote
//   DIR/latest                                   name of the newest committed step directory
// Every rank writes its own shard file into DIR/step-NNNNNNNN.tmp/ and reports it durable; rank 0
// then writes the manifest, renames the directory into place and moves `latest`. A crash at any
// point leaves the previous checkpoint intact. Tensor names are global; shapes and offsets are
// recorded so that any slice can be read back onto another mesh.
#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/safetensors.h"

namespace trainer::checkpoint {

// A piece of a global tensor that this rank holds.
struct TensorRecord {
  std::string name;
  at::Tensor tensor;                  // the data (any device)
  std::vector<int64_t> global_shape;  // of the whole tensor
  std::vector<int64_t> offsets;       // of the rectangular slice in the global tensor
  std::vector<int64_t> slice_shape;   // of that slice
  // When set, `tensor` is 1-D and holds only elements [first, second) of the slice in row-major
  // order (a ZeRO shard's fragment); otherwise it is the whole slice.
  std::optional<std::pair<int64_t, int64_t>> flat_range;
  // Set when the same data is on several ranks (the group named `group`, `count` ranks, this one
  // at `position`): only one of them writes it (shard_assignment.h).
  struct Replication {
    std::string group;
    int64_t position = 0;
    int64_t count = 1;
  };
  std::optional<Replication> replicated;

  // The whole tensor.
  static TensorRecord whole(std::string name, at::Tensor tensor);
  // A rectangular slice at `offsets` of a tensor of `global_shape`.
  static TensorRecord slice(std::string name, at::Tensor tensor, std::vector<int64_t> global_shape,
                            std::vector<int64_t> offsets);
  // Elements [begin, begin + data.numel()) of the slice (offsets, slice_shape), flattened.
  static TensorRecord flat(std::string name, at::Tensor data, std::vector<int64_t> global_shape,
                           std::vector<int64_t> offsets, std::vector<int64_t> slice_shape, int64_t begin);
};

struct CheckpointContent {
  int64_t step = 0;              // optimizer steps completed
  int64_t consumed_samples = 0;  // global samples consumed (the data position)
  nlohmann::json recipe;         // the resolved recipe
  nlohmann::json mesh;           // world size and parallel sizes
  nlohmann::json extra;          // anything else, stored in the manifest
  std::vector<TensorRecord> tensors;  // what this rank writes
};

// How a rank's records go into its shard file: the file's name, each record's key in the file
// (the name, or "name#1", ... for further pieces of the same tensor), the header entries, and the
// rank's report for the manifest without the file's size and checksum (report["file"] is null
// when there are no records).
struct ShardPlan {
  std::string file;
  std::vector<SafetensorsMeta> entries;
  std::map<std::string, std::string> metadata;
  nlohmann::json report;
};
ShardPlan plan_rank_shard(int64_t rank, const std::vector<TensorRecord>& records);

// DIR/step-NNNNNNNN.tmp/FILE, creating the staging directory (any rank may be first).
std::string staging_file(const std::string& dir, int64_t step, const std::string& file);

// Writes this rank's records (CPU tensors) as DIR/step-NNNNNNNN.tmp/shard-RRRRR.safetensors,
// fsynced. Returns the report rank 0 needs for the manifest: {"file": {name, bytes, crc32} or
// null when there is nothing to write, "tensors": {name: {"dtype", "global_shape", "shards"}}}.
// `writer` (kept for its staging buffers) may be null. Throws std::runtime_error naming the file
// on I/O failure.
nlohmann::json write_rank_shard(const std::string& dir, int64_t step, int64_t rank,
                                const std::vector<TensorRecord>& records, FileWriter* writer = nullptr);

// Rank 0, once every rank's report says its shard is durable: writes the manifest (the metadata
// of `content`, the files and tensors of all reports), renames the step directory into place and
// moves `latest`. Returns the step directory.
std::string commit_checkpoint(const std::string& dir, const CheckpointContent& content,
                              const std::vector<nlohmann::json>& reports);

// Removes the unfinished DIR/step-NNNNNNNN.tmp of a failed save (committed checkpoints untouched).
void discard_staging(const std::string& dir, int64_t step);

// Deletes committed checkpoints beyond the newest `keep` (0: keep all), oldest first, never `protect`.
void prune_checkpoints(const std::string& dir, int64_t keep, const std::string& protect);

// The newest committed checkpoint under DIR (by `latest`, else the highest step directory that
// has a manifest), or nothing. Step directories without a manifest are skipped with a warning.
// `latest` must be a regular file holding the name of a step directory directly inside DIR
// (step-NNNNNNNN): anything else (a path, "..", a FIFO, a huge file) is a UserError naming it and
// the fix; a well-formed name whose directory has no manifest is skipped with a warning.
std::optional<std::string> find_latest_checkpoint(const std::string& dir);

class LoadedCheckpoint {
 public:
  // Opens a step directory, or a checkpoint directory (then its latest). UserError, naming the file
  // and the field, when there is no committed checkpoint, the manifest is malformed in any field
  // (manifest_check.h), a shard file is missing, not a regular file, of another size or CRC-32, or
  // does not hold a record's key with its dtype and shape. Everything is checked here, before any
  // tensor is read, so that read() only allocates what the files hold.
  explicit LoadedCheckpoint(const std::string& path);
  const std::string& path() const { return path_; }
  const nlohmann::json& manifest() const { return manifest_; }
  int64_t step() const { return manifest_.at("step").get<int64_t>(); }
  int64_t consumed_samples() const { return manifest_.at("consumed_samples").get<int64_t>(); }
  bool contains(const std::string& name) const;
  std::vector<int64_t> global_shape(const std::string& name) const;
  // The slice [offsets, offsets + shape) of a global tensor (CPU, stored dtype), assembled from
  // every shard that overlaps it. UserError when the tensor is missing or the slice is not inside
  // its global shape (a request of another model).
  at::Tensor read(const std::string& name, const std::vector<int64_t>& offsets, const std::vector<int64_t>& shape) const;
  // The whole global tensor.
  at::Tensor read(const std::string& name) const;

 private:
  const SafetensorsReader& reader(const std::string& file, const std::string& tensor) const;

  std::string path_;
  nlohmann::json manifest_;
  // By file name: a checkpoint of 512 ranks has about 100k records to look up (a scan per record
  // took 6 s of a 7.8 s open).
  std::map<std::string, SafetensorsReader> shards_;
};

}  // namespace trainer::checkpoint
