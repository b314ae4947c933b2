#include "estimate/memory_model.h"

#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <numeric>

#include "estimate/optimizer_cost.h"

namespace trainer::estimate {

namespace {

struct ChunkRun {
  double held = 0;  // level after the forward (what the micro-batch keeps for backward)
  double peak = 0;
  // Where the peak is: a phase and, for layer phases, the layer.
  enum Phase { PreForward, LayerForward, HeadForward, HeadBackward, LayerBackward, PreBackward } phase = PreForward;
  int64_t layer = -1;
  bool first = false, last = false;
};

std::string describe(const ChunkRun& run) {
  switch (run.phase) {
    case ChunkRun::PreForward: return run.first ? "embedding forward" : "receiving the stage input";
    case ChunkRun::LayerForward: return fmt::format("forward of layer {}", run.layer);
    case ChunkRun::HeadForward: return run.last ? "LM head and loss forward" : "sending the stage output";
    case ChunkRun::HeadBackward: return run.last ? "LM head and loss backward" : "receiving the output gradient";
    case ChunkRun::LayerBackward: return fmt::format("backward of layer {}", run.layer);
    case ChunkRun::PreBackward: return run.first ? "embedding backward" : "sending the input gradient";
  }
  return "?";
}

// Bytes present beside the activations during a phase: (phase, position of the layer in the
// chunk, or -1).
using PhaseExtra = std::function<double(ChunkRun::Phase, int64_t)>;

// One (micro-batch, chunk) through forward and backward, from level 0; `layers` [begin, end).
ChunkRun run_chunk(const MicroBatchModel& model, const JobLayout& job, const int64_t* begin, const int64_t* end,
                   bool first_chunk, bool last_chunk, const PhaseExtra& extra = nullptr) {
  ChunkRun run;
  run.first = first_chunk;
  run.last = last_chunk;
  double level = 0;
  auto step = [&](const Segment& s, ChunkRun::Phase phase, int64_t layer) {
    const double beside = extra ? extra(phase, layer < 0 ? -1 : layer - (begin == end ? 0 : *begin)) : 0.0;
    if (level + double(s.peak) + beside > run.peak) {
      run.peak = level + double(s.peak) + beside;
      run.phase = phase;
      run.layer = layer;
    }
    level += double(s.net);
  };
  auto layer = [&](int64_t l) -> const LayerSegments& {
    const auto& counts = job.counts.layers[size_t(l)];
    return model.layer(counts.moe && job.shape.experts > 0, counts.window > 0 && job.shape.window > 0);
  };
  const LayerSegments& pre = first_chunk ? model.pre_first : model.pre_other;
  const LayerSegments& head = last_chunk ? model.head_last : model.head_other;
  step(pre.forward, ChunkRun::PreForward, -1);
  for (const int64_t* l = begin; l != end; ++l) step(layer(*l).forward, ChunkRun::LayerForward, *l);
  step(head.forward, ChunkRun::HeadForward, -1);
  run.held = level;
  step(head.backward, ChunkRun::HeadBackward, -1);
  for (const int64_t* l = end; l != begin;) {
    --l;
    step(layer(*l).backward, ChunkRun::LayerBackward, *l);
  }
  step(pre.backward, ChunkRun::PreBackward, -1);
  return run;
}

}  // namespace

StageMemory stage_memory(const JobLayout& job, const StageLayout& stage, const MicroBatchModel& model,
                         const MemoryOptions& options) {
  const auto& mesh = job.mesh;
  const auto& shape = job.shape;
  const double e = double(shape.dtype_bytes);
  const int64_t zero = options.zero;
  StageMemory sm;
  sm.stage = stage.stage;
  sm.layers = int64_t(stage.layers.size());
  sm.moe_layers = stage.moe_layers;

  // --- model state: ZeRO shards over dp x cp (dense parameters) and edp (expert parameters) ---
  // ZeRO shards dense weights over dp x cp, or with hybrid sharding over dp_shard x cp.
  const double dense_ranks = double(mesh.shard_dp() * mesh.cp), expert_ranks = double(mesh.edp);
  // The runtime shards (ZeRO >= 1) only when the data- and context-parallel group has several
  // ranks (train/optimizer_driver.cpp).
  const bool data_parallel = mesh.dp * mesh.cp > 1;
  const double pd = double(stage.params.dense), pe = double(stage.params.expert);
  auto sharded = [&](int64_t from_stage) {
    return (zero >= from_stage ? pd / dense_ranks : pd) + (zero >= from_stage ? pe / expert_ranks : pe);
  };
  sm.parameters = e * sharded(3);
  // The gradient buffers (engine/grad_buckets.h): fp32 unless grad_reduce_dtype is bf16.
  sm.gradients = options.grad_bytes * sharded(2);
  // The optimizer (optimizer_cost.h): fp32 master weights when training in bf16 (fp32 parameters
  // are their own master weights, also in the distributed optimizer of ZeRO,
  // engine/zero/distributed_optimizer.cpp, which keeps the state of its shard), then the
  // optimizer's state (AdamW: two moments in optimizer.state_dtype; 8-bit AdamW: two bytes and
  // fp32 block maxima on matrices, fp32 moments on norms), and a step count per tensor.
  const OptimizerCost cost = optimizer_cost(options.optimizer, int64_t(e));
  const double norm_shard = zero >= 1 ? double(stage.params.norm) / dense_ranks : double(stage.params.norm);
  const double table_shard = zero >= 1 ? double(stage.params.tables) / dense_ranks : double(stage.params.tables);
  const double matrix_shard = sharded(1) - norm_shard - table_shard;
  sm.optimizer_states = cost.master_bytes * sharded(1) + cost.matrix_bytes * matrix_shard +
                        cost.table_bytes * table_shard + cost.vector_bytes * norm_shard +
                        4.0 * double(stage.params.tensors);
  const double largest_tensor =
      double(std::max({shape.vocab * shape.hidden, shape.ffn * shape.hidden, shape.expert_ffn * shape.hidden}));
  // A typical gradient bucket: buckets close at the first parameter that takes them past
  // grad_bucket_mb, so they run over by about half a large matrix.
  const double bucket_bytes =
      std::min(options.grad_bytes * (pd + pe), options.grad_bucket_bytes + options.grad_bytes * largest_tensor / 2);
  {
    // After backward. With bf16 gradient buffers AdamW copies the weight-decay group's gradients
    // to fp32 in slices of at most 64 MiB (optim::LocalOptimizer::kCopyBudgetBytes) plus the tensor that
    // crosses it (fp32 buffers need no copy). The gradient norm reads the buffers in place. The
    // distributed optimizer gathers the updated shards in place, into the buckets themselves (with
    // NCCL and with Gloo: comm/gloo_communicator.cpp): nothing more.
    const double norm = double(stage.params.norm);
    const double shard = sharded(1);
    const double decay_shard = shard - (zero >= 1 ? norm / dense_ranks : norm);
    const double copy_budget = double(int64_t(64) << 20);
    const double copies = options.grad_bytes != 4 ? std::min(4.0 * decay_shard, copy_budget + 4.0 * largest_tensor) : 0.0;
    // Widened bf16 moments, or 8-bit AdamW's runs: fp32 temporaries of a slice of the shard.
    const double covered = cost.transient_per_tensor ? std::min(shard, largest_tensor) : shard;
    const double slice = cost.transient_elements_cap > 0 ? std::min(covered, cost.transient_elements_cap) : 0.0;
    // 8-bit AdamW without a per-element block index where the matrices' rows are whole blocks.
    const bool whole_blocks = shape.hidden % 256 == 0 && shape.ffn % 256 == 0;
    const double per_element = whole_blocks && cost.transient_bytes_whole_blocks > 0 ? cost.transient_bytes_whole_blocks
                                                                                    : cost.transient_bytes_per_element;
    sm.optimizer_step_transient = copies + per_element * slice;
    if (cost.matrix_inputs_bytes > 0) {
      // Muon. The layer matrices' inputs all at once, and, when tp splits them or ZeRO shards
      // them, the exchange's send and receive buffers, while AdamW updates the rest (its gradient
      // copies and widened bf16 moments); then, beside the inputs (or the whole matrices), the
      // Newton-Schulz temporaries of a whole matrix on its owner.
      const bool exchanged = mesh.tp > 1 || mesh.etp > 1 || (zero >= 1 && data_parallel);
      const double others = shard - matrix_shard;
      const double adam_copies = options.grad_bytes != 4 ? std::min(4.0 * others, copy_budget + 4.0 * largest_tensor) : 0.0;
      const double adam_slice = cost.transient_elements_cap > 0 ? std::min(others, cost.transient_elements_cap) : 0.0;
      const double travel = (exchanged ? cost.matrix_exchange_bytes : cost.matrix_inputs_bytes) * matrix_shard +
                            adam_copies + cost.transient_bytes_per_element * adam_slice;
      const double orthogonalize = cost.matrix_inputs_bytes * matrix_shard + options.muon_temporaries;
      sm.optimizer_step_transient = std::max(travel, orthogonalize);
    }
  }
  sm.model_buffers = double(shape.rotary_dim() / 2) * 4.0;
  if (zero >= 2 && data_parallel) {
    // ZeRO-2 (engine/grad_buckets.h): besides the shards, full-size bucket buffers while
    // they accumulate and while their reduce-scatter is in flight (at most two per communicator;
    // Gloo reduces them in place too). Every micro-batch: one accumulating, two in flight.
    // Accumulating unsharded over several micro-batches: every full buffer from the first
    // micro-batch's backward to the step's reduction. ZeRO-3's buckets hold one unit each.
    int64_t largest_unit = 0;
    for (int64_t u : stage.unit_params) largest_unit = std::max(largest_unit, u);
    const double bucket = zero >= 3 ? std::min(bucket_bytes, options.grad_bytes * double(largest_unit)) : bucket_bytes;
    sm.zero2_full_buckets = options.accumulate_unsharded && job.microbatches > 1 ? options.grad_bytes * (pd + pe)
                                                                                 : 3.0 * bucket;
  }
  PhaseExtra zero3_extra;
  if (zero >= 3 && data_parallel) {
    // ZeRO-3 (engine/zero/zero3_gathers.h): a unit computes while the next one (in backward the
    // previous one) is gathered; each phase of the micro-batch's timeline sees the units gathered
    // then (run_chunk's PhaseExtra). Without resharding after forward, or under pipeline parallelism (kept for
    // all micro-batches), every unit is gathered once the forward is done. A tied embedding stays
    // gathered for the step.
    const auto& u = stage.unit_params;
    const int64_t n = int64_t(u.size());
    // Captures by value: zero3_extra outlives this block (run_chunk calls it below).
    auto at = [&u, n](int64_t i) { return i >= 0 && i < n ? double(u[size_t(i)]) : 0.0; };
    std::vector<double> prefix(size_t(n) + 1, 0.0);  // prefix[i]: units before position i
    for (int64_t i = 0; i < n; ++i) prefix[size_t(i) + 1] = prefix[size_t(i)] + double(u[size_t(i)]);
    auto upto = [prefix, n](int64_t i) { return prefix[size_t(std::clamp<int64_t>(i + 1, 0, n))]; };
    const double all = upto(n - 1), pinned = double(stage.pinned_params);
    const bool keep_all = mesh.pp > 1;  // the stage's units stay gathered for all micro-batches
    const bool reshard = options.reshard_after_forward;
    const int64_t offset = stage.first ? 1 : 0;  // position of the first decoder layer among the units
    // Schedules that defer weight gradients keep the head gathered through the step's backward.
    const bool keep_head = stage.last && (options.schedule == parallel::ScheduleKind::ZeroBubble ||
                                          options.schedule == parallel::ScheduleKind::ZBV);
    // The embedding is not gathered for its backward.
    auto in_backward = [at, first = stage.first](int64_t i) { return first && i == 0 ? 0.0 : at(i); };
    zero3_extra = [=](ChunkRun::Phase phase, int64_t k) {
      if (keep_all) return e * (all + pinned);
      int64_t p = 0;
      switch (phase) {
        case ChunkRun::PreForward: case ChunkRun::PreBackward: p = 0; break;
        case ChunkRun::LayerForward: case ChunkRun::LayerBackward: p = offset + k; break;
        case ChunkRun::HeadForward: case ChunkRun::HeadBackward: p = n - 1; break;
      }
      double g = 0;
      switch (phase) {
        case ChunkRun::PreForward: case ChunkRun::LayerForward:
          g = (reshard ? at(p) : upto(p)) + at(p + 1);  // the next unit prefetched
          break;
        case ChunkRun::HeadForward: case ChunkRun::HeadBackward:
          g = reshard ? at(p) : all;
          break;
        case ChunkRun::LayerBackward: case ChunkRun::PreBackward:
          // The previous unit prefetched; without resharding, what the forward gathered is left.
          g = reshard ? in_backward(p) + in_backward(p - 1) : upto(p);
          if (keep_head && p != n - 1) g += at(n - 1);
          break;
      }
      return e * (g + pinned);
    };
    // Reported: the forward's height (the backward's is no higher).
    for (int64_t i = 0; i < n; ++i)
      sm.zero3_gathered = std::max(sm.zero3_gathered, keep_all ? e * (all + pinned)
                                                               : e * ((reshard ? at(i) : upto(i)) + at(i + 1) + pinned));
  }
  if (options.gpu) sm.cublas_workspace = options.gpu->cublas_workspace_bytes;
  sm.static_bytes = sm.parameters + sm.gradients + sm.optimizer_states + sm.model_buffers +
                    sm.cublas_workspace;

  // --- activations: per layer, per micro-batch, in flight ------------------------------------
  sm.activations_per_layer_dense = double(model.dense.forward.net);
  sm.activations_per_layer_moe = double(model.moe.forward.net);
  const auto schedule = options.schedule;  // the runtime runs the recipe's schedule at pp 1 too
  sm.inflight_chunks = peak_inflight_chunks(schedule, mesh.pp, mesh.vpp, stage.stage, job.microbatches);
  sm.inflight_microbatches = double(sm.inflight_chunks) / double(mesh.vpp);

  const int64_t per_chunk = int64_t(stage.layers.size()) / mesh.vpp;
  double held_total = 0;
  ChunkRun highest;
  for (int64_t v = 0; v < mesh.vpp; ++v) {
    const int64_t* begin = stage.layers.data() + v * per_chunk;
    const bool first_chunk = stage.first && v == 0;
    const bool last_chunk = stage.last && v == mesh.vpp - 1;
    const ChunkRun run = run_chunk(model, job, begin, begin + per_chunk, first_chunk, last_chunk, zero3_extra);
    held_total += run.held;
    if (v == 0 || run.peak >= highest.peak) highest = run;
  }
  sm.activations_microbatch = held_total;
  const double held_per_chunk = held_total / double(mesh.vpp);
  sm.activations_other_microbatches = double(sm.inflight_chunks - 1) * held_per_chunk;
  sm.microbatch_peak = highest.peak;
  sm.microbatch_peak_at = options.describe_peak ? describe(highest) : std::string();
  if (stage.last) {
    const auto& head = model.head_last;
    sm.logits_and_loss = double(head.forward.net);
    sm.logits_and_loss_peak = std::max(double(head.forward.peak), double(head.forward.net + head.backward.peak));
  }

  // --- the peak: during some micro-batch, or after backward (reduction, norm, optimizer step) ---
  // (The micro-batch's peak includes ZeRO-3's gathered parameters at that moment.)
  const double during_microbatch = sm.activations_other_microbatches + sm.microbatch_peak + sm.zero2_full_buckets;
  // Gradient reductions add nothing: NCCL reduce-scatters the buckets in place and Gloo, which has
  // no reduce-scatter, all-reduces them in place (comm::Communicator::reduce_scatter_consuming).
  const double after_backward = sm.optimizer_step_transient;
  if (after_backward > during_microbatch) {
    sm.peak_allocated = sm.static_bytes + after_backward;
    sm.peak_phase = "optimizer step (fp32 gradient copies)";
  } else {
    sm.peak_allocated = sm.static_bytes + during_microbatch;
    sm.peak_phase = sm.microbatch_peak_at;
    if (sm.inflight_chunks > 1 && options.describe_peak)
      sm.peak_phase += fmt::format(" with {} (micro-batch, chunk) forwards in flight", sm.inflight_chunks);
  }
  if (options.gpu) {
    sm.reserved = sm.peak_allocated * options.gpu->fragmentation;
    sm.device_total = sm.reserved + options.gpu->framework_overhead_bytes;
  } else {
    sm.reserved = sm.peak_allocated;
    sm.device_total = sm.peak_allocated;
  }
  return sm;
}

}  // namespace trainer::estimate
