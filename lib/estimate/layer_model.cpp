#include "estimate/layer_model.h"

#include "counting/loss_chunks.h"

#include <algorithm>
#include <stdexcept>
#include <vector>

#include "estimate/replay_moe.h"

namespace trainer::estimate {

namespace {

using namespace replay;

// A whole micro-batch: dense decoder layers, the recompute policies, the first stage's batch and
// embedding, the last stage's LM head and loss.
class Replay : public MoeReplay {
 public:
  using MoeReplay::MoeReplay;

  // --- dense decoder layer (transformer.cpp DecoderLayer) -----------------------------------
  struct DenseLayer {
    AttentionBlock attn;
    NormSaved norm2;
    Id norm2_out = Timeline::kNone;
    MlpSaved mlp;
    Id input = Timeline::kNone;  // saved by recompute(full)
    Id output = Timeline::kNone;
  };
  Id dense_forward_inner(Id x, DenseLayer& l) {
    const Id h = attention_forward(x, l.attn);
    const Id n2 = norm_forward(h, Tn(), l.norm2);
    l.norm2_out = n2;
    const Id in = gather_input(n2);
    const Id down = reduce_output(mlp_forward(in, n2, T(), s_.ffn, l.mlp, lean()));
    if (in != n2) drop(in);
    drop(n2);  // the local reference; gate and up keep theirs
    if (norm_recompute()) {  // ... unless they compute it again in backward
      drop(l.mlp.in);
      l.mlp.in = Timeline::kNone;
    }
    const Id out = ew(Tn() * H() * e_, 2);  // h + mlp
    drop(down);
    drop(h);  // DecoderLayer::forward's local h (in fp32 still saved by the norm)
    return out;
  }
  Id dense_backward_inner(Id g, DenseLayer& l) {
    // The residual passes g on unchanged; the MLP branch's input gradient comes back through norm2.
    const Id gm = gather_grad_copy(g);
    if (norm_recompute()) l.mlp.in = norm_nograd(Timeline::kNone, Tn());  // the norm's output again
    const Id gn = mlp_backward(gm, l.mlp, /*reduce=*/true);
    if (gm != g) drop(gm);
    norm_backward(gn, l.norm2, g);
    return attention_backward(g, l.attn);
  }

  Id dense_nograd(Id x) {
    const Id h = attention_nograd(x);
    const Id n2 = norm_nograd(h, Tn());
    const Id in = gather_input(n2);
    const Id down = mlp_nograd(in, T(), s_.ffn);
    if (in != n2) drop(in);
    drop(n2);
    const Id y = reduce_output(down);
    const Id out = ew(Tn() * H() * e_, 2);
    drop(y);
    drop(h);
    return out;
  }
  // --- a layer under the recompute policy ---------------------------------------------------
  template <typename Layer>
  LayerSegments layer(Id (Replay::*fwd)(Id, Layer&), Id (Replay::*bwd)(Id, Layer&), Id (Replay::*nograd)(Id)) {
    const Id x = alloc(Tn() * H() * e_);  // the layer input, from the previous segment
    LayerSegments seg;
    if (s_.recompute == Recompute::Full) {
      // recompute(layer, {x}) (recompute.cpp): x saved, the layer runs without autograd, only
      // its output stays. In backward the layer runs again with autograd, then its backward.
      t_.begin();
      hold(x);
      const Id out = (this->*nograd)(x);
      drop(x);
      seg.forward = t_.end();
      const Id g = alloc(Tn() * H() * e_);
      t_.begin();
      Layer l;
      const Id out2 = (this->*fwd)(x, l);  // the recomputed output lives until backward returns
      const Id gin = (this->*bwd)(g, l);
      drop(out2);
      drop(x);  // the saved input
      seg.backward = t_.end();
      (void)out;
      (void)gin;
      return seg;
    }
    t_.begin();
    Layer l;
    const Id out = (this->*fwd)(x, l);
    drop(x);  // the caller's variable moves on to the output
    seg.forward = t_.end();
    (void)out;
    const Id g = alloc(Tn() * H() * e_);
    t_.begin();
    const Id gin = (this->*bwd)(g, l);
    (void)gin;
    seg.backward = t_.end();
    return seg;
  }

