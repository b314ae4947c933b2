#pragma once
// Replaying one micro-batch of our model on one rank (DESIGN.md invariant 7): the shapes the rank
// sees (RankShape) and the primitive operations (Replay) in which each layer's replay, beside the
// layer in lib/model (*_replay.h), describes what it allocates on a Timeline, what autograd saves,
// and what it costs (GEMM shapes, memory-bound traffic, collectives). Torch-free: the estimator
// composes these replays into stages and schedules.
#include <cstddef>
#include <cstdint>

#include "counting/tensor_timeline.h"
#include "recipe/choices.h"

namespace trainer::counting {

using recipe::Recompute;
enum class Device { Cpu, Gpu };

// The shapes one rank sees for one micro-batch.
struct RankShape {
  int64_t micro_batch = 1;  // b
  int64_t seq = 1;          // s: tokens of one sequence on this rank (training.seq_len / cp)
  int64_t hidden = 0;
  int64_t q_heads = 0, kv_heads = 0, head_dim = 0;  // on this rank (heads / tp)
  int64_t ffn = 0;          // dense SwiGLU width on this rank (intermediate_size / tp)
  int64_t vocab = 0;        // rows on this rank: the padded vocabulary / tp
  int64_t dtype_bytes = 2;  // 2: bf16, 4: fp32
  bool tied_head = false;   // the LM head is the embedding weight, on this same rank
  bool attention_bias = false;  // q, k and v add a bias (model.attention_bias)
  bool qk_norm = false;         // per-head norms of q and k before rotary (model.qk_norm)
  // Multi-head latent attention (model.mla): q_heads = kv_heads = this rank's heads and head_dim
  // the core's width, qk_nope + qk_rope (the values padded to it). kv_lora 0: grouped-query
  // attention. q_lora 0: queries projected directly.
  struct Mla {
    int64_t q_lora = 0, kv_lora = 0, nope = 0, rope = 0, v = 0;
    bool interleaved = false;
    bool scaled = false;  // the queries multiplied by YaRN's mscale^2
  } mla;
  // Multi-token prediction modules (model.num_nextn_predict_layers) after the last layer, each a
  // decoder layer (MoE when mtp_moe) with its embedding lookup, norms, projection and loss.
  int64_t mtp_depth = 0;
  bool mtp_moe = false;
  bool mtp_window = false;  // the blocks attend through `window` (the last layer is windowed)
  // data.document_masking: each document attended alone (causal_sdpa.cpp) at cp 1 and in
  // Ulysses; with data.reset_positions the rotary tables hold a row per (position, sample).
  bool documents = false;
  bool positions_per_sample = false;
  // The sliding window of the layers being replayed (model.sliding_window), 0 for full causal
  // attention; set only when shorter than the whole sequence (training.seq_len).
  int64_t window = 0;
  // none; core_attention: the attention core; selective: the attention core and the norms (the
  // linears after a norm compute its output again in backward); full: whole layers.
  Recompute recompute = Recompute::None;
  Device device = Device::Gpu;
  int64_t cpu_threads = 1;  // intra-op threads (CPU flash attention keeps per-thread buffers)
  int64_t tp = 1;
  bool sequence_parallel = false;
  // With sequence parallelism: the linears' gathers and reduce-scatters as collective matmuls
  // (parallel.tp_comm_overlap).
  bool tp_comm_overlap = false;
  int64_t cp = 1;
  bool ulysses = false;
  // Mixture of experts (layers of model.moe.layers).
  int64_t experts = 0;        // routed experts of the model
  int64_t local_experts = 0;  // on this rank (experts / ep)
  int64_t top_k = 0;
  int64_t expert_ffn = 0;     // one expert's width on this rank (moe_intermediate_size / etp)
  int64_t shared_ffn = 0;     // all shared experts together on this rank (shared * width / tp)
  int64_t ep = 1;
  int64_t etp = 1;            // expert tensor parallelism: the rows of the etp group are gathered
  int64_t expert_rows = 0;    // (token, expert) rows the ep exchange brings this rank per micro-batch
  // The fused GPU kernels the run uses (training.fused_kernels, model/fused_kernels.h); all off on
  // a CPU device, where the unfused ops run.
  struct Fused {
    bool rms_norm = false, rope = false, swiglu = false, cross_entropy = false, grad_accumulation = false;
  } fused;

  bool latent_attention() const { return mla.kv_lora > 0; }
  // The width of the rotary tables: MLA's rotary part, else the head.
  int64_t rotary_dim() const { return latent_attention() ? mla.rope : head_dim; }
  int64_t tokens() const { return micro_batch * seq; }
  // Tokens of the norm/residual region: split across tp ranks with sequence parallelism.
  int64_t norm_tokens() const { return sequence_parallel && tp > 1 ? tokens() / tp : tokens(); }
  int64_t element_bytes() const { return dtype_bytes; }
};

struct LayerSegments {
  Segment forward, backward;
};

using Id = Timeline::Id;
constexpr int64_t kF32 = 4;
constexpr int64_t kI64 = 8;

// One micro-batch being replayed: the timeline it writes, the shapes, and the primitive
// operations every layer's replay is written in.
class Replay {
 public:
  Replay(Timeline& timeline, const RankShape& shape) : t(timeline), s(shape), e(shape.element_bytes()) {}

