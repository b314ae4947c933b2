#pragma once
// Peak memory of one rank of each pipeline stage: the model state that lives through the step
// (parameters, gradients, optimizer states under ZeRO 0-3), the activations of the micro-batches
// the schedule keeps in flight, and the timeline of the micro-batch at its peak (micro_batch.h).
// The predicted peak is the device allocator's peak *allocated* bytes (tensors), as
// torch.cuda.max_memory_allocated and our byte-counting CPU allocator report it; reserved memory
// (x the allocator's fragmentation factor) and the device total (+ CUDA context, libraries, NCCL)
// are derived from it.
#include <cstdint>
#include <string>

#include "estimate/hardware.h"
#include "estimate/job_layout.h"
#include "estimate/pipeline_schedule.h"

namespace trainer::estimate {

// Bytes, for one rank of one stage.
struct StageMemory {
  int64_t stage = 0;
  int64_t layers = 0, moe_layers = 0;
  // Held for the whole step.
  double parameters = 0;
  double gradients = 0;
  double optimizer_states = 0;     // fp32 master weights (bf16 training), Adam moments, step counters
  double model_buffers = 0;        // rotary inverse frequencies
  double cublas_workspace = 0;     // GPU only
  double static_bytes = 0;         // the sum of the above
  // Activations.
  double activations_per_layer_dense = 0;  // saved by one layer for one micro-batch
  double activations_per_layer_moe = 0;
  double activations_microbatch = 0;       // one micro-batch after its forward on this stage
  double logits_and_loss = 0;              // of which the LM head and loss keep (last stage)
  double logits_and_loss_peak = 0;         // LM head and loss at their height (forward or backward)
  int64_t inflight_chunks = 1;             // (micro-batch, chunk) forwards held at the peak
  double inflight_microbatches = 1;        // the same in micro-batches (chunks / vpp)
  double activations_other_microbatches = 0;  // held by the in-flight micro-batches not at their peak
  double microbatch_peak = 0;              // one micro-batch's timeline at its height
  std::string microbatch_peak_at;
  double optimizer_step_transient = 0;     // fp32 gradient copies of AdamW's master-weight update
  double zero2_full_buckets = 0;           // ZeRO-2 and 3: full-size gradient buckets during backward
  double zero3_gathered = 0;               // ZeRO-3: gathered parameters at their height (with Gloo's copies on the CPU)
  // The result.
  double peak_allocated = 0;
  std::string peak_phase;
  double reserved = 0;                     // peak_allocated * fragmentation (GPU)
  double device_total = 0;                 // reserved + framework overhead (GPU)
};

struct MemoryOptions {
  parallel::ScheduleKind schedule = parallel::ScheduleKind::OneFOneB;
  int64_t zero = 0;
  double grad_bucket_bytes = 40.0 * 1024 * 1024;
  bool accumulate_unsharded = false;  // parallel.zero_accumulate_unsharded (ZeRO-2 and 3)
  bool reshard_after_forward = true;  // parallel.zero3_reshard_after_forward
  // Bytes per gradient element in the gradient buffers: 4 (fp32, the default for every dtype) or
  // the parameter dtype's (parallel.grad_reduce_dtype bf16).
  double grad_bytes = 4;
  recipe::OptimizerConfig optimizer;     // the state it keeps (optimizer_cost.h)
  double muon_temporaries = 0;           // optimizer.name muon: muon_work(recipe).largest_temporaries
  const HardwareProfile* gpu = nullptr;  // nullptr: CPU (no workspace, no overhead, no fragmentation)
  bool describe_peak = true;             // false: leave the peak_phase texts empty (faster)
};

StageMemory stage_memory(const JobLayout& job, const StageLayout& stage, const MicroBatchModel& model,
                         const MemoryOptions& options);

}  // namespace trainer::estimate
