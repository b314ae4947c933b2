#include "estimate/estimate.h"

#include <algorithm>

#include "estimate/comm_model.h"
#include "estimate/micro_batch.h"
#include "estimate/optimizer_cost.h"
#include "estimate/pipeline_schedule.h"
#include "estimate/time_model.h"

namespace trainer::estimate {

namespace {

struct StageTime {
  SegmentTime forward, backward;
  double recompute_s = 0;
  double total() const { return forward.total() + backward.total(); }
};

StageTime stage_time(const JobLayout& job, const StageLayout& stage, const MicroBatchModel& model,
                     const HardwareProfile& gpu, recipe::Precision dtype, const MeshPlacement& placement,
                     bool fused) {
  auto time = [&](const Segment& s) { return segment_time(s.costs, gpu, dtype, placement, fused); };
  StageTime t;
  const auto& mesh = job.mesh;
  const int64_t per_chunk = int64_t(stage.layers.size()) / mesh.vpp;
  // The times of each kind of layer (dense or MoE, full attention or windowed), once per stage:
  // the planner calls this for every layout it considers.
  struct LayerTime {
    SegmentTime forward, backward;
  };
  LayerTime kinds[2][2];
  for (const bool moe : {false, true})
    for (const bool windowed : {false, true}) {
      if ((moe && job.shape.experts == 0) || (windowed && job.shape.window == 0)) continue;
      const LayerSegments& segments = model.layer(moe, windowed);
      kinds[moe][windowed] = {time(segments.forward), time(segments.backward)};
    }
  for (int64_t v = 0; v < mesh.vpp; ++v) {
    const bool first_chunk = stage.first && v == 0;
    const bool last_chunk = stage.last && v == mesh.vpp - 1;
    const auto& pre = first_chunk ? model.pre_first : model.pre_other;
    const auto& head = last_chunk ? model.head_last : model.head_other;
    t.forward.add(time(pre.forward));
    t.backward.add(time(pre.backward));
    t.forward.add(time(head.forward));
    t.backward.add(time(head.backward));
    for (int64_t i = v * per_chunk; i < (v + 1) * per_chunk; ++i) {
      const auto& counts = job.counts.layers.at(size_t(stage.layers.at(size_t(i))));
      const LayerTime& layer = kinds[counts.moe][counts.window > 0];
      const SegmentTime& f = layer.forward;
      t.forward.add(f);
      t.backward.add(layer.backward);
      // What backward spends recomputing: the whole layer forward (full) or the attention core
      // (the norms of selective are memory-bound kernels in the backward's own time).
      if (job.shape.recompute == Recompute::Full) t.recompute_s += f.total();
      if (recipe::recomputes_core_attention(job.shape.recompute))
        t.recompute_s += f.attention_s;
    }
  }
  return t;
}

void fill_time(JobEstimate& out, const recipe::Recipe& r, const JobLayout& job, const MicroBatchModel& model,
               const HardwareProfile& gpu, const EstimateOptions& options) {
  const auto& mesh = job.mesh;
  const auto& p = r.parallel;
  const recipe::Precision dtype = r.training.dtype;
  const MeshPlacement placement = place_groups(mesh, r.hardware.gpus_per_node);
  const double e = double(job.shape.dtype_bytes);
  const int64_t m = job.microbatches;
  TimeBreakdown best;
  double slowest_step = -1;
  for (const auto& stage : job.stages) {
    const StageTime st = stage_time(job, stage, model, gpu, dtype, placement, options.fused_kernels);
    TimeBreakdown tb;
    SegmentTime all = st.forward;
    all.add(st.backward);
    // Document masking: the documents' share of the attention work, on the data-parallel rank
    // that has the most of it (each document runs alone at cp 1 and in Ulysses; ring attention
    // runs its blocks' document pairs on a sequence whose zigzag parts balance them across cp).
    if (out.documents)
      all.attention_s *= out.documents->attention_fraction * out.documents->imbalance;
    tb.gemm_s = all.gemm_s * double(m);
    tb.attention_s = all.attention_s * double(m);
    tb.memory_bound_s = all.memory_bound_s * double(m);
    tb.recompute_s = st.recompute_s * double(m);
    tb.tp_comm_s = all.tp_comm_s * double(m);
    tb.tp_hidden_s = all.tp_hidden_s * double(m);
    tb.cp_comm_s = all.cp_comm_s * double(m);
    tb.ep_comm_s = all.ep_comm_s * double(m);
    tb.pp_comm_s = all.pp_comm_s * double(m);
    tb.microbatch_s = all.total();
    const double compute_mb = all.gemm_s + all.attention_s + all.memory_bound_s;

    // Pipeline bubble: (pp - 1) idle micro-batch slots, of a chunk's length when interleaved.
    if (mesh.pp > 1) {
      tb.bubble_s = bubble_fraction(p.pipeline_schedule, mesh.pp, mesh.vpp, m) * double(m) * tb.microbatch_s;
    }

    // Data parallel: gradients reduced once per step over dp x cp (dense) and edp (experts).
    const double dense_bytes = e * double(stage.params.dense), expert_bytes = e * double(stage.params.expert);
    const double dense_ranks = double(mesh.shard_dp() * mesh.cp), expert_ranks = double(mesh.edp);
    if (p.zero >= 3) {
      // ZeRO-3 (engine/zero/zero3_gathers.h): each unit gathered for its forward and, when
      // resharded after forward, again for its backward, one unit prefetched; under pipeline
      // parallelism a stage's units stay gathered from the step's first forward on. Gradients
      // reduce-scattered every micro-batch unless accumulated unsharded (the pipeline default).
      const double g = p.grad_reduce_dtype == recipe::Precision::BF16 ? e : 4.0;
      const GroupPlacement& dense_group = placement.dp_cp_shard;
      const double gather = collective_seconds(CommKind::AllGather, dense_bytes, dense_group, gpu) +
                            collective_seconds(CommKind::AllGather, expert_bytes, placement.edp, gpu);
      const double reduce =
          collective_seconds(CommKind::ReduceScatter, g * double(stage.params.dense), dense_group, gpu) +
          collective_seconds(CommKind::ReduceScatter, g * double(stage.params.expert), placement.edp, gpu);
      // Passes of gathers per step: at pp 1 a forward and (resharded) a backward per micro-batch; under
      // pipeline parallelism units stay after backward, so only the backward after a resharding
      // forward gathers again.
      const bool per_microbatch_gathers = mesh.pp == 1;
      const double gathers = per_microbatch_gathers ? double(m) * (p.reshard_after_forward() ? 2.0 : 1.0)
                                                    : (p.reshard_after_forward() ? double(m) + 1.0 : 1.0);
      const double reductions = p.accumulate_unsharded() ? 1.0 : double(m);
      tb.dp_comm_s = gather * gathers + reduce * reductions;
      // Exposed: what the computation does not cover, and the first unit of each gathering pass
      // (nothing runs before it), about gather / units.
      const double units = double(std::max<size_t>(1, stage.unit_params.size()));
      const double passes = gathers;
      const double per_pass_compute = per_microbatch_gathers ? compute_mb / (p.reshard_after_forward() ? 2.0 : 1.0)
                                                             : compute_mb * double(m);
      tb.param_gather_s = passes * (std::max(0.0, gather - per_pass_compute) + gather / units);
      tb.dp_exposed_s = reductions * std::max(0.0, reduce - st.backward.total()) + reduce / units;
      if (placement.dp_cp_replicate.size > 1) {
        const double across = collective_seconds(CommKind::AllReduce, g * double(stage.params.dense) / double(dense_group.size),
                                                 placement.dp_cp_replicate, gpu);
        tb.dp_comm_s += across;
        tb.dp_exposed_s += across;
      }
    } else {
      // Gradients are reduced in the buffers' dtype: fp32 unless parallel.grad_reduce_dtype is bf16.
      const double g = p.grad_reduce_dtype == recipe::Precision::BF16 ? e : 4.0;
      const double dense_grad_bytes = g * double(stage.params.dense), expert_grad_bytes = g * double(stage.params.expert);
      const CommKind kind = p.zero >= 1 ? CommKind::ReduceScatter : CommKind::AllReduce;
      // ZeRO shards dense weights over dp x cp, or the shard group under hybrid sharding.
      const GroupPlacement& dense_group = p.zero >= 1 ? placement.dp_cp_shard : placement.dp_cp;
      const double per_reduction = collective_seconds(kind, dense_grad_bytes, dense_group, gpu) +
                                   collective_seconds(kind, expert_grad_bytes, placement.edp, gpu);
      // ZeRO-2 reduce-scatters every micro-batch (unless accumulating unsharded); the others once.
      const bool every_microbatch = p.zero == 2 && !p.accumulate_unsharded();
      const double reductions = every_microbatch ? double(m) : 1.0;
      tb.dp_comm_s = per_reduction * reductions;
      // Buckets reduce during a micro-batch's backward; the last bucket is always exposed.
      const double backward_s = st.backward.total();
      const double grad_bytes = dense_grad_bytes + expert_grad_bytes;
      const double last_bucket =
          grad_bytes > 0 ? per_reduction * std::min(1.0, p.grad_bucket_mb * 1024 * 1024 / grad_bytes) : 0;
      const double exposed_once =
          p.overlap_grad_reduce ? std::max(0.0, per_reduction - backward_s) + std::min(per_reduction, last_bucket)
                                : per_reduction;
      tb.dp_exposed_s = std::min(exposed_once, per_reduction) * reductions;
      // Hybrid sharding: each shard all-reduced over its replicas after backward (not overlapped).
      if (p.zero >= 1 && placement.dp_cp_replicate.size > 1) {
        const double across = collective_seconds(CommKind::AllReduce, dense_grad_bytes / double(placement.dp_cp_shard.size),
                                                 placement.dp_cp_replicate, gpu);
        tb.dp_comm_s += across;
        tb.dp_exposed_s += across;
      }
      if (p.zero >= 1) {
        // The updated parameters' all-gather; with overlap_param_gather it runs behind the next
        // forward (the first layers' buckets first), exposing what the first micro-batch's forward
        // does not cover and the first bucket.
        const double gather = collective_seconds(CommKind::AllGather, dense_bytes, dense_group, gpu) +
                              collective_seconds(CommKind::AllGather, expert_bytes, placement.edp, gpu);
        const double param_bytes = dense_bytes + expert_bytes;
        const double first_bucket =
            param_bytes > 0 ? gather * std::min(1.0, p.grad_bucket_mb * 1024 * 1024 * e / g / param_bytes) : 0;
        tb.param_gather_s = p.overlap_param_gather
                                ? std::min(gather, std::max(0.0, gather - st.forward.total()) + first_bucket)
                                : gather;
      }
    }
    // Optimizer: memory-bound over this rank's shard of the parameters.
    const double shard = p.zero >= 1 ? double(stage.params.dense) / dense_ranks + double(stage.params.expert) / expert_ranks
                                     : double(stage.params.total());
    const double optimizer_kernels = double(stage.params.tensors) * 6 / 32.0;  // foreach kernels, 32 tensors each
    tb.optimizer_s = shard * optimizer_cost(r.optimizer, job.shape.dtype_bytes).step_bytes /
                         (gpu.hbm_bytes_per_s * gpu.hbm_efficiency) +
                     optimizer_kernels * gpu.kernel_overhead_s;
    if (r.optimizer.name == recipe::OptimizerName::Muon) {
      // Muon (engine/whole_matrices.h): each layer matrix orthogonalised whole by one owner among
      // the ranks holding it (tp x the ZeRO shard group; replicas compute the same), in fp32 GEMMs;
      // its inputs travel to the owner and back, an all-to-all each way in the shard group and in
      // the tp group.
      const MuonWork w = muon_work(r);
      const double layers = double(stage.layers.size()), moe_layers = double(stage.moe_layers);
      const double local_experts = r.model.moe ? double(r.model.moe->num_local_experts) / double(mesh.ep) : 0.0;
      const bool sharded = p.zero >= 1 && mesh.dp * mesh.cp > 1;
      const double dense_owners = double(mesh.tp) * (sharded ? dense_ranks : 1.0);
      const double expert_owners = double(mesh.etp) * (sharded ? expert_ranks : 1.0);
      const double flops = (layers * w.attention + (layers - moe_layers) * w.dense_mlp + moe_layers * w.shared_experts) /
                               dense_owners +
                           moe_layers * local_experts * w.expert / expert_owners;
      tb.optimizer_s += flops / (gpu.fp32_flops * gpu.gemm_efficiency);
      const double dense_matrices = 4.0 * double(stage.params.dense - stage.params.norm - stage.params.tables);
      const double expert_matrices = 4.0 * double(stage.params.expert);
      double exchange = 0;
      if (sharded)
        exchange += collective_seconds(CommKind::AllToAll, dense_matrices / dense_ranks, placement.dp_cp_shard, gpu) +
                    collective_seconds(CommKind::AllToAll, expert_matrices / expert_ranks, placement.edp, gpu);
      // Each rank assembles about its share of the slices, then sends them within tp.
      if (mesh.tp > 1)
        exchange += collective_seconds(CommKind::AllToAll, dense_matrices / (sharded ? dense_ranks : 1.0), placement.tp, gpu);
      if (mesh.etp > 1)
        exchange +=
            collective_seconds(CommKind::AllToAll, expert_matrices / (sharded ? expert_ranks : 1.0), placement.etp, gpu);
      tb.optimizer_s += 2 * exchange;  // there and back
    }
    tb.step_s = tb.microbatch_s * double(m) + tb.bubble_s + tb.dp_exposed_s + tb.param_gather_s + tb.optimizer_s;
    // The host launches asynchronously; when its launches take longer than the GPU's work, the GPU
    // waits for it (tiny models: launch-bound).
    tb.kernels = all.kernels * double(m) + optimizer_kernels;
    tb.host_s = tb.kernels * gpu.host_s_per_kernel;
    tb.host_exposed_s = std::max(0.0, tb.host_s - tb.step_s);
    tb.step_s += tb.host_exposed_s;
    if (tb.step_s > slowest_step) {
      slowest_step = tb.step_s;
      best = tb;
    }
  }
  out.has_time = true;
  out.time = best;
  out.step_time_s = best.step_s;
  out.tokens_per_s = out.tokens_per_step / out.step_time_s;
  out.tokens_per_s_per_gpu = out.tokens_per_s / double(mesh.world_size);
  out.tflops_per_gpu = out.model_flops_per_step / out.step_time_s / double(mesh.world_size) / 1e12;
  out.mfu = out.tflops_per_gpu * 1e12 / gpu.peak_flops(dtype);
}

}  // namespace

namespace {

// The job whose replay is timed: --fused-kernels (options.fused_kernels) times memory-bound work
// as a third of the unfused ops' (torch.compile, Megatron/TE), so it times the unfused ops then,
// whatever training.fused_kernels says (the two are not stacked); memory stays the recipe's.
JobLayout timed(JobLayout job, const EstimateOptions& options) {
  if (options.fused_kernels) job.shape.fused = {};
  return job;
}

}  // namespace

const MicroBatchModel& ModelCache::get(const RankShape& s) {
  const std::vector<int64_t> key = {s.micro_batch, s.seq, s.hidden, s.q_heads, s.kv_heads, s.head_dim, s.ffn,
                                    s.vocab, s.dtype_bytes, int64_t(s.tied_head), int64_t(s.recompute),
                                    int64_t(s.device), s.cpu_threads, s.tp, int64_t(s.sequence_parallel), int64_t(s.tp_comm_overlap), s.cp,
                                    int64_t(s.ulysses), s.experts, s.local_experts, s.top_k, s.expert_ffn,
                                    s.shared_ffn, s.ep, s.expert_rows, int64_t(s.fused.rms_norm),
                                    int64_t(s.fused.rope), int64_t(s.fused.swiglu), int64_t(s.fused.cross_entropy),
                                    int64_t(s.fused.grad_accumulation), s.etp, int64_t(s.attention_bias),
                                    int64_t(s.qk_norm), s.window, s.mla.q_lora, s.mla.kv_lora, s.mla.nope,
                                    s.mla.rope, s.mla.v, int64_t(s.mla.interleaved), int64_t(s.mla.scaled),
                                    s.mtp_depth, int64_t(s.mtp_moe), int64_t(s.mtp_window), int64_t(s.documents),
                                    int64_t(s.positions_per_sample)};
  auto it = models_.find(key);
  if (it == models_.end()) it = models_.emplace(key, model_micro_batch(s)).first;
  return it->second;
}

JobEstimate estimate_job(const recipe::Recipe& recipe, const recipe::MeshShape& mesh, const HardwareProfile* gpu,
                         const EstimateOptions& options, ModelCache* cache) {
  const Device device = gpu ? Device::Gpu : Device::Cpu;
  const JobLayout job = layout_job(recipe, mesh, device, options.cpu_threads, options.counts);
  ModelCache local;
  ModelCache& models = cache ? *cache : local;
  const MicroBatchModel& model = models.get(job.shape);

  JobEstimate out;
  out.mesh = mesh;
  out.device = gpu ? gpu->name : "cpu";
  out.schedule = mesh.pp > 1 ? std::string(recipe::name_of(recipe.parallel.pipeline_schedule)) : "none";
  out.microbatches = job.microbatches;
  out.counts = job.counts;
  out.tokens_per_step = double(mesh.global_batch_size) * double(recipe.training.seq_len);
  out.model_flops_per_step = job.counts.flops_per_token * out.tokens_per_step;
  out.documents = document_work(recipe, mesh);
  out.documents_unknown = recipe.data.document_masking && !out.documents;
  if (out.documents)  // only the attention inside documents counts, as the runtime's MFU
    out.model_flops_per_step =
        (job.counts.dense_flops_per_token + job.counts.attention_flops_per_token * out.documents->attention_fraction) *
        out.tokens_per_step;

  MemoryOptions memory;
  memory.schedule = recipe.parallel.pipeline_schedule;
  memory.zero = recipe.parallel.zero;
  memory.grad_bucket_bytes = recipe.parallel.grad_bucket_mb * 1024 * 1024;
  memory.accumulate_unsharded = recipe.parallel.accumulate_unsharded();
  memory.reshard_after_forward = recipe.parallel.reshard_after_forward();
  memory.grad_bytes = double(recipe::bytes_of(recipe.parallel.grad_reduce_dtype));
  memory.optimizer = recipe.optimizer;
  if (recipe.optimizer.name == recipe::OptimizerName::Muon) memory.muon_temporaries = muon_work(recipe).largest_temporaries;
  memory.gpu = gpu;
  memory.describe_peak = options.describe_peak;
  for (const auto& stage : job.stages) {
    out.stages.push_back(stage_memory(job, stage, model, memory));
    const auto& sm = out.stages.back();
    if (sm.peak_allocated > out.peak_bytes) {
      out.peak_bytes = sm.peak_allocated;
      out.worst_stage = sm.stage;
    }
  }
  const auto& worst = out.stages.at(size_t(out.worst_stage));
  out.reserved_bytes = worst.reserved;
  out.device_total_bytes = worst.device_total;
  if (gpu) {
    out.capacity_bytes = gpu->memory_bytes;
    out.fits = out.device_total_bytes <= out.capacity_bytes;
  }
  out.peak_bytes_worst_routing = out.peak_bytes;
  if (job.shape.experts > 0 && job.worst_expert_rows != job.shape.expert_rows) {
    JobLayout worst_job = job;
    worst_job.shape.expert_rows = job.worst_expert_rows;
    const MicroBatchModel& worst_model = models.get(worst_job.shape);
    for (const auto& stage : worst_job.stages)
      out.peak_bytes_worst_routing =
          std::max(out.peak_bytes_worst_routing, stage_memory(worst_job, stage, worst_model, memory).peak_allocated);
  }
  if (gpu && options.compute_time) {
    const JobLayout timed_job = timed(job, options);
    fill_time(out, recipe, timed_job, models.get(timed_job.shape), *gpu, options);
  }
  return out;
}

void add_step_time(JobEstimate& estimate, const recipe::Recipe& recipe, const HardwareProfile& gpu,
                   const EstimateOptions& options, ModelCache* cache) {
  const JobLayout job =
      timed(layout_job(recipe, estimate.mesh, Device::Gpu, options.cpu_threads, options.counts), options);
  ModelCache local;
  ModelCache& models = cache ? *cache : local;
  fill_time(estimate, recipe, job, models.get(job.shape), gpu, options);
}

}  // namespace trainer::estimate
