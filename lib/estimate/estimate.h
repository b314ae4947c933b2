#pragma once
// The estimator's entry point: per-rank peak memory and step time of a recipe on a mesh, without
// a GPU or a process group. Torch-free and fast (a few microseconds for any model size), so the
// training loop can call it to print predicted beside measured, and `trainer plan` can call it
// for every candidate configuration.
//
//   const auto job = estimate::estimate_job(loaded.recipe, *loaded.mesh, &gpu);  // or nullptr on CPU
//   job.peak_bytes    // worst rank's predicted peak allocated tensor bytes
//   job.step_time_s   // predicted seconds per optimizer step (GPU only)
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "estimate/document_work.h"
#include "estimate/hardware.h"
#include "estimate/job_layout.h"
#include "estimate/memory_model.h"
#include "recipe/mesh_shape.h"
#include "recipe/recipe.h"

namespace trainer::estimate {

struct EstimateOptions {
  int64_t cpu_threads = 1;     // CPU only: intra-op threads (per-thread attention buffers)
  // Time memory-bound ops as fused in Megatron/TE or torch.compile: a third of the unfused ops' traffic
  // (the replay then runs the unfused ops, whatever training.fused_kernels says).
  bool fused_kernels = false;
  bool compute_time = true;    // false: memory only (faster; plan's first pass)
  const ModelCounts* counts = nullptr;  // count_model(recipe.model, seq_len), when already known
  bool describe_peak = true;   // false: leave the peak_phase texts empty (faster)
};

// Seconds per optimizer step on the slowest pipeline stage, by cause. Exposed communication is
// what overlap does not hide.
struct TimeBreakdown {
  double gemm_s = 0;            // matrix products, forward and backward (and recompute)
  double attention_s = 0;       // flash attention cores
  double memory_bound_s = 0;    // norms, rotary, SwiGLU, residuals, softmax and loss
  double recompute_s = 0;       // of the above, spent recomputing (selective or full)
  double tp_comm_s = 0;         // tensor/sequence-parallel collectives (exposed)
  double tp_hidden_s = 0;       // tensor/sequence-parallel communication hidden behind GEMMs
  double cp_comm_s = 0;         // context parallel (exposed part of the ring, or Ulysses all-to-all)
  double ep_comm_s = 0;         // expert dispatch and combine (exposed)
  double pp_comm_s = 0;         // activations and gradients between stages (exposed)
  double microbatch_s = 0;      // one micro-batch through the slowest stage: the sum of the above
  double bubble_s = 0;          // pipeline idle time
  double dp_comm_s = 0;         // gradient reduction, total
  double dp_exposed_s = 0;      // of which not hidden behind the last micro-batch's backward
  double param_gather_s = 0;    // ZeRO-1/2 all-gather of updated parameters (exposed)
  double optimizer_s = 0;       // gradient norm, clipping, AdamW (memory-bound)
  double kernels = 0;           // kernels and collectives per step, as the replay counts them
  double host_s = 0;            // the host's time launching them (host.us_per_kernel each)
  double host_exposed_s = 0;    // of which the GPU waits for: host_s beyond the GPU's own time
  double step_s = 0;
};

struct JobEstimate {
  recipe::MeshShape mesh;
  std::string device;                // GPU profile name, or "cpu"
  std::string schedule;              // pipeline schedule used
  int64_t microbatches = 1;          // per step per pipeline
  ModelCounts counts;

  // Memory (bytes, per rank). The predicted peak is the allocator's peak *allocated* bytes.
  std::vector<StageMemory> stages;   // one rank of each pipeline stage
  int64_t worst_stage = 0;
  double peak_bytes = 0;             // worst rank, balanced expert routing
  double peak_bytes_worst_routing = 0;  // MoE: the dropless worst case (= peak_bytes without MoE)
  double reserved_bytes = 0;         // worst rank: allocator reserved (GPU)
  double device_total_bytes = 0;     // worst rank: reserved + CUDA context, libraries, NCCL (GPU)
  double capacity_bytes = 0;         // device memory (GPU; 0 on CPU)
  bool fits = true;                  // device_total_bytes <= capacity_bytes (GPU)

  // Time (GPU only; has_time false on CPU or when not asked for).
  bool has_time = false;
  TimeBreakdown time;
  double step_time_s = 0;
  double tokens_per_step = 0;
  double tokens_per_s = 0;
  double tokens_per_s_per_gpu = 0;
  double model_flops_per_step = 0;   // 6N + 12 L H Q T per token (model_counts.h), times tokens
  double tflops_per_gpu = 0;         // model TFLOP/s per GPU
  double mfu = 0;                    // tflops_per_gpu / the dense peak of the training dtype
  // data.document_masking with a described length distribution: the attention work and balance
  // the time and the model FLOPs above count (document_work.h).
  std::optional<DocumentWork> documents;
  bool documents_unknown = false;  // masking without a described distribution: full attention counted
};

// Replays of one micro-batch (model_micro_batch) by rank shape, for callers that estimate many
// configurations sharing shapes (trainer plan).
class ModelCache {
 public:
  const MicroBatchModel& get(const RankShape& shape);
  size_t size() const { return models_.size(); }

 private:
  std::map<std::vector<int64_t>, MicroBatchModel> models_;
};

// Predicts `recipe` on `mesh` (the recipe must have passed validate_recipe at mesh.world_size).
// `gpu` nullptr: the CPU (`trainer run --cpu`): memory only, no allocator overheads.
JobEstimate estimate_job(const recipe::Recipe& recipe, const recipe::MeshShape& mesh, const HardwareProfile* gpu,
                         const EstimateOptions& options = {}, ModelCache* cache = nullptr);

// Adds the step time to an estimate made with compute_time false (plan: time only what fits).
void add_step_time(JobEstimate& estimate, const recipe::Recipe& recipe, const HardwareProfile& gpu,
                   const EstimateOptions& options = {}, ModelCache* cache = nullptr);

}  // namespace trainer::estimate
