#include "model/transformer.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <stdexcept>

#include "model/recompute.h"
#include "parallel/tensor/vocab_parallel_loss.h"

namespace trainer::model {

Recompute parse_recompute(const std::string& name) {
  if (name == "none") return Recompute::None;
  if (name == "selective") return Recompute::Selective;
  if (name == "full") return Recompute::Full;
  throw std::invalid_argument("unknown recompute mode " + name);
}

DecoderLayer::DecoderLayer(ParameterSet& params, int64_t index, const recipe::ModelConfig& config, TensorParallel tp) {
  const std::string prefix = fmt::format("model.layers.{}.", index);
  input_norm_ = RmsNorm(params, prefix + "input_layernorm.weight", config.hidden_size, config.rms_norm_eps, tp);
  attention_ = Attention(params, prefix + "self_attn.", config, tp);
  post_attention_norm_ =
      RmsNorm(params, prefix + "post_attention_layernorm.weight", config.hidden_size, config.rms_norm_eps, tp);
  if (config.is_moe_layer(index))
    moe_.emplace(params, prefix + "block_sparse_moe.", config, tp);
  else
    mlp_.emplace(params, prefix + "mlp.", config.hidden_size, config.intermediate_size, tp);
}

std::pair<at::Tensor, at::Tensor> DecoderLayer::forward(const at::Tensor& x, const at::Tensor& cos,
                                                        const at::Tensor& sin, bool recompute_attention_core) const {
  const at::Tensor h = x + attention_.forward(input_norm_.forward(x), cos, sin, recompute_attention_core);
  const at::Tensor normed = post_attention_norm_.forward(h);
  if (moe_) {
    MoeOutput out = moe_->forward(normed);
    return {h + out.output, out.aux_loss};
  }
  return {h + mlp_->forward(normed), at::Tensor()};
}

Transformer::Transformer(const ModelOptions& options)
    : options_(options),
      params_(ParameterOptions{options.seed, options.config.initializer_range, options.dtype, options.device}) {
  const auto& c = options.config;
  const int64_t padded_vocab = c.padded_vocab_size(options.tp.size);
  embed_ = Embedding(params_, "model.embed_tokens.weight", c.vocab_size, padded_vocab, c.hidden_size, options.tp);
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) layers_.emplace_back(params_, i, c, options.tp);
  final_norm_ = RmsNorm(params_, "model.norm.weight", c.hidden_size, c.rms_norm_eps, options.tp);
  if (c.tie_word_embeddings)
    lm_head_ = Linear(params_, embed_.parameter(), options.tp);
  else
    lm_head_ = Linear::lm_head(params_, "lm_head.weight", c.hidden_size, c.vocab_size, padded_vocab, options.tp);
  rotary_ = Rotary(c.head_dim, c.rope_theta, c.rope_scaling);
}

at::Tensor Transformer::hidden_states(const at::Tensor& inputs, at::Tensor* aux_loss) const {
  const int64_t t = inputs.size(1);
  const at::Tensor positions = at::arange(t, at::TensorOptions().dtype(at::kLong).device(inputs.device()));
  auto [cos, sin] = rotary_.cos_sin(positions, options_.dtype);
  // Activations are [s, b, h] from here on (sequence chunks contiguous for sequence parallelism).
  at::Tensor x = embed_.forward(inputs.t());
  at::Tensor aux = at::zeros({}, at::TensorOptions().dtype(at::kFloat).device(inputs.device()));
  const bool selective = options_.recompute == Recompute::Selective;
  for (const auto& layer : layers_) {
    if (options_.recompute == Recompute::Full) {
      // Keep only the layer input; everything inside is recomputed in backward.
      const bool moe = layer.is_moe();
      auto outputs = recompute(
          [&layer, cos = cos, sin = sin, moe](const std::vector<at::Tensor>& in) {
            auto [h, layer_aux] = layer.forward(in[0], cos, sin, false);
            return moe ? std::vector<at::Tensor>{h, layer_aux} : std::vector<at::Tensor>{h};
          },
          {x});
      x = outputs[0];
      if (moe) aux = aux + outputs[1];
    } else {
      auto [h, layer_aux] = layer.forward(x, cos, sin, selective);
      x = h;
      if (layer_aux.defined()) aux = aux + layer_aux;
    }
  }
  if (aux_loss) *aux_loss = aux;
  return final_norm_.forward(x);
}

at::Tensor Transformer::logits(const at::Tensor& inputs) const {
  if (options_.tp.size > 1)
    throw std::logic_error("Transformer::logits gives full-vocabulary logits, which a tensor-parallel rank never holds");
  const at::Tensor padded = lm_head_.forward(hidden_states(inputs, nullptr));
  return padded.narrow(-1, 0, options_.config.vocab_size).transpose(0, 1).contiguous();
}

ForwardOutput Transformer::forward(const at::Tensor& inputs, const at::Tensor& targets) const {
  ForwardOutput out;
  const at::Tensor h = hidden_states(inputs, &out.aux_loss);
  // The LM head is column-parallel over the vocabulary: each tp rank computes its columns for the
  // whole sequence (gathered from the sequence-parallel chunks). Logits are [s, b, V_local].
  const at::Tensor logits = lm_head_.forward(h);
  const at::Tensor flat_targets = targets.t().reshape({-1});
  // At least fp32 (bf16 logits are upcast; an fp64 model for gradient checks keeps fp64).
  at::Tensor flat = logits.reshape({-1, logits.size(-1)}).to(at::promote_types(logits.scalar_type(), at::kFloat));
  if (options_.tp.size == 1) {
    // Padding columns (vocabulary padded past vocab_size) take no part in the softmax.
    if (flat.size(1) > options_.config.vocab_size) flat = flat.narrow(1, 0, options_.config.vocab_size);
    out.loss_sum = at::cross_entropy_loss(flat, flat_targets, /*weight=*/{}, at::Reduction::Sum, kIgnoreIndex);
  } else {
    // Vocabulary-parallel cross-entropy: max, sum-exp and target logit reduced over tp.
    const ShardSpec& rows = embed_.parameter().shards.at(0);
    out.loss_sum = parallel::vocab_parallel_cross_entropy_sum(flat, flat_targets, rows.offset,
                                                              options_.config.vocab_size, kIgnoreIndex,
                                                              *options_.tp.group);
  }
  out.tokens = targets.numel();
  return out;
}

}  // namespace trainer::model
