#include "model/transformer_replay.h"

#include <algorithm>
#include <stdexcept>
#include <vector>

#include "model/attention_replay.h"
#include "model/layers_replay.h"
#include "model/linear_cross_entropy_replay.h"
#include "model/mla_attention_replay.h"
#include "model/moe_replay.h"
#include "model/parallel_linear_replay.h"
#include "model/rms_norm_replay.h"
#include "model/rotary_replay.h"

namespace trainer::model::replays {

namespace {

// --- the layer's attention: grouped-query (attention_replay.h) or latent (model.mla) ----------
struct AttentionOrMla {
  AttentionBlock gqa;
  MlaBlock mla;
};

Id attention_forward(Replay& r, Id x, AttentionOrMla& a) {
  return r.s.latent_attention() ? mla_attention_forward(r, x, a.mla) : replays::attention_forward(r, x, a.gqa);
}

Id attention_backward(Replay& r, Id g, AttentionOrMla& a) {
  return r.s.latent_attention() ? mla_attention_backward(r, g, a.mla) : replays::attention_backward(r, g, a.gqa);
}

Id attention_nograd_of(Replay& r, Id x) {
  return r.s.latent_attention() ? mla_attention_nograd(r, x) : attention_nograd(r, x);
}

// --- dense decoder layer (transformer.cpp DecoderLayer) -----------------------------------
struct DenseLayer {
  AttentionOrMla attn;
  NormSaved norm2;
  Id norm2_out = Timeline::kNone;
  MlpSaved mlp;
  Id input = Timeline::kNone;  // saved by recompute(full)
  Id output = Timeline::kNone;
};

struct MoeLayer {
  AttentionOrMla attn;
  NormSaved norm2;
  MoeSaved moe;
  Id norm2_out = Timeline::kNone;
};

// --- first stage: batch, rotary tables, embedding ----------------------------------------------
struct Pre {
  Id inputs = Timeline::kNone, targets = Timeline::kNone, cos = Timeline::kNone, sin = Timeline::kNone;
  Id ahead = Timeline::kNone;  // multi-token prediction's tokens and targets ahead
  Id aux = Timeline::kNone;
};

Id dense_forward_inner(Replay& r, Id x, DenseLayer& l) {
  const Id h = attention_forward(r, x, l.attn);
  const Id n2 = norm_forward(r, h, r.Tn(), l.norm2);
  l.norm2_out = n2;
  const Id in = gather_input(r, n2, /*gemms=*/2);
  const Id down = mlp_forward(r, in, n2, r.T(), r.s.ffn, l.mlp, r.lean());
  if (in != n2) r.drop(in);
  r.drop(n2);  // the local reference; gate and up keep theirs
  if (r.norm_recompute()) {  // ... unless they compute it again in backward
    r.drop(l.mlp.in);
    l.mlp.in = Timeline::kNone;
  }
  const Id out = r.ew(r.Tn() * r.H() * r.e, 2);  // h + mlp
  r.drop(down);
  r.drop(h);  // DecoderLayer::forward's local h (in fp32 still saved by the norm)
  return out;
}

Id dense_backward_inner(Replay& r, Id g, DenseLayer& l) {
  // The residual passes g on unchanged; the MLP branch's input gradient comes back through norm2.
  const Id gm = gather_grad_copy(r, g);
  if (r.norm_recompute()) l.mlp.in = norm_nograd(r, Timeline::kNone, r.Tn());  // the norm's output again
  const Id gn = mlp_backward(r, gm, l.mlp, /*reduce=*/true);
  if (gm != g) r.drop(gm);
  norm_backward(r, gn, l.norm2, g);
  return attention_backward(r, g, l.attn);
}

Id dense_nograd(Replay& r, Id x) {
  const Id h = attention_nograd_of(r, x);
  const Id n2 = norm_nograd(r, h, r.Tn());
  const Id in = gather_input(r, n2, /*gemms=*/2);
  const Id y = mlp_nograd(r, in, r.T(), r.s.ffn);
  if (in != n2) r.drop(in);
  r.drop(n2);
  const Id out = r.ew(r.Tn() * r.H() * r.e, 2);
  r.drop(y);
  r.drop(h);
  return out;
}

Id moe_forward_inner(Replay& r, Id x, MoeLayer& l) {
  const Id h = attention_forward(r, x, l.attn);
  const Id n2 = norm_forward(r, h, r.Tn(), l.norm2);
  l.norm2_out = n2;
  const Id y = moe_block_forward(r, n2, l.moe);
  r.drop(n2);  // the local reference (the router keeps the tokens)
  const Id out = r.ew(r.Tn() * r.H() * r.e, 2);
  r.drop(y);
  r.drop(h);
  return out;
}

Id moe_backward_inner(Replay& r, Id g, MoeLayer& l) {
  const Id gn = moe_block_backward(r, g, l.moe);
  norm_backward(r, gn, l.norm2, g);
  return attention_backward(r, g, l.attn);
}

Id moe_nograd(Replay& r, Id x) {
  const Id h = attention_nograd_of(r, x);
  const Id n2 = norm_nograd(r, h, r.Tn());
  const Id tokens = n2;
  const Id combined = moe_block_nograd(r, tokens);
  r.drop(n2);
  const Id out = r.ew(r.Tn() * r.H() * r.e, 2);
  r.drop(combined);
  r.drop(h);
  return out;
}

// --- a layer under the recompute policy ---------------------------------------------------
template <typename Layer>
LayerSegments layer(Replay& r, Id (*fwd)(Replay&, Id, Layer&), Id (*bwd)(Replay&, Id, Layer&), Id (*nograd)(Replay&, Id)) {
  const Id x = r.alloc(r.Tn() * r.H() * r.e);  // the layer input, from the previous segment
  LayerSegments seg;
  if (r.s.recompute == Recompute::Full) {
    // recompute(layer, {x}) (recompute.cpp): x saved, the layer runs without autograd, only
    // its output stays. In backward the layer runs again with autograd, then its backward.
    r.t.begin();
    r.hold(x);
    const Id out = nograd(r, x);
    r.drop(x);
    seg.forward = r.t.end();
    const Id g = r.alloc(r.Tn() * r.H() * r.e);
    r.t.begin();
    Layer l;
    const Id out2 = fwd(r, x, l);  // the recomputed output lives until backward returns
    const Id gin = bwd(r, g, l);
    r.drop(out2);
    r.drop(x);  // the saved input
    seg.backward = r.t.end();
    (void)out;
    (void)gin;
    return seg;
  }
  r.t.begin();
  Layer l;
  const Id out = fwd(r, x, l);
  r.drop(x);  // the caller's variable moves on to the output
  seg.forward = r.t.end();
  (void)out;
  const Id g = r.alloc(r.Tn() * r.H() * r.e);
  r.t.begin();
  const Id gin = bwd(r, g, l);
  (void)gin;
  seg.backward = r.t.end();
  return seg;
}

LayerSegments pre(Replay& r, bool first_stage, bool last_stage) {
  LayerSegments seg;
  Pre p;
  r.t.begin();
  const int64_t bs = r.s.micro_batch * r.s.seq;
  if (first_stage || last_stage) {
    // make_micro_batch: [b, s+1] int64, then contiguous inputs and targets.
    const Id all = r.alloc(r.s.micro_batch * (r.s.seq + 1) * kI64);
    p.inputs = r.alloc(bs * kI64);
    p.targets = r.alloc(bs * kI64);
    // mtp_ahead (model/mtp.h): a token and a target row per module and position.
    if (r.s.mtp_depth > 0) p.ahead = r.alloc(2 * r.s.mtp_depth * bs * kI64);
    r.drop(all);
  }
  const RotaryTables tables = rotary_tables(r);
  p.cos = tables.cos;
  p.sin = tables.sin;
  if (first_stage) {
    // Vocabulary-parallel embedding: each tp rank looks up its rows, then a sum (sp: a
    // reduce-scatter) across tp.
    Id x = r.ew(bs * r.H() * r.e);
    if (r.s.tp > 1) {
      if (r.sp()) {
        r.comm(CommKind::ReduceScatter, CommGroup::Tp, bs * r.H() * r.e);
        const Id res = r.alloc(r.Tn() * r.H() * r.e);
        r.drop(x);
        x = res;
      } else {
        r.comm(CommKind::AllReduce, CommGroup::Tp, bs * r.H() * r.e);
      }
    }
    (void)x;  // the first layer's input
    p.aux = r.alloc(kF32);
  } else {
    r.alloc(r.Tn() * r.H() * r.e);  // the activation received from the previous stage
    r.comm(CommKind::SendRecv, CommGroup::Pp, r.Tn() * r.H() * r.e);
  }
  seg.forward = r.t.end();
  const Id g = r.alloc(r.Tn() * r.H() * r.e);  // gradient of the first layer's input
  if (!first_stage) r.t.begin();
  if (first_stage) {
    // embedding_dense_backward: a [V, H] gradient added into the parameter's gradient (a tied
    // head's gradient went there already: parallel_linear.cpp accumulates directly). The tp
    // sum's backward is the identity; sequence parallelism's reduce-scatter gathers back.
    r.t.begin();
    Id gathered = Timeline::kNone;
    if (r.sp()) {
      r.comm(CommKind::AllGather, CommGroup::Tp, bs * r.H() * r.e);
      gathered = r.alloc(bs * r.H() * r.e);
    }
    const Id gw = r.ew(r.s.vocab * r.H() * r.e, 1);
    // bf16 into the fp32 main_grad: on the CPU the add casts it to an fp32 temporary first.
    if (r.e != kF32 && r.s.device == Device::Cpu) r.drop(r.ew(r.s.vocab * r.H() * kF32));
    r.drop(g);
    r.drop(gathered);
    r.drop(gw);
    r.drop(p.aux);
  } else {
    r.comm(CommKind::SendRecv, CommGroup::Pp, r.Tn() * r.H() * r.e);
    r.drop(g);
  }
  r.drop(p.cos);
  r.drop(p.sin);
  r.drop(p.inputs);
  r.drop(p.targets);
  r.drop(p.ahead);
  seg.backward = r.t.end();
  return seg;
}

// --- multi-token prediction (mtp.cpp, Transformer::mtp_losses): the embedding of the tokens k
//     ahead, its norm and the hidden state's, their concatenation through eh_proj, a decoder
//     layer, the module's head norm and the shared head's loss -------------------------------------
struct MtpModule {
  NormSaved enorm, hnorm, head_norm;
  Id joined = Timeline::kNone;  // eh_proj's input
  DenseLayer dense;
  MoeLayer moe;
  Id in = Timeline::kNone, lse = Timeline::kNone, loss = Timeline::kNone;
  Id h = Timeline::kNone, next = Timeline::kNone;  // full recompute: the module's saved inputs
};

// The embedding lookup of the shifted tokens (the vocabulary-parallel sum over tp as the first
// stage's): the rows of this rank.
Id mtp_lookup(Replay& r) {
  const int64_t bs = r.s.micro_batch * r.s.seq;
  Id e = r.ew(bs * r.H() * r.e);
  if (r.s.tp > 1) {
    if (r.sp()) {
      r.comm(CommKind::ReduceScatter, CommGroup::Tp, bs * r.H() * r.e);
      const Id rows = r.alloc(r.Tn() * r.H() * r.e);
      r.drop(e);
      e = rows;
    } else {
      r.comm(CommKind::AllReduce, CommGroup::Tp, bs * r.H() * r.e);
    }
  }
  return e;
}

// The module up to its block's output, with autograd: e (the lookup, owned here) and h (kept by
// the caller) through their norms, the concatenation, eh_proj and the block.
Id mtp_block_forward(Replay& r, Id h, Id e, MtpModule& m) {
  const Id en = norm_forward(r, e, r.Tn(), m.enorm);
  r.drop(e);  // saved by its norm
  const Id hn = norm_forward(r, h, r.Tn(), m.hnorm);
  m.joined = r.ew(r.Tn() * 2 * r.H() * r.e);
  r.drop(en);
  r.drop(hn);
  const Id projected = r.gemm(r.Tn(), r.H(), 2 * r.H());  // eh_proj saves the concatenation
  const Id out = r.s.mtp_moe ? moe_forward_inner(r, projected, m.moe) : dense_forward_inner(r, projected, m.dense);
  r.drop(projected);
  return out;
}

// h: the previous depth's normed hidden state (kept by the caller). Returns the module's normed
// output, which the shared head and the next module read (one reference for the caller).
Id mtp_forward(Replay& r, Id h, MtpModule& m) {
  const Id e = mtp_lookup(r);
  Id out = Timeline::kNone;
  if (r.s.recompute == Recompute::Full) {
    // recompute(module, {h, next}) (Transformer::mtp_losses): both saved, the module runs without
    // autograd and only its block's output stays; backward runs it again with autograd.
    m.h = h;
    m.next = e;
    r.hold(h);
    const Id en = norm_nograd(r, e, r.Tn());
    const Id hn = norm_nograd(r, h, r.Tn());
    const Id joined = r.ew(r.Tn() * 2 * r.H() * r.e);
    r.drop(en);
    r.drop(hn);
    const Id projected = r.gemm(r.Tn(), r.H(), 2 * r.H());
    r.drop(joined);
    out = r.s.mtp_moe ? moe_nograd(r, projected) : dense_nograd(r, projected);
    r.drop(projected);
  } else {
    out = mtp_block_forward(r, h, e, m);
  }
  const Id normed = norm_forward(r, out, r.Tn(), m.head_norm);
  r.drop(out);  // saved by its norm where the norm needs it
  m.in = gather_input(r, normed);
  m.lse = loss_forward(r);
  if (m.in == normed) r.hold(normed);  // saved by the loss, and the caller's
  m.loss = r.alloc(kF32);
  return normed;
}

// g_out: the gradient of the module's normed output from the next module (none for the last).
// Returns the gradient of its input h.
Id mtp_backward(Replay& r, Id g_out, MtpModule& m) {
  const Id gl = loss_backward(r);
  r.drop(m.lse);
  r.drop(m.in);
  const Id gn = reduce_grad(r, gl);
  if (g_out != Timeline::kNone) r.accumulate(gn, g_out);
  const Id g = norm_backward(r, gn, m.head_norm, Timeline::kNone);
  Id out_again = Timeline::kNone;  // full recompute: the block's output again, alive until backward returns
  if (m.next != Timeline::kNone) {
    r.hold(m.next);
    out_again = mtp_block_forward(r, m.h, m.next, m);
  }
  const Id gp = r.s.mtp_moe ? moe_backward_inner(r, g, m.moe) : dense_backward_inner(r, g, m.dense);
  const Id gj = linear_backward(r, gp, r.Tn(), r.H(), 2 * r.H(), m.joined);
  // The concatenation's backward: views of gj; the two norms' input gradients.
  const Id gh = norm_backward(r, r.ew(r.Tn() * r.H() * r.e), m.hnorm, Timeline::kNone);
  const Id ge = norm_backward(r, r.ew(r.Tn() * r.H() * r.e), m.enorm, Timeline::kNone);
  r.drop(gj);
  // The embedding's weight gradient (sp: the rows gathered back first).
  Id gathered = Timeline::kNone;
  if (r.sp()) {
    r.comm(CommKind::AllGather, CommGroup::Tp, r.s.micro_batch * r.s.seq * r.H() * r.e);
    gathered = r.alloc(r.s.micro_batch * r.s.seq * r.H() * r.e);
  }
  r.drop(r.ew(r.s.vocab * r.H() * r.e, 1));
  r.drop(gathered);
  r.drop(ge);
  r.drop(m.loss);
  r.drop(out_again);
  r.drop(m.next);  // the saved inputs (kNone without full recompute)
  r.drop(m.h);
  return gh;
}

// --- last stage: final norm, LM head, cross-entropy (Transformer::forward) ------------------
LayerSegments head(Replay& r, bool last_stage) {
  LayerSegments seg;
  const Id x = r.alloc(r.Tn() * r.H() * r.e);  // the last layer's output
  if (!last_stage) {
    r.t.begin();
    r.comm(CommKind::SendRecv, CommGroup::Pp, r.Tn() * r.H() * r.e);
    r.drop(x);  // sent to the next stage; nothing here saved it
    seg.forward = r.t.end();
    r.t.begin();
    r.alloc(r.Tn() * r.H() * r.e);  // the gradient received from the next stage
    r.comm(CommKind::SendRecv, CommGroup::Pp, r.Tn() * r.H() * r.e);
    seg.backward = r.t.end();
    return seg;
  }
  r.t.begin();
  NormSaved norm;
  const Id hn = norm_forward(r, x, r.Tn(), norm);
  const Id in = gather_input(r, hn);  // saved whole by the loss function (sp: the gathered rows)
  const Id lse = loss_forward(r);
  // The modules read the normed state hn, then each the previous module's normed output.
  std::vector<MtpModule> modules(size_t(r.s.mtp_depth));
  if (modules.empty()) {
    if (in != hn) r.drop(hn);  // only the gathered rows are saved
  } else if (in == hn) {
    r.hold(hn);  // saved by the loss and read by the modules
  }
  const Id loss = r.alloc(2 * kF32);  // loss_sum and the normalised loss
  Id h = hn;
  for (auto& module : modules) {
    const Id next = mtp_forward(r, h, module);
    if (h != hn) r.drop(h);  // the previous module's output: the norms that read it keep it
    h = next;
  }
  if (h != hn) r.drop(h);
  if (!modules.empty()) r.drop(hn);
  r.drop(x);  // hidden_states returns; fp32 keeps x saved by the norm
  seg.forward = r.t.end();
  r.t.begin();
  // The modules' gradients, last first; each passes the gradient of its input h on.
  Id gh_next = Timeline::kNone;
  for (auto it = modules.rbegin(); it != modules.rend(); ++it) gh_next = mtp_backward(r, gh_next, *it);
  const Id gh = loss_backward(r);
  r.drop(lse);
  r.drop(in);
  const Id ghn = reduce_grad(r, gh);
  if (gh_next != Timeline::kNone) r.accumulate(ghn, gh_next);
  const Id gx = norm_backward(r, ghn, norm, Timeline::kNone);
  r.drop(loss);
  (void)gx;
  seg.backward = r.t.end();
  return seg;
}

}  // namespace

MicroBatchModel model_micro_batch(const RankShape& shape) {
  if (shape.micro_batch < 1 || shape.seq < 1 || shape.hidden < 1 || shape.q_heads < 1 || shape.kv_heads < 1 ||
      shape.head_dim < 1 || shape.vocab < 1 || (shape.dtype_bytes != 2 && shape.dtype_bytes != 4))
    throw std::invalid_argument("model_micro_batch: invalid shape");
  MicroBatchModel m;
  RankShape full = shape;  // the layers without a window, and everything outside the layers
  full.window = 0;
  auto run = [&](auto&& f, const RankShape& s) {
    Timeline t(s.device == Device::Gpu ? 512 : 1);
    Replay r(t, s);
    return f(r);
  };
  const auto dense = [](Replay& r) {
    return layer<DenseLayer>(r, &dense_forward_inner, &dense_backward_inner, &dense_nograd);
  };
  const auto moe = [](Replay& r) { return layer<MoeLayer>(r, &moe_forward_inner, &moe_backward_inner, &moe_nograd); };
  m.pre_first = run([](Replay& r) { return pre(r, true, true); }, full);
  m.pre_other = run([](Replay& r) { return pre(r, false, false); }, full);
  m.dense = run(dense, full);
  if (shape.experts > 0) m.moe = run(moe, full);
  if (shape.window > 0) {
    m.dense_window = run(dense, shape);
    if (shape.experts > 0) m.moe_window = run(moe, shape);
  }
  RankShape last = full;  // the multi-token prediction blocks attend as the last layer
  if (shape.mtp_window) last.window = shape.window;
  m.head_last = run([](Replay& r) { return head(r, true); }, last);
  m.head_other = run([](Replay& r) { return head(r, false); }, full);
  return m;
}

}  // namespace trainer::model::replays
