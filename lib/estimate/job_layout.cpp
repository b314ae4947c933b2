#include "estimate/job_layout.h"

#include "parallel/pipeline/pipeline_layout.h"
#include "parallel/pipeline/schedule.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace trainer::estimate {

namespace {

struct LayerParams {
  int64_t dense = 0, expert = 0, norm = 0, tensors = 0;
};

LayerParams layer_params(const recipe::Recipe& r, const ModelCounts& c, bool moe) {
  const auto& p = r.parallel;
  const int64_t H = r.model.hidden_size;
  LayerParams l;
  l.norm = 2 * H;
  l.dense = c.attention_params_per_layer / p.tp + l.norm;
  l.tensors = 6;  // q, k, v, o, two norms
  if (r.model.mla) {
    // The down-projections and latent norms are replicated over tp; the other projections split.
    const auto& a = *r.model.mla;
    const int64_t latent_norms = a.q_lora_rank.value_or(0) + a.kv_lora_rank;
    l.norm += latent_norms;
    l.dense = c.attention_replicated_params_per_layer +
              (c.attention_params_per_layer - c.attention_replicated_params_per_layer) / p.tp + l.norm;
    l.tensors = a.q_lora_rank ? 9 : 7;  // q_a, q_a norm, q_b (or q), kv_a, kv_a norm, kv_b, o, two norms
  }
  // No weight decay (optimizer groups) for the q, k, v biases and the q/k norms either.
  if (r.model.attention_bias) {
    l.tensors += 3;
    l.norm += (r.model.num_attention_heads + 2 * r.model.num_key_value_heads) * r.model.head_dim / p.tp;
  }
  if (r.model.qk_norm) {  // replicated over tp
    l.tensors += 2;
    l.norm += 2 * r.model.head_dim;
    l.dense += 2 * r.model.head_dim;
  }
  if (!moe) {
    l.dense += c.dense_mlp_params_per_layer / p.tp;
    l.tensors += 3;
    return l;
  }
  const auto& m = *r.model.moe;
  const int64_t local_experts = m.num_local_experts / p.ep;
  l.dense += c.router_params_per_layer;  // the router is replicated
  l.expert = local_experts * c.expert_params / p.etp;
  l.tensors += 1 + 3 * local_experts;
  if (m.num_shared_experts > 0) {
    l.dense += c.shared_expert_params_per_layer / p.tp;
    l.tensors += 3;
  }
  return l;
}

}  // namespace

