#include "model/transformer.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <stdexcept>

#include "model/aux_loss_scaler.h"
#include "model/recompute.h"
#include "parallel/context/zigzag.h"
#include "model/linear_cross_entropy.h"
#include "parallel/tensor/communication.h"

namespace trainer::model {

DecoderLayer::DecoderLayer(ParameterSet& params, int64_t index, const recipe::ModelConfig& config, TensorParallel tp,
                           ContextParallel cp, ExpertParallel ep, double aux_loss_scale, double z_loss_scale,
                           const FusedKernels& kernels)
    : aux_loss_scale_(aux_loss_scale), z_loss_scale_(z_loss_scale) {
  const std::string prefix = fmt::format("model.layers.{}.", index);
  input_norm_ = RmsNorm(params, prefix + "input_layernorm.weight", config.hidden_size, config.rms_norm_eps, tp,
                        kernels.rms_norm);
  if (config.mla)
    mla_.emplace(params, prefix + "self_attn.", config, tp, cp);
  else
    attention_ = Attention(params, prefix + "self_attn.", config, tp, cp, kernels.rope, config.window_of(index));
  post_attention_norm_ = RmsNorm(params, prefix + "post_attention_layernorm.weight", config.hidden_size,
                                 config.rms_norm_eps, tp, kernels.rms_norm);
  if (config.is_moe_layer(index))
    moe_.emplace(params, prefix + "block_sparse_moe.", config, tp, ep, GroupedGemm::Auto, kernels.swiglu);
  else
    mlp_.emplace(params, prefix + "mlp.", config.hidden_size, config.intermediate_size, tp, /*mixtral_names=*/false,
                 kernels.swiglu);
}

std::pair<at::Tensor, at::Tensor> DecoderLayer::forward(const at::Tensor& x, const at::Tensor& cos,
                                                        const at::Tensor& sin, const at::Tensor& token_keys,
                                                        bool recompute_attention_core, bool lean) const {
  // Lean (recompute policy selective): the norms save only their input and an rsqrt per row, the
  // linears after each norm compute its output again in backward instead of saving it, and the
  // MLP recomputes its activation product.
  const at::Tensor normed_input = input_norm_.forward(x, lean);
  const InputAgain again = lean ? input_norm_.again(x) : InputAgain();
  const at::Tensor h = x + (mla_ ? mla_->forward(normed_input, cos, sin, recompute_attention_core, again)
                                 : attention_.forward(normed_input, cos, sin, recompute_attention_core, again));
  const at::Tensor normed = post_attention_norm_.forward(h, lean);
  if (moe_) {
    MoeOutput out = moe_->forward(normed, token_keys);
    const at::Tensor y = attach_aux_loss(attach_aux_loss(h + out.output, out.aux_loss, aux_loss_scale_), out.z_loss,
                                         z_loss_scale_);
    return {y, out.aux_loss};
  }
  return {h + mlp_->forward(normed, lean ? post_attention_norm_.again(h) : InputAgain(), lean), at::Tensor()};
}

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
    }
    for (size_t i = before; i < params_.all().size(); ++i) params_.all()[i].chunk = int64_t(k);
    for (size_t i = head_begin; i < params_.all().size(); ++i) params_.all()[i].unit = head_unit();
  }
  // The embedding whose tied LM head is a copy on the last stage.
  bool head_here = false;
  for (const auto& chunk : chunks_) head_here = head_here || chunk.head;
  if (c.tie_word_embeddings && chunks_.front().embedding && !head_here) embed_.parameter().tied_across_stages = true;
  for (auto& p : params_.all()) p.fused_grad_accumulation = options.kernels.grad_accumulation;
  rotary_ = Rotary(c.rotary_dim(), c.rope_theta, c.rope_scaling);
  // Sigmoid routing (DeepSeek-V3) always has its bias table, loaded from Hugging Face's
  // e_score_correction_bias; it moves only with bias_update_rate > 0 (zeros change no choice).
  if (c.moe && (c.moe->bias_update_rate > 0 || c.moe->scoring_func == recipe::ScoringFunc::Sigmoid)) {
    routing_bias_ = std::make_unique<RoutingBias>(c.moe->layers, c.moe->num_local_experts, options.device);
    for (size_t i = 0; i < layers_.size(); ++i)
      if (Moe* moe = layers_[i].moe()) moe->set_routing_bias(routing_bias_->row(layer_index_[i]));
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
  return result;
}

void Transformer::begin_step() const {
  for (const auto& [index, moe] : moe_layers()) moe->step_state().reset();
}

