#pragma once
// One micro-batch on one rank as the model's own replay describes it (model/transformer_replay.h:
// each layer's replay lives beside the layer in lib/model, torch-free), under the names the
// estimator composes into stages, schedules and time (memory_model.h, time_model.h).
#include "counting/replay.h"
#include "counting/tensor_timeline.h"
#include "model/transformer_replay.h"

namespace trainer::estimate {

using counting::CommGroup;
using counting::CommKind;
using counting::CommOp;
using counting::Costs;
using counting::Device;
using counting::GemmShape;
using counting::LayerSegments;
using counting::RankShape;
using counting::Recompute;
using counting::Segment;
using counting::Timeline;
using model::replays::MicroBatchModel;
using model::replays::model_micro_batch;

}  // namespace trainer::estimate
