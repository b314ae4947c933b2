#include "model/linear_cross_entropy_replay.h"

#include <algorithm>

#include "counting/loss_chunks.h"

namespace trainer::model::replays {

Id loss_forward(Replay& r) {
  const int64_t V = r.s.vocab, bs = r.T();
  // The head and the loss in chunks of rows (model/linear_cross_entropy.cpp): per chunk the
  // logits [c, V] (upcast to fp32) and one fp32 temporary; only the input rows and an fp32
  // log-sum-exp per row are saved.
  const int64_t chunk = counting::loss_chunk_rows(bs, V, r.H());
  const Id lse = r.alloc(bs * kF32);
  const bool fused_loss = r.s.fused.cross_entropy;
  for (int64_t s = 0; s < bs; s += chunk) {
    const int64_t c = std::min(chunk, bs - s);
    Id logits = r.gemm(c, V, r.H());
    if (fused_loss) {  // kernels/cross_entropy: the statistics read from the logits as they are
      r.drop(r.ew(3 * c * kF32, double(c * V * r.e) / double(3 * c * kF32)));
      r.drop(logits);
      continue;
    }
    if (r.e != kF32) {
      const Id up = r.ew(c * V * kF32);
      r.drop(logits);
      logits = up;
    }
    const Id exp = r.ew(c * V * kF32, 1);  // exp(logits - max), summed
    r.drop(exp);
    r.drop(logits);
  }
  return lse;
}

Id loss_backward(Replay& r) {
  const int64_t V = r.s.vocab, bs = r.T();
  const bool fused_loss = r.s.fused.cross_entropy;
  // Backward over vocabulary slices (backward_by_slices): per slice the logits [bs, slice] again
  // (upcast to fp32, softmax and one-hot in place, cast back), the slice's weight-gradient rows
  // in one GEMM added into main_grad, and its part of the input gradient summed in fp32.
  const int64_t slice = counting::loss_vocab_slice(V, r.H());
  const bool cpu = r.s.device == Device::Cpu;
  const Id sum = r.ew(bs * r.H() * kF32, 0);  // zeros: the input gradient's fp32 sum
  const bool fused_sums = r.s.fused.grad_accumulation && r.e != kF32;
  for (int64_t s = 0; s < V; s += slice) {
    const int64_t c = std::min(slice, V - s);
    Id g = r.gemm(bs, c, r.H());
    if (fused_loss) {
      // kernels/cross_entropy turns the logits into their gradient in place.
      r.in_place(bs * c * r.e, 1);
    } else {
      if (r.e != kF32) {
        const Id up = r.ew(bs * c * kF32);
        r.drop(g);
        g = up;
      }
      r.t.costs().memory_bytes += 2.0 * double(bs * c * kF32) * 4;  // softmax and one-hot, in place
      if (r.e != kF32) {
        const Id cast = r.ew(bs * c * r.e);
        r.drop(g);
        g = cast;
      }
    }
    if (r.e == kF32) {
      r.gemm_in_place(bs, r.H(), c);  // addmm_ into the sum
      r.gemm_in_place(c, r.H(), bs);  // addmm_ into main_grad
    } else if (fused_sums) {      // the GEMMs add into the fp32 sums themselves
      r.gemm_into_f32(bs, r.H(), c);
      r.gemm_into_f32(c, r.H(), bs);
    } else {
      // bf16 pieces into fp32 sums: on the CPU the add casts each piece to an fp32 temporary
      // first (TensorIterator copies inputs to the common dtype there; CUDA kernels cast as
      // they read).
      const Id piece = r.gemm(bs, r.H(), c);
      r.in_place(bs * r.H() * kF32, 1);
      if (cpu) r.drop(r.ew(bs * r.H() * kF32));
      r.drop(piece);
      const Id gw = r.gemm(c, r.H(), bs);
      r.in_place(c * r.H() * kF32, 1);
      if (cpu) r.drop(r.ew(c * r.H() * kF32));
      r.drop(gw);
    }
    r.drop(g);
  }
  Id gh = sum;
  if (r.e != kF32) {
    gh = r.ew(bs * r.H() * r.e);  // the sum cast to the model dtype
    r.drop(sum);
  }
  return gh;
}

}  // namespace trainer::model::replays