  // --- first stage: batch, rotary tables, embedding ----------------------------------------------
  struct Pre {
    Id inputs = Timeline::kNone, targets = Timeline::kNone, cos = Timeline::kNone, sin = Timeline::kNone;
    Id aux = Timeline::kNone;
  };
  LayerSegments pre(bool first_stage, bool last_stage) {
    LayerSegments seg;
    Pre p;
    t_.begin();
    const int64_t bs = s_.micro_batch * s_.seq;
    if (first_stage || last_stage) {
      // make_micro_batch: [b, s+1] int64, then contiguous inputs and targets.
      const Id all = alloc(s_.micro_batch * (s_.seq + 1) * kI64);
      p.inputs = alloc(bs * kI64);
      p.targets = alloc(bs * kI64);
      drop(all);
    }
    // Rotary tables (Rotary::cos_sin): positions, outer product, cat, cos and sin.
    const int64_t d = s_.head_dim;
    const Id positions = alloc(s_.seq * kI64);
    const Id posf = ew(s_.seq * kF32);
    const Id freqs = ew(s_.seq * d / 2 * kF32);
    drop(posf);
    const Id emb = ew(s_.seq * d * kF32);
    p.cos = ew(s_.seq * d * kF32);
    p.sin = ew(s_.seq * d * kF32);
    if (e_ != kF32) {
      const Id c = ew(s_.seq * d * e_), sn = ew(s_.seq * d * e_);
      drop(p.cos);
      drop(p.sin);
      p.cos = c;
      p.sin = sn;
    }
    drop(freqs);
    drop(emb);
    drop(positions);
    if (first_stage) {
      // Vocabulary-parallel embedding: each tp rank looks up its rows, then a sum (sp: a
      // reduce-scatter) across tp.
      Id x = ew(bs * H() * e_);
      if (s_.tp > 1) {
        if (sp()) {
          comm(CommKind::ReduceScatter, CommGroup::Tp, bs * H() * e_);
          const Id r = alloc(Tn() * H() * e_);
          drop(x);
          x = r;
        } else {
          comm(CommKind::AllReduce, CommGroup::Tp, bs * H() * e_);
        }
      }
      (void)x;  // the first layer's input
      p.aux = alloc(kF32);
    } else {
      alloc(Tn() * H() * e_);  // the activation received from the previous stage
      comm(CommKind::SendRecv, CommGroup::Pp, Tn() * H() * e_);
    }
    seg.forward = t_.end();
    const Id g = alloc(Tn() * H() * e_);  // gradient of the first layer's input
    if (!first_stage) t_.begin();
    if (first_stage) {
      // embedding_dense_backward: a [V, H] gradient added into the parameter's gradient (a tied
      // head's gradient went there already: parallel_linear.cpp accumulates directly). The tp
      // sum's backward is the identity; sequence parallelism's reduce-scatter gathers back.
      t_.begin();
      Id gathered = Timeline::kNone;
      if (sp()) {
        comm(CommKind::AllGather, CommGroup::Tp, bs * H() * e_);
        gathered = alloc(bs * H() * e_);
      }
      const Id gw = ew(s_.vocab * H() * e_, 1);
      // bf16 into the fp32 main_grad: on the CPU the add casts it to an fp32 temporary first.
      if (e_ != kF32 && s_.device == Device::Cpu) drop(ew(s_.vocab * H() * kF32));
      drop(g);
      drop(gathered);
      drop(gw);
      drop(p.aux);
    } else {
      comm(CommKind::SendRecv, CommGroup::Pp, Tn() * H() * e_);
      drop(g);
    }
    drop(p.cos);
    drop(p.sin);
    drop(p.inputs);
    drop(p.targets);
    seg.backward = t_.end();
    return seg;
  }

