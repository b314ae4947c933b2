#include "model/transformer.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <stdexcept>

#include "model/aux_loss_scaler.h"
#include "model/recompute.h"
#include "parallel/context/document_layout.h"
#include "parallel/context/zigzag.h"
#include "model/linear_cross_entropy.h"
#include "parallel/tensor/communication.h"

namespace trainer::model {

Transformer::Transformer(const ModelOptions& options)
    : options_(options),
      params_(ParameterOptions{options.seed, options.config.initializer_range, options.dtype, options.device,
                               options.deferred_parameters}) {
  const auto& c = options.config;
  chunks_ = options.chunks;
  if (chunks_.empty()) chunks_.push_back(ChunkLayout{0, c.num_hidden_layers, true, true});
  const int64_t padded_vocab = c.padded_vocab_size(options.tp.size);
  for (size_t k = 0; k < chunks_.size(); ++k) {
    const ChunkLayout& chunk = chunks_[k];
    if (chunk.first_layer < 0 || chunk.end_layer < chunk.first_layer || chunk.end_layer > c.num_hidden_layers ||
        (k > 0 && chunk.first_layer < chunks_[k - 1].end_layer))
      throw std::logic_error(fmt::format("model chunk {} holds layers [{}, {}) of {}, out of order", k,
                                         chunk.first_layer, chunk.end_layer, c.num_hidden_layers));
    const size_t before = params_.all().size();
    if (chunk.embedding)
      embed_ = Embedding(params_, "model.embed_tokens.weight", c.vocab_size, padded_vocab, c.hidden_size, options.tp);
    for (int64_t i = chunk.first_layer; i < chunk.end_layer; ++i) {
      const size_t layer_begin = params_.all().size();
      layers_.emplace_back(params_, i, c, options.tp, options.cp, options.ep, options.aux_loss_scale,
                           options.z_loss_scale, options.kernels);
      layer_index_.push_back(i);
      for (size_t p = layer_begin; p < params_.all().size(); ++p) params_.all()[p].unit = 1 + i;
    }
    const size_t head_begin = params_.all().size();
    if (chunk.head) {
      final_norm_ = RmsNorm(params_, "model.norm.weight", c.hidden_size, c.rms_norm_eps, options.tp,
                            options.kernels.rms_norm);
      if (c.tie_word_embeddings && chunks_.front().embedding) {
        lm_head_ = Linear(params_, embed_.parameter(), options.tp);
      } else if (c.tie_word_embeddings) {
        // The embedding is on another stage: this copy, initialised like it (same name and shape),
        // serves as the LM head.
        lm_head_ = Linear::lm_head(params_, "model.embed_tokens.weight", c.hidden_size, c.vocab_size, padded_vocab,
                                   options.tp);
        params_.all().back().tied_across_stages = true;
      } else {
        lm_head_ = Linear::lm_head(params_, "lm_head.weight", c.hidden_size, c.vocab_size, padded_vocab, options.tp);
      }
      if (c.num_nextn_predict_layers > 0) add_mtp(padded_vocab);
    }
    for (size_t i = before; i < params_.all().size(); ++i) params_.all()[i].chunk = int64_t(k);
    for (size_t i = head_begin; i < params_.all().size(); ++i) params_.all()[i].unit = head_unit();
  }
  // The embedding whose tied LM head is a copy on the last stage.
  bool head_here = false;
  for (const auto& chunk : chunks_) head_here = head_here || chunk.head;
  if ((c.tie_word_embeddings || c.num_nextn_predict_layers > 0) && chunks_.front().embedding && !head_here)
    embed_.parameter().tied_across_stages = true;
  for (auto& p : params_.all()) p.fused_grad_accumulation = options.kernels.grad_accumulation;
  rotary_ = Rotary(c.rotary_dim(), c.rope_theta, c.rope_scaling);
  // Sigmoid routing (DeepSeek-V3) always has its bias table, loaded from Hugging Face's
  // e_score_correction_bias; it moves only with bias_update_rate > 0 (zeros change no choice).
  if (c.moe && (c.moe->bias_update_rate > 0 || c.moe->scoring_func == recipe::ScoringFunc::Sigmoid)) {
    routing_bias_ = std::make_unique<RoutingBias>(c.routed_layers(), c.moe->num_local_experts, options.device);
    for (size_t i = 0; i < layers_.size(); ++i)
      if (Moe* moe = layers_[i].moe()) moe->set_routing_bias(routing_bias_->row(layer_index_[i]));
    for (size_t k = 0; k < mtp_.size(); ++k)
      if (Moe* moe = mtp_[k].block().moe()) moe->set_routing_bias(routing_bias_->row(c.num_hidden_layers + int64_t(k)));
  }
}

bool Transformer::whole_model() const {
  return chunks_.size() == 1 && chunks_[0].embedding && chunks_[0].head && chunks_[0].first_layer == 0 &&
         chunks_[0].end_layer == options_.config.num_hidden_layers;
}

std::vector<std::pair<int64_t, const Moe*>> Transformer::moe_layers() const {
  std::vector<std::pair<int64_t, const Moe*>> result;
  for (size_t i = 0; i < layers_.size(); ++i)
    if (layers_[i].moe()) result.emplace_back(layer_index_[i], layers_[i].moe());
  for (size_t k = 0; k < mtp_.size(); ++k)
    if (mtp_[k].block().moe()) result.emplace_back(options_.config.num_hidden_layers + int64_t(k), mtp_[k].block().moe());
  return result;
}

void Transformer::add_mtp(int64_t padded_vocab) {
  const auto& c = options_.config;
  const int64_t depth = c.num_nextn_predict_layers;
  // The lookups' table: the embedding on this rank, else the tied LM head's copy of it, else a
  // copy of its own (initialised like it, its gradient summed with the first stage's).
  Parameter* table = nullptr;
  int64_t uses = 0;
  if (chunks_.front().embedding) {
    table = &embed_.parameter();
    uses = table->uses;
  } else if (c.tie_word_embeddings) {
    table = &lm_head_.parameter();
    uses = table->uses;
  } else {
    table = &params_.create("model.embed_tokens.weight", {c.vocab_size, c.hidden_size}, InitKind::Normal,
                            vocab_shards(c.vocab_size, padded_vocab, options_.tp));
    table->tied_across_stages = true;
  }
  mtp_embed_ = Embedding(params_, *table, options_.tp);
  table->uses = uses + depth;                   // one lookup per module
  lm_head_.parameter().uses += depth;           // one loss per module
  for (int64_t k = 1; k <= depth; ++k)
    mtp_.emplace_back(params_, k, c, options_.tp, options_.cp, options_.ep, options_.aux_loss_scale,
                      options_.z_loss_scale, options_.kernels);
}

void Transformer::begin_step() const {
  for (const auto& [index, moe] : moe_layers()) moe->step_state().reset();
}

std::pair<at::Tensor, at::Tensor> Transformer::layer_forward(const DecoderLayer& layer, const at::Tensor& x,
                                                             const SequenceTables& tables) const {
  // selective: the attention core and the norms; core_attention: the attention core only.
  if (options_.recompute == Recompute::Full) {
    // Keep only the layer input; everything inside is recomputed in backward.
    const bool moe = layer.is_moe();
    auto outputs = recompute(
        [&layer, seq = tables, moe](const std::vector<at::Tensor>& in) {
          auto [h, layer_aux] = layer.forward(in[0], seq, false, false);
          return moe ? std::vector<at::Tensor>{h, layer_aux} : std::vector<at::Tensor>{h};
        },
        {x});
    return {outputs[0], moe ? outputs[1] : at::Tensor()};
  }
  return layer.forward(x, tables, recipe::recomputes_core_attention(options_.recompute),
                       recipe::lean_layers(options_.recompute));
}

at::Tensor Transformer::run_layers(const ChunkLayout& chunk, at::Tensor x, const SequenceTables& tables,
                                   at::Tensor* aux) const {
  for (size_t i = 0; i < layers_.size(); ++i) {
    if (layer_index_[i] < chunk.first_layer || layer_index_[i] >= chunk.end_layer) continue;
    const int64_t unit = 1 + layer_index_[i];
    params_.before_forward(unit);
    auto [h, layer_aux] = layer_forward(layers_[i], x, tables);
    x = h;
    if (layer_aux.defined()) *aux = *aux + layer_aux;
    params_.after_forward(unit);
    x = params_.mark_unit_output(x, unit);
  }
  return x;
}

Transformer::SequenceTables Transformer::sequence_tables(const at::Tensor& inputs, const TokenContext& context) const {
  // Under context parallelism `inputs` hold this rank's zigzag part of each sequence: its positions.
  const int64_t t = inputs.size(1), cp = options_.cp.size;
  const auto index_options = at::TensorOptions().dtype(at::kLong).device(inputs.device());
  const at::Tensor positions = cp == 1 ? at::arange(t, index_options)
                                       : parallel::zigzag_positions(t * cp, cp, options_.cp.rank, index_options);
  SequenceTables tables;
  if (context.positions.defined()) {
    // Positions restarting at each document: one table row per (position, sample), [T, B, d].
    const int64_t b = inputs.size(0);
    std::tie(tables.cos, tables.sin) = rotary_.cos_sin(context.positions.t().reshape({-1}), options_.dtype);
    tables.cos = tables.cos.view({t, b, -1});
    tables.sin = tables.sin.view({t, b, -1});
  } else {
    std::tie(tables.cos, tables.sin) = rotary_.cos_sin(positions, options_.dtype);
  }
  // Document masking: a query sees keys of its own document (causality is the attention core's);
  // under context parallelism the whole sequence's documents, from which ring and Ulysses build
  // their masks.
  tables.documents = context.documents;
  // MoE layers order their tokens by (position, sample), the same on every mesh; under sequence
  // parallelism this rank's rows are its tp part of the sequence.
  if (options_.config.moe) {
    const int64_t tp = options_.tp.sp() ? options_.tp.size : 1, rows = t / tp;
    const int64_t b = inputs.size(0);
    // The data's places of this rank's tokens, [B, t]: a sequence reordered for ring attention
    // with documents (parallel/context/document_layout.h) keeps them in its documents' ids.
    const at::Tensor places = cp > 1 && context.documents.defined()
                                  ? parallel::document_order(context.documents).index_select(1, positions)
                                  : positions.unsqueeze(0).expand({b, t});
    const at::Tensor mine = places.narrow(1, options_.tp.sp() ? options_.tp.rank * rows : 0, rows);
    tables.token_keys = (mine.t() * b + at::arange(b, index_options).unsqueeze(0)).reshape({-1});
  }
  return tables;
}

at::Tensor Transformer::chunk_layers(int64_t chunk, const at::Tensor& hidden, const at::Tensor& inputs,
                                     const SequenceTables& tables, at::Tensor* aux) const {
  const ChunkLayout& layout = chunks_.at(size_t(chunk));
  // Activations are [s, b, h] (sequence chunks contiguous for sequence parallelism).
  if (!layout.embedding && !hidden.defined())
    throw std::logic_error(fmt::format("model chunk {} starts at layer {}: it needs the previous chunk's output", chunk,
                                       layout.first_layer));
  *aux = at::zeros({}, at::TensorOptions().dtype(at::kFloat).device(inputs.device()));
  at::Tensor x = hidden;
  if (layout.embedding) {
    params_.before_forward(0);
    x = embed_.forward(inputs.t());
    params_.after_forward(0);
    x = params_.mark_unit_output(x, 0);
  }
  return run_layers(layout, x, tables, aux);
}

at::Tensor Transformer::forward_chunk(int64_t chunk, const at::Tensor& hidden, const at::Tensor& inputs,
                                      const at::Tensor& targets, ForwardOutput* out, const TokenContext& context) const {
  ForwardOutput local;
  ForwardOutput& result = out ? *out : local;
  const SequenceTables tables = sequence_tables(inputs, context);
  const at::Tensor x = chunk_layers(chunk, hidden, inputs, tables, &result.aux_loss);
  return chunks_.at(size_t(chunk)).head ? loss(x, inputs, targets, context.mtp_ahead, tables, &result) : x;
}

at::Tensor Transformer::logits(const at::Tensor& inputs) const {
  if (options_.tp.size > 1)
    throw std::logic_error("Transformer::logits gives full-vocabulary logits, which a tensor-parallel rank never holds");
  if (!whole_model()) throw std::logic_error("Transformer::logits needs the whole model on this rank");
  at::Tensor aux;
  const at::Tensor x = chunk_layers(0, at::Tensor(), inputs, sequence_tables(inputs), &aux);
  params_.before_forward(head_unit());
  const at::Tensor padded = lm_head_.forward(final_norm_.forward(x));
  params_.after_forward(head_unit());
  return padded.narrow(-1, 0, options_.config.vocab_size).transpose(0, 1).contiguous();
}

at::Tensor Transformer::last_hidden(const at::Tensor& inputs) const {
  if (!whole_model() || options_.tp.size > 1) throw std::logic_error("Transformer::last_hidden needs the whole model on one rank");
  at::Tensor aux;
  return chunk_layers(0, at::Tensor(), inputs, sequence_tables(inputs), &aux);
}

ForwardOutput Transformer::forward(const at::Tensor& inputs, const at::Tensor& targets) const {
  if (!whole_model()) throw std::logic_error("Transformer::forward needs the whole model on this rank; use forward_chunk");
  ForwardOutput out;
  forward_chunk(0, at::Tensor(), inputs, targets, &out);
  return out;
}

at::Tensor Transformer::head_loss(const at::Tensor& h, const at::Tensor& targets) const {
  // The LM head is column-parallel over the vocabulary: each tp rank computes its columns for the
  // whole sequence (gathered from the sequence-parallel chunks; the gradient is reduce-scattered
  // back, or all-reduced without sp). Head and loss run together in chunks of rows
  // (model/linear_cross_entropy.h): no [tokens, V] logits for the whole micro-batch.
  at::Tensor full = h;
  const TensorParallel& tp = options_.tp;
  if (tp.size > 1) full = tp.sp() ? parallel::gather_from_sp(h, *tp.group) : parallel::copy_to_tp(h, *tp.group);
  // [s, b, H] rows in (position, sample) order, as the targets [b, s] transposed.
  const at::Tensor rows = full.reshape({-1, full.size(-1)});
  const at::Tensor flat_targets = targets.t().reshape({-1});
  Parameter& head = lm_head_.parameter();
  const int64_t vocab_begin = head.shards.empty() ? 0 : head.shards.front().offset;
  return linear_cross_entropy_sum(rows, head, lm_head_.queue(), flat_targets, vocab_begin, options_.config.vocab_size,
                                  kIgnoreIndex, tp.size > 1 ? tp.group : nullptr,
                                  counting::loss_chunk_rows(rows.size(0), head.tensor.size(0), rows.size(1)),
                                  options_.kernels);
}

at::Tensor Transformer::mtp_losses(const at::Tensor& h0, const at::Tensor& ahead, const SequenceTables& tables,
                                   at::Tensor* aux) const {
  const bool lean = recipe::lean_layers(options_.recompute);
  const bool core = recipe::recomputes_core_attention(options_.recompute);
  at::Tensor h = h0, sum;
  for (size_t i = 0; i < mtp_.size(); ++i) {
    const MtpModule& module = mtp_[i];
    // Token i + k for module k at position i (0 past the window: those positions predict nothing)
    // and its target i + k + 1.
    const at::Tensor next_tokens = ahead[0][int64_t(i)], module_targets = ahead[1][int64_t(i)];
    const at::Tensor next = mtp_embed_.forward(next_tokens.t());
    at::Tensor module_aux;
    if (options_.recompute == Recompute::Full) {
      const bool moe = module.block().is_moe();
      auto outputs = recompute(
          [&module, seq = tables, moe](const std::vector<at::Tensor>& in) {
            auto [out, block_aux] = module.forward(in[0], in[1], seq, false, false);
            return moe ? std::vector<at::Tensor>{out, block_aux} : std::vector<at::Tensor>{out};
          },
          {h, next});
      h = outputs[0];
      if (moe) module_aux = outputs[1];
    } else {
      std::tie(h, module_aux) = module.forward(h, next, tables, core, lean);
    }
    if (module_aux.defined()) *aux = *aux + module_aux;
    // The normed state feeds both the shared head and the next depth (as Megatron's MTP block).
    h = module.head_norm().forward(h, lean);
    const at::Tensor module_loss = head_loss(h, module_targets);
    sum = sum.defined() ? sum + module_loss : module_loss;
  }
  return sum;
}

at::Tensor Transformer::loss(const at::Tensor& x, const at::Tensor& inputs, const at::Tensor& targets,
                             const at::Tensor& mtp_ahead, const SequenceTables& tables, ForwardOutput* out) const {
  params_.before_forward(head_unit());
  const at::Tensor h = final_norm_.forward(x, recipe::lean_layers(options_.recompute));
  out->loss_sum = head_loss(h, targets);
  out->tokens = targets.numel();
  at::Tensor objective = out->loss_sum;
  if (!mtp_.empty()) {
    // The first module reads the main model's normed hidden state, the one the LM head reads
    // (Megatron's MTP and vLLM's DeepSeek MTP draft take the final norm's output).
    at::Tensor ahead = mtp_ahead;
    if (!ahead.defined()) {
      // Under context parallelism the tokens ahead lie in other ranks' chunks: the batch brings them.
      if (options_.cp.size > 1 || tables.documents.defined())
        throw std::logic_error(
            "multi-token prediction under context parallelism or with document masking needs the batch's mtp_ahead");
      ahead = model::mtp_ahead(inputs, targets, int64_t(mtp_.size()));
    }
    const at::Tensor mtp = mtp_losses(h, ahead, tables, &out->aux_loss);
    out->mtp_loss_sum = mtp.detach();
    objective = objective + mtp * (options_.config.mtp_loss_weight / double(mtp_.size()));
  }
  params_.after_forward(head_unit());
  // The loss is the head's output: its backward may come after other micro-batches' (gpipe).
  objective = params_.mark_unit_output(objective, head_unit());
  if (mtp_.empty()) out->loss_sum = objective;
  out->objective = objective;
  return objective;
}

}  // namespace trainer::model
