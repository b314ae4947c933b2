#pragma once
// The tensors our implementation (lib/model, lib/train) allocates for one micro-batch on one
// rank, operation by operation, replayed on a Timeline: what each op creates, what autograd saves
// for backward, when each tensor is freed, and what the op costs. Written against the code of
// lib/model/*.cpp (RmsNorm in fp32 with a cast back, rotary by cat/neg/mul, SDPA flash attention,
// SwiGLU, sort-and-gather MoE, fp32 log-softmax cross-entropy) and checked against the
// byte-counting CPU allocator (test/e2e/test_estimate.cpp), with tensor and sequence parallelism
// too, and with context and expert parallelism (ring or Ulysses attention, the experts' all-to-all
// dispatch: lib/parallel/context, lib/parallel/expert).
#include <cstdint>

#include "estimate/tensor_timeline.h"
#include "recipe/choices.h"

namespace trainer::estimate {

// none; core_attention: the attention core; selective: the attention core and the norms (the
// linears after a norm compute its output again in backward); full: whole layers.
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
  Recompute recompute = Recompute::None;
  Device device = Device::Gpu;
  int64_t cpu_threads = 1;  // intra-op threads (CPU flash attention keeps per-thread buffers)
  int64_t tp = 1;
  bool sequence_parallel = false;
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

  int64_t tokens() const { return micro_batch * seq; }
  // Tokens of the norm/residual region: split across tp ranks with sequence parallelism.
  int64_t norm_tokens() const { return sequence_parallel && tp > 1 ? tokens() / tp : tokens(); }
  int64_t element_bytes() const { return dtype_bytes; }
};

struct LayerSegments {
  Segment forward, backward;
};

// One micro-batch on one rank, as segments that compose: the level after a segment is the level
// before plus its net. A pipeline chunk's timeline is pre.forward, each layer's forward,
// head.forward, head.backward, each layer's backward in reverse, pre.backward, where pre and head
// are those of the first and last chunk of the model, or the receive and send between stages.
struct MicroBatchModel {
  LayerSegments pre_first;   // batch, rotary tables, embedding (and its backward)
  LayerSegments pre_other;   // rotary tables, the activation received from the previous stage
  LayerSegments dense;       // one dense decoder layer
  LayerSegments moe;         // one MoE decoder layer (empty without MoE)
  LayerSegments head_last;   // final norm, LM head, cross-entropy
  LayerSegments head_other;  // the send to the next stage, the gradient received back
};

MicroBatchModel model_micro_batch(const RankShape& shape);

}  // namespace trainer::estimate