  // --- last stage: final norm, LM head, cross-entropy (Transformer::forward) ------------------
  LayerSegments head(bool last_stage) {
    LayerSegments seg;
    const Id x = alloc(Tn() * H() * e_);  // the last layer's output
    if (!last_stage) {
      t_.begin();
      comm(CommKind::SendRecv, CommGroup::Pp, Tn() * H() * e_);
      drop(x);  // sent to the next stage; nothing here saved it
      seg.forward = t_.end();
      t_.begin();
      alloc(Tn() * H() * e_);  // the gradient received from the next stage
      comm(CommKind::SendRecv, CommGroup::Pp, Tn() * H() * e_);
      seg.backward = t_.end();
      return seg;
    }
    const int64_t V = s_.vocab, bs = T();
    // The head and the loss in chunks of rows (model/linear_cross_entropy.cpp): per chunk the
    // logits [c, V] (upcast to fp32) and one fp32 temporary; only the input rows and an fp32
    // log-sum-exp per row are saved.
    const int64_t chunk = counting::loss_chunk_rows(bs, V, H());
    t_.begin();
    NormSaved norm;
    const Id hn = norm_forward(x, Tn(), norm);
    drop(x);  // hidden_states returns; fp32 keeps x saved by the norm
    const Id in = gather_input(hn);  // saved whole by the loss function (sp: the gathered rows)
    const Id lse = alloc(bs * kF32);
    const bool fused_loss = s_.fused.cross_entropy;
    for (int64_t s = 0; s < bs; s += chunk) {
      const int64_t c = std::min(chunk, bs - s);
      Id logits = gemm(c, V, H());
      if (fused_loss) {  // kernels/cross_entropy: the statistics read from the logits as they are
        drop(ew(3 * c * kF32, double(c * V * e_) / double(3 * c * kF32)));
        drop(logits);
        continue;
      }
      if (e_ != kF32) {
        const Id up = ew(c * V * kF32);
        drop(logits);
        logits = up;
      }
      const Id exp = ew(c * V * kF32, 1);  // exp(logits - max), summed
      drop(exp);
      drop(logits);
    }
    if (in != hn) drop(hn);  // only the gathered rows are saved
    const Id loss = alloc(2 * kF32);  // loss_sum and the normalised loss
    seg.forward = t_.end();
    t_.begin();
    // Backward over vocabulary slices (backward_by_slices): per slice the logits [bs, slice] again
    // (upcast to fp32, softmax and one-hot in place, cast back), the slice's weight-gradient rows
    // in one GEMM added into main_grad, and its part of the input gradient summed in fp32.
    const int64_t slice = counting::loss_vocab_slice(V, H());
    const bool cpu = s_.device == Device::Cpu;
    const Id sum = ew(bs * H() * kF32, 0);  // zeros: the input gradient's fp32 sum
    const bool fused_sums = s_.fused.grad_accumulation && e_ != kF32;
    for (int64_t s = 0; s < V; s += slice) {
      const int64_t c = std::min(slice, V - s);
      Id g = gemm(bs, c, H());
      if (fused_loss) {
        // kernels/cross_entropy turns the logits into their gradient in place.
        in_place(bs * c * e_, 1);
      } else {
        if (e_ != kF32) {
          const Id up = ew(bs * c * kF32);
          drop(g);
          g = up;
        }
        t_.costs().memory_bytes += 2.0 * double(bs * c * kF32) * 4;  // softmax and one-hot, in place
        if (e_ != kF32) {
          const Id cast = ew(bs * c * e_);
          drop(g);
          g = cast;
        }
      }
      if (e_ == kF32) {
        gemm_in_place(bs, H(), c);  // addmm_ into the sum
        gemm_in_place(c, H(), bs);  // addmm_ into main_grad
      } else if (fused_sums) {      // the GEMMs add into the fp32 sums themselves
        gemm_into_f32(bs, H(), c);
        gemm_into_f32(c, H(), bs);
      } else {
        // bf16 pieces into fp32 sums: on the CPU the add casts each piece to an fp32 temporary
        // first (TensorIterator copies inputs to the common dtype there; CUDA kernels cast as
        // they read).
        const Id piece = gemm(bs, H(), c);
        in_place(bs * H() * kF32, 1);
        if (cpu) drop(ew(bs * H() * kF32));
        drop(piece);
        const Id gw = gemm(c, H(), bs);
        in_place(c * H() * kF32, 1);
        if (cpu) drop(ew(c * H() * kF32));
        drop(gw);
      }
      drop(g);
    }
    Id gh = sum;
    if (e_ != kF32) {
      gh = ew(bs * H() * e_);  // the sum cast to the model dtype
      drop(sum);
    }
    drop(lse);
    drop(in);
    const Id gx = norm_backward(reduce_grad(gh), norm, Timeline::kNone);
    drop(loss);
    (void)gx;
    seg.backward = t_.end();
    return seg;
  }

};

}  // namespace

MicroBatchModel model_micro_batch(const RankShape& shape) {
  if (shape.micro_batch < 1 || shape.seq < 1 || shape.hidden < 1 || shape.q_heads < 1 || shape.kv_heads < 1 ||
      shape.head_dim < 1 || shape.vocab < 1 || (shape.dtype_bytes != 2 && shape.dtype_bytes != 4))
    throw std::invalid_argument("model_micro_batch: invalid shape");
  MicroBatchModel m;
  auto run = [&](auto&& f) {
    Timeline t(shape.device == Device::Gpu ? 512 : 1);
    Replay r(t, shape);
    return f(r);
  };
  m.pre_first = run([](Replay& r) { return r.pre(true, true); });
  m.pre_other = run([](Replay& r) { return r.pre(false, false); });
  m.dense = run([](Replay& r) {
    return r.layer<Replay::DenseLayer>(&Replay::dense_forward_inner, &Replay::dense_backward_inner,
                                       &Replay::dense_nograd);
  });
  if (shape.experts > 0)
    m.moe = run([](Replay& r) {
      return r.layer<Replay::MoeLayer>(&Replay::moe_forward_inner, &Replay::moe_backward_inner, &Replay::moe_nograd);
    });
  m.head_last = run([](Replay& r) { return r.head(true); });
  m.head_other = run([](Replay& r) { return r.head(false); });
  return m;
}

}  // namespace trainer::estimate
