#pragma once
// What a checkpoint's manifest.json must hold before anything it names is opened or allocated
// (docs/checkpoint.md, "What a reader checks"). A manifest comes from a disk that may fail or from
// someone else's hands: every field is checked for type, length and range, shard files must be
// plain names inside the step directory, and every tensor's shards must lie inside its global
// shape and cover it without overlap (a whole slice may be listed twice, as a second copy of the
// same data), so that no read goes outside the directory and no allocation is
// larger than the data the files hold. Errors are UserErrors naming the manifest and the JSON path
// of the field ("DIR/manifest.json: tensors."w".shards[0].offsets: 1 value for a 2-D tensor").
#include <c10/core/ScalarType.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "recipe/recipe.h"

namespace trainer::checkpoint {

// The manifest format version this trainer writes and reads.
inline constexpr int64_t kManifestVersion = 1;

// A shard file the manifest lists: a plain name inside the step directory, its size and CRC-32.
struct ManifestFile {
  std::string name;
  uint64_t bytes = 0;
  uint32_t crc32 = 0;
};

// Checks everything in the manifest that needs no file: format, version, step, consumed_samples,
// recipe, mesh, extra, files and every tensor record (dtype, global shape, shards, flat ranges and
// that the shards tile the global tensor). `source` names the manifest in errors. Returns the files.
std::vector<ManifestFile> check_manifest(const nlohmann::json& manifest, const std::string& source);

// What a shard file's header says about one key, or nothing when the file has no such key.
struct StoredEntry {
  c10::ScalarType dtype;
  std::vector<int64_t> shape;
};
using EntryLookup = std::function<std::optional<StoredEntry>(const std::string& file, const std::string& key)>;

// Checks every shard record of a manifest that passed check_manifest against its file: the key is
// there, with the record's dtype, and with the slice's shape (a flat_range [b, e): e - b elements).
void check_shard_entries(const nlohmann::json& manifest, const std::string& source, const EntryLookup& lookup);

// The recipe a manifest that passed check_manifest was saved with, typed (`ckpt export` writes its
// config.json from it). Every key the schema knows is checked as in a recipe file (type and range),
// a key this trainer added since the checkpoint was written takes its default, and keys it does not
// know are ignored (another version's). UserError naming the manifest and "recipe.KEY".
recipe::Recipe manifest_recipe(const nlohmann::json& manifest, const std::string& source);

// The dtype a manifest names (c10's names: "Float", "BFloat16", ...), or nothing.
std::optional<c10::ScalarType> manifest_dtype(const std::string& name);

// "optimizer.<kind>.<parameter>" -> "<parameter>"; "" for a name that is not optimizer state.
std::string parameter_of_optimizer_state(const std::string& name);

// The optimizer state a checkpoint holds for every parameter `name` (a tensor "model.*" or
// "lm_head.weight") of dtype `dtype` and global shape `shape`, written by the optimizer of
// `optimizer` (the recipe's optimizer section; null or without a name: AdamW): its step count, the
// fp32 master weights unless the parameter is itself fp32 (then it is its own master), and the
// optimizer's state (AdamW: exp_avg and exp_avg_sq; Lion: momentum; 8-bit AdamW: the codes and
// block maxima of each moment, or fp32 moments for vectors and tensors under min_8bit_size; Muon:
// momentum for layer matrices, AdamW's moments for the rest). `has` says whether the checkpoint
// holds a tensor: Muon's layer matrices are the matrices without AdamW moments (which matrices
// are layer matrices is the model's knowledge, model::Parameter::layer_matrix).
std::vector<std::string> required_optimizer_state(const std::string& name, c10::ScalarType dtype,
                                                  const std::vector<int64_t>& shape, const nlohmann::json& optimizer,
                                                  const std::function<bool(const std::string&)>& has);

// What a resume needs and the manifest's tensors lack, in name order: the required optimizer
// state (above) of every parameter, and the parameter of every optimizer state.
std::vector<std::string> missing_training_state(const nlohmann::json& manifest);

}  // namespace trainer::checkpoint