  Timeline& t;
  const RankShape& s;
  const int64_t e;  // bytes of an element of the model dtype

  // A memory-bound kernel writing `bytes` and reading `reads` times as much.
  Id ew(int64_t bytes, double reads = 1) {
    auto& c = t.costs();
    c.memory_bytes += double(bytes) * (1 + reads);
    c.memory_kernels += 1;
    return t.alloc(bytes);
  }
  // y[m,n] = x[m,k] w[n,k]^T in the model dtype (`grouped`: the experts' products, all local
  // experts' rows as one product at the grouped rate).
  // Inside a ring (ring()): the product is computed as s.tp row chunks, one behind each step.
  Id gemm(int64_t m, int64_t n, int64_t k, bool grouped = false) {
    auto& c = t.costs();
    if (ring_gemms_ > 0) {
      --ring_gemms_;
      const int64_t rows = m / s.tp;
      const GemmShape chunk{double(rows), double(n), double(k), double((rows * k + k * n + rows * n) * e), grouped};
      for (int64_t i = 0; i < s.tp; ++i) c.gemms.push_back(chunk);
      c.comms[ring_comm_].behind.push_back(chunk);
    } else {
      c.gemms.push_back(GemmShape{double(m), double(n), double(k), double((m * k + k * n + m * n) * e), grouped});
    }
    return t.alloc(m * n * e);
  }
  // The same product added in place into an existing tensor (addmm_): no new memory.
  void gemm_in_place(int64_t m, int64_t n, int64_t k) {
    t.costs().gemms.push_back(GemmShape{double(m), double(n), double(k), double((m * k + k * n + 2 * m * n) * e)});
  }
  // The product of model-dtype operands added by the GEMM into an fp32 tensor (cuBLAS with an
  // fp32 output and beta 1): reads and writes the fp32 output, no new memory.
  void gemm_into_f32(int64_t m, int64_t n, int64_t k) {
    t.costs().gemms.push_back(GemmShape{double(m), double(n), double(k), double((m * k + k * n) * e + 2 * m * n * kF32)});
  }
  // Records a collective; returns its index for behind().
  size_t comm(CommKind kind, CommGroup group, int64_t bytes, bool overlapped = false) {
    t.costs().comms.push_back(CommOp{kind, group, double(bytes), overlapped, {}});
    return t.costs().comms.size() - 1;
  }
  // Where the next GEMM goes; with behind(), the GEMMs from there on ran while a collective flew.
  size_t gemm_mark() const { return t.costs().gemms.size(); }
  void behind(size_t comm_index, size_t mark) {
    auto& c = t.costs();
    c.comms[comm_index].behind.assign(c.gemms.begin() + std::ptrdiff_t(mark), c.gemms.end());
  }
  // Collective matmul (parallel/tensor/collective_matmul.h): the collective `comm_index` runs as
  // s.tp - 1 send/recv steps, and the next `gemms` GEMMs recorded run as s.tp row chunks, one
  // chunk of each during every step.
  void ring(size_t comm_index, int gemms) {
    t.costs().comms[comm_index].ring_steps = s.tp - 1;
    ring_comm_ = comm_index;
    ring_gemms_ = gemms;
  }
  void drop(Id id) { t.drop(id); }
  void hold(Id id) { t.hold(id); }
  Id alloc(int64_t bytes) { return t.alloc(bytes); }
  // A gradient accumulated in place into `into`: `from` is freed.
  void accumulate(Id into, Id from) {
    t.costs().memory_bytes += 3.0 * double(t.bytes(from));
    t.costs().memory_kernels += 1;
    t.drop(from);
  }
  // `count` in-place element-wise kernels over `bytes` (read and written).
  void in_place(int64_t bytes, int count) {
    t.costs().memory_bytes += 2.0 * double(bytes) * count;
    t.costs().memory_kernels += count;
  }

  bool sp() const { return s.sequence_parallel && s.tp > 1; }
  // The tensor-parallel linears' collectives are collective matmuls.
  bool tp_ring() const { return sp() && s.tp_comm_overlap; }
  // The attention core runs without autograd and again in backward (core_attention, selective).
  bool core_recompute() const { return recipe::recomputes_core_attention(s.recompute); }
  // The linears after a norm compute its output again in backward (selective).
  bool norm_recompute() const { return recipe::lean_layers(s.recompute); }
  // Lean layers: the norm function, the SwiGLU product recomputed (selective).
  bool lean() const { return recipe::lean_layers(s.recompute); }
  int64_t T() const { return s.tokens(); }
  int64_t Tn() const { return s.norm_tokens(); }
  int64_t H() const { return s.hidden; }
 private:
  size_t ring_comm_ = 0;
  int ring_gemms_ = 0;  // GEMMs still to record inside the ring
};

}  // namespace trainer::counting