JobLayout layout_job(const recipe::Recipe& r, const recipe::MeshShape& mesh, Device device, int64_t cpu_threads,
                     const ModelCounts* counts) {
  const auto& p = r.parallel;
  const auto& m = r.model;
  const auto& t = r.training;
  JobLayout job;
  job.mesh = mesh;
  job.counts = counts ? *counts : count_model(m, t.seq_len);
  job.microbatches = mesh.grad_accum_steps;

  // The runtime's split and chunk placement: one source of truth.
  const parallel::PipelineLayout pipeline = parallel::layout_pipeline(r, mesh);
  const int64_t embedding_stage = pipeline.embedding_stage, head_stage = pipeline.head_stage;
  // Embedding and LM head rows per rank: the vocabulary padded to a multiple of the divisor x tp.
  const int64_t H = m.hidden_size, V_rank = m.padded_vocab_size(p.tp) / p.tp;
  for (int64_t stage = 0; stage < mesh.pp; ++stage) {
    StageLayout s;
    s.stage = stage;
    s.first = stage == embedding_stage;
    s.last = stage == head_stage;
    for (const parallel::ChunkLayers& c : pipeline.stages[size_t(stage)])
      for (int64_t l = c.first_layer; l < c.end_layer; ++l) s.layers.push_back(l);
    const bool tied_here = m.tie_word_embeddings && embedding_stage == head_stage;
    // ZeRO-3 gathers what is sharded over more than one rank (the others' buckets stay whole).
    const bool dense_gathered = mesh.shard_dp() * mesh.cp > 1, experts_gathered = mesh.edp > 1;
    if (s.first) {
      s.unit_params.push_back(tied_here || !dense_gathered ? 0 : V_rank * H);
      if (tied_here && dense_gathered) s.pinned_params = V_rank * H;
    }
    for (int64_t l : s.layers) {
      const bool moe = job.counts.layers[size_t(l)].moe;
      if (moe) ++s.moe_layers;
      const LayerParams lp = layer_params(r, job.counts, moe);
      s.params.dense += lp.dense;
      s.params.expert += lp.expert;
      s.params.norm += lp.norm;
      s.params.tensors += lp.tensors;
      s.largest_layer_params = std::max(s.largest_layer_params, lp.dense + lp.expert);
      s.unit_params.push_back((dense_gathered ? lp.dense : 0) + (experts_gathered ? lp.expert : 0));
    }
    if (s.last) s.unit_params.push_back(dense_gathered ? H + (tied_here ? 0 : V_rank * H) : 0);
    if (s.first) {
      s.params.dense += V_rank * H;
      s.params.tables += V_rank * H;
      s.params.tensors += 1;
    }
    if (s.last && job.counts.mtp_modules > 0) {
      // The multi-token prediction modules: a decoder layer each, eh_proj (replicated) and three
      // norms; an embedding copy when the embedding is on another stage and the head is not one.
      const LayerParams lp = layer_params(r, job.counts, job.counts.mtp_moe);
      const int64_t own = 2 * H * H + 3 * H, copy = embedding_stage != head_stage && !m.tie_word_embeddings ? V_rank * H : 0;
      s.params.dense += job.counts.mtp_modules * (lp.dense + own) + copy;
      s.params.tables += copy;
      s.params.expert += job.counts.mtp_modules * lp.expert;
      s.params.norm += job.counts.mtp_modules * (lp.norm + 3 * H);
      s.params.tensors += job.counts.mtp_modules * (lp.tensors + 4) + (copy > 0 ? 1 : 0);
      if (job.counts.mtp_moe) s.moe_layers += job.counts.mtp_modules;
      s.largest_layer_params = std::max(s.largest_layer_params, lp.dense + lp.expert + own);
      if (dense_gathered || experts_gathered)
        s.unit_params.back() += job.counts.mtp_modules * ((dense_gathered ? lp.dense + own : 0) +
                                                         (experts_gathered ? lp.expert : 0));
      // Tables used more than once in a step stay gathered for it (ZeRO-3's pinned buckets): the
      // LM head (the main loss and each module's), an embedding on this stage (its lookup and
      // the modules'), and the copy when more than one module reads it.
      if (dense_gathered) {
        if (!tied_here) {
          s.unit_params.back() -= V_rank * H;  // the head, counted in the head's unit above
          s.pinned_params += V_rank * H;
        }
        if (s.first && !tied_here) {
          s.unit_params.front() -= V_rank * H;
          s.pinned_params += V_rank * H;
        }
        if (copy > 0) (job.counts.mtp_modules > 1 ? s.pinned_params : s.unit_params.back()) += copy;
      }
    }
    if (s.last) {
      s.params.dense += H;  // final norm
      s.params.norm += H;
      s.params.tensors += 1;
      // The LM head; a tied head is the embedding on its stage, or a copy on another.
      if (!m.tie_word_embeddings || embedding_stage != head_stage) {
        s.params.dense += V_rank * H;
        s.params.tables += V_rank * H;
        s.params.tensors += 1;
      }
    }
    job.stages.push_back(std::move(s));
  }

  RankShape& sh = job.shape;
  sh.micro_batch = t.micro_batch_size;
  sh.seq = t.seq_len / p.cp;
  sh.hidden = H;
  sh.q_heads = m.num_attention_heads / p.tp;
  sh.kv_heads = m.num_key_value_heads / p.tp;
  sh.head_dim = m.head_dim;
  sh.ffn = m.intermediate_size / p.tp;
  sh.vocab = V_rank;
  sh.dtype_bytes = recipe::bytes_of(t.dtype);
  sh.tied_head = m.tie_word_embeddings && embedding_stage == head_stage;
  sh.attention_bias = m.attention_bias;
  sh.qk_norm = m.qk_norm;
  sh.mtp_depth = m.num_nextn_predict_layers;
  sh.mtp_moe = m.num_nextn_predict_layers > 0 && m.is_moe_layer(m.num_hidden_layers);
  if (m.mla) {
    const auto& a = *m.mla;
    sh.kv_heads = sh.q_heads;
    sh.head_dim = a.qk_head_dim();
    sh.mla = {a.q_lora_rank.value_or(0), a.kv_lora_rank, a.qk_nope_head_dim, a.qk_rope_head_dim, a.v_head_dim,
              a.rope_interleave, m.mla_softmax_factor() != 1.0};
  }
  // The windowed layers' window, where it is shorter than the sequence (model_micro_batch replays
  // them apart from the full-attention layers).
  if (m.sliding_window && *m.sliding_window < t.seq_len) sh.window = *m.sliding_window;
  sh.mtp_window = sh.mtp_depth > 0 && sh.window > 0 && m.window_of(m.num_hidden_layers) > 0;
  sh.documents = r.data.document_masking;
  // Rotary rows per (position, sample): positions restarting per document, or a sequence
  // reordered for ring attention (train/batch.h context_part), whose positions are the data's.
  sh.positions_per_sample =
      r.data.document_masking && (r.data.reset_positions || (p.cp > 1 && p.cp_method == recipe::CpMethod::Ring));
  sh.recompute = t.recompute;
  sh.device = device;
  if (device == Device::Gpu) {
    using K = recipe::FusedKernel;
    const auto& k = t.fused_kernels;
    sh.fused.rms_norm = recipe::contains(k, K::RmsNorm);
    // The rope kernel takes positions shared by the batch: per-sample positions run unfused.
    sh.fused.rope = recipe::contains(k, K::Rope) && !sh.positions_per_sample;
    sh.fused.swiglu = recipe::contains(k, K::Swiglu);
    sh.fused.cross_entropy = recipe::contains(k, K::CrossEntropy);
    // The GEMM accumulates into fp32 gradients only (bf16 ones take the product and an add).
    sh.fused.grad_accumulation = recipe::contains(k, K::GradAccumulation) && p.grad_reduce_dtype == recipe::Precision::FP32;
  }
  sh.cpu_threads = std::max<int64_t>(1, cpu_threads);
  sh.tp = p.tp;
  sh.sequence_parallel = p.sequence_parallel;
  sh.tp_comm_overlap = p.tp_comm_overlap;
  sh.cp = p.cp;
  sh.ulysses = p.cp_method == recipe::CpMethod::Ulysses;
  if (m.moe) {
    const auto& moe = *m.moe;
    sh.experts = moe.num_local_experts;
    sh.local_experts = moe.num_local_experts / p.ep;
    sh.top_k = moe.num_experts_per_tok;
    sh.expert_ffn = moe.moe_intermediate_size / p.etp;
    sh.shared_ffn = moe.num_shared_experts * moe.moe_intermediate_size / p.tp;
    sh.ep = p.ep;
    sh.etp = p.etp;
    // Rows (token, expert) per micro-batch. Every rank routes N*k rows; balanced routing brings
    // as many back to its experts. A capacity factor caps each expert at
    // ceil(cf * N * k / E) rows from each source rank. The worst dropless case sends all of the
    // ep group's tokens to one rank's experts (each token at most min(k, local experts) times).
    // Under sequence parallelism each tp rank routes its part of the sequence.
    const int64_t N = sh.norm_tokens(), rows = N * sh.top_k;
    int64_t balanced = rows;
    int64_t worst = p.ep * N * std::min(sh.top_k, sh.local_experts);
    if (moe.capacity_factor) {
      const auto capacity = int64_t(std::ceil(*moe.capacity_factor * double(rows) / double(sh.experts)));
      balanced = std::min(balanced, sh.experts * capacity);
      worst = std::min(worst, p.ep * sh.local_experts * capacity);
    }
    sh.expert_rows = balanced;
    job.worst_expert_rows = worst;
  }
  return job;
}

}  // namespace trainer::estimate
