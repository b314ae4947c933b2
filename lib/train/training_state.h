#pragma once
#include <functional>
#include <optional>
// What a checkpoint holds for training to continue exactly: parameters and optimizer state by
// global name (with global shapes and slice offsets), the step, the data position and the RNG.
#include <map>
#include <string>

#include "checkpoint/checkpoint.h"
#include "core/error.h"
#include "mesh/process_groups.h"
#include "model/transformer.h"
#include "engine/zero/distributed_optimizer.h"
#include "recipe/load.h"

namespace trainer::train {

struct Progress {
  int64_t step = 0;              // optimizer steps completed
  int64_t consumed_samples = 0;  // global samples consumed
};

// What this rank writes of a checkpoint: each parameter slice and the optimizer state are held by
// the ranks with the same slice (engine/replicas.h) and spread over them
// (shard_assignment.h), so each unique slice is written once; ZeRO-1 fragments are written by
// their owner. The records point at the live tensors. `parameter_records`: the parameters'
// records when the optimizer holds them (ZeRO-3's shards; possibly none on a rank whose shards are
// padding only); nullopt: taken from the model.
checkpoint::CheckpointContent capture_training_state(const model::Transformer& model,
                                                     std::vector<checkpoint::TensorRecord> optimizer_records,
                                                     int64_t optimizer_steps, const recipe::LoadedRecipe& recipe,
                                                     const Progress& progress, const mesh::ProcessGroups& groups,
                                                     std::optional<std::vector<checkpoint::TensorRecord>> parameter_records = std::nullopt);

// Where a loaded parameter slice (this rank's, without padding rows) goes: null writes it into
// the parameter; ZeRO-3 writes it into its shards (OptimizerDriver::parameter_writer).
using ParameterWriter = std::function<void(model::Parameter&, const at::Tensor& real_slice)>;

// The checkpoint holds another model than the recipe's: a parameter missing, of another global
// shape, or a weight the model has no parameter for. The caller, which knows the recipe, adds the
// recipe values that differ and what to do (run_start.cpp).
class CheckpointOfAnotherModel : public UserError {
 public:
  using UserError::UserError;
};

// Loads the parameters (this rank's slices) and the RNG state; returns the progress recorded.
// A tensor missing from the checkpoint or of another global shape is a CheckpointOfAnotherModel
// naming both.
Progress restore_model(const checkpoint::LoadedCheckpoint& loaded, model::Transformer& model,
                       const ParameterWriter& write = nullptr);

// Initialises the parameters (this rank's slices) from Hugging Face weights in `dir`
// (model.init_from); returns how many were loaded. A missing tensor or another shape is a
// UserError naming the directory and the tensor, except a multi-token prediction module's (which
// transformers does not save): it keeps its initial value, counted in *not_in_weights.
// DeepSeek's copies of the embedding and head inside the modules are ignored (trainer shares them).
int64_t load_hf_weights(const std::string& dir, model::Transformer& model, const ParameterWriter& write = nullptr,
                        int64_t* not_in_weights = nullptr);

// Reads optimizer tensors from `loaded` for OptimizerDriver::load_state (one slice at a time).
// Returns nothing only for state that may be missing (checkpoint::required_optimizer_state: the
// master weights of a parameter stored in fp32); any other missing tensor is a UserError naming it.
engine::StateReader optimizer_state_reader(const checkpoint::LoadedCheckpoint& loaded);

}  // namespace trainer::train
