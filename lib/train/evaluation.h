#pragma once
// Validation (evaluation.*): the loss on held-out data, forward only and without gradients, over
// evaluation.steps global batches. Every evaluation reads the same held-out samples (global batch k
// of the held-out data, split over the data-parallel ranks like training batches), so the figures
// of one run are comparable with each other and with any mesh's.
#include <c10/core/Device.h>

#include "data/dataset.h"
#include "mesh/process_groups.h"
#include "model/transformer.h"
#include "recipe/load.h"
#include "train/pipeline_plan.h"

namespace trainer::train {

struct EvaluationResult {
  double loss = 0;        // mean over the real targets of the held-out batches, nats
  double perplexity = 0;  // exp(loss)
  int64_t tokens = 0;     // targets counted
};

// With pp > 1 the stages run the forward-only schedule; the loss is summed on the last chunk's stage.
EvaluationResult evaluate(const model::Transformer& model, const data::Dataset& held_out, const recipe::Recipe& recipe,
                          const recipe::MeshShape& mesh, const mesh::ProcessGroups& groups,
                          const PipelinePlan& pipeline, c10::Device device);

}  // namespace trainer::train