at::Tensor Transformer::run_layers(const ChunkLayout& chunk, at::Tensor x, const at::Tensor& cos, const at::Tensor& sin,
                                   const at::Tensor& token_keys, at::Tensor* aux) const {
  // selective: the attention core and the norms; core_attention: the attention core only.
  const bool core = recipe::recomputes_core_attention(options_.recompute);
  const bool lean = recipe::lean_layers(options_.recompute);
  for (size_t i = 0; i < layers_.size(); ++i) {
    if (layer_index_[i] < chunk.first_layer || layer_index_[i] >= chunk.end_layer) continue;
    const DecoderLayer& layer = layers_[i];
    const int64_t unit = 1 + layer_index_[i];
    params_.before_forward(unit);
    if (options_.recompute == Recompute::Full) {
      // Keep only the layer input; everything inside is recomputed in backward.
      const bool moe = layer.is_moe();
      auto outputs = recompute(
          [&layer, cos = cos, sin = sin, token_keys = token_keys, moe](const std::vector<at::Tensor>& in) {
            auto [h, layer_aux] = layer.forward(in[0], cos, sin, token_keys, false, false);
            return moe ? std::vector<at::Tensor>{h, layer_aux} : std::vector<at::Tensor>{h};
          },
          {x});
      x = outputs[0];
      if (moe) *aux = *aux + outputs[1];
    } else {
      auto [h, layer_aux] = layer.forward(x, cos, sin, token_keys, core, lean);
      x = h;
      if (layer_aux.defined()) *aux = *aux + layer_aux;
    }
    params_.after_forward(unit);
    x = params_.mark_unit_output(x, unit);
  }
  return x;
}

at::Tensor Transformer::chunk_layers(int64_t chunk, const at::Tensor& hidden, const at::Tensor& inputs,
                                     at::Tensor* aux) const {
  const ChunkLayout& layout = chunks_.at(size_t(chunk));
  // Under context parallelism `inputs` hold this rank's zigzag part of each sequence: its positions.
  const int64_t t = inputs.size(1), cp = options_.cp.size;
  const auto index_options = at::TensorOptions().dtype(at::kLong).device(inputs.device());
  const at::Tensor positions = cp == 1 ? at::arange(t, index_options)
                                       : parallel::zigzag_positions(t * cp, cp, options_.cp.rank, index_options);
  auto [cos, sin] = rotary_.cos_sin(positions, options_.dtype);
  // Activations are [s, b, h] (sequence chunks contiguous for sequence parallelism).
  if (!layout.embedding && !hidden.defined())
    throw std::logic_error(fmt::format("model chunk {} starts at layer {}: it needs the previous chunk's output", chunk,
                                       layout.first_layer));
  *aux = at::zeros({}, at::TensorOptions().dtype(at::kFloat).device(inputs.device()));
  // MoE layers order their tokens by (position, sample), the same on every mesh; under sequence
  // parallelism this rank's rows are its tp part of the sequence.
  at::Tensor token_keys;
  if (options_.config.moe) {
    const int64_t tp = options_.tp.sp() ? options_.tp.size : 1, rows = t / tp;
    const at::Tensor mine = positions.narrow(0, options_.tp.sp() ? options_.tp.rank * rows : 0, rows);
    const int64_t b = inputs.size(0);
    token_keys = (mine.unsqueeze(1) * b + at::arange(b, index_options).unsqueeze(0)).reshape({-1});
  }
  at::Tensor x = hidden;
  if (layout.embedding) {
    params_.before_forward(0);
    x = embed_.forward(inputs.t());
    params_.after_forward(0);
    x = params_.mark_unit_output(x, 0);
  }
  return run_layers(layout, x, cos, sin, token_keys, aux);
}

at::Tensor Transformer::forward_chunk(int64_t chunk, const at::Tensor& hidden, const at::Tensor& inputs,
                                      const at::Tensor& targets, ForwardOutput* out) const {
  ForwardOutput local;
  ForwardOutput& result = out ? *out : local;
  const at::Tensor x = chunk_layers(chunk, hidden, inputs, &result.aux_loss);
  return chunks_.at(size_t(chunk)).head ? loss(x, targets, &result) : x;
}

at::Tensor Transformer::logits(const at::Tensor& inputs) const {
  if (options_.tp.size > 1)
    throw std::logic_error("Transformer::logits gives full-vocabulary logits, which a tensor-parallel rank never holds");
  if (!whole_model()) throw std::logic_error("Transformer::logits needs the whole model on this rank");
  at::Tensor aux;
  const at::Tensor x = chunk_layers(0, at::Tensor(), inputs, &aux);
  params_.before_forward(head_unit());
  const at::Tensor padded = lm_head_.forward(final_norm_.forward(x));
  params_.after_forward(head_unit());
  return padded.narrow(-1, 0, options_.config.vocab_size).transpose(0, 1).contiguous();
}

ForwardOutput Transformer::forward(const at::Tensor& inputs, const at::Tensor& targets) const {
  if (!whole_model()) throw std::logic_error("Transformer::forward needs the whole model on this rank; use forward_chunk");
  ForwardOutput out;
  forward_chunk(0, at::Tensor(), inputs, targets, &out);
  return out;
}

at::Tensor Transformer::loss(const at::Tensor& x, const at::Tensor& targets, ForwardOutput* out) const {
  params_.before_forward(head_unit());
  const at::Tensor h = final_norm_.forward(x, recipe::lean_layers(options_.recompute));
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
  out->loss_sum = linear_cross_entropy_sum(rows, head, lm_head_.queue(), flat_targets, vocab_begin,
                                           options_.config.vocab_size, kIgnoreIndex, tp.size > 1 ? tp.group : nullptr,
                                           counting::loss_chunk_rows(rows.size(0), head.tensor.size(0), rows.size(1)),
                                           options_.kernels);
  out->tokens = targets.numel();
  params_.after_forward(head_unit());
  // The loss is the head's output: its backward may come after other micro-batches' (gpipe).
  out->loss_sum = params_.mark_unit_output(out->loss_sum, head_unit());
  return out->loss_sum;
}

}  // namespace trainer::model
