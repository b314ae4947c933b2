#pragma once
// The decoder-only transformer (Llama; Mixtral-style MoE layers where model.moe.layers says):
// embedding -> layers (pre-norm attention and feed-forward, residuals) -> final norm -> LM head.
// Parameter names are Hugging Face's. The loss is the sum of token cross-entropies (fp32), so the
// caller can normalise by the global token count of the step (DESIGN.md invariant 2).
#include <ATen/core/Tensor.h>

#include <memory>
#include <vector>

#include "model/decoder_layer.h"
#include "model/fused_kernels.h"
#include "model/layers.h"
#include "model/moe.h"
#include "model/mtp.h"
#include "model/routing_bias.h"
#include "model/parameter.h"
#include "model/rotary.h"
#include "model/sequence_context.h"
#include "model/token_context.h"
#include "recipe/recipe.h"

namespace trainer::model {

// A target with this id is left out of the loss (padding, masked prompts; torch's default).
constexpr int64_t kIgnoreIndex = -100;

// none: nothing recomputed; core_attention: the attention core recomputed in backward; selective:
// the attention core, the norms' outputs and normalised values and the MLP's activation product
// (lean layers); full: whole layers.
using recipe::Recompute;

// One model chunk a pipeline stage holds: decoder layers [first_layer, end_layer), with the
// embedding when it is the model's first chunk and the final norm, LM head and loss when it is its
// last.
struct ChunkLayout {
  int64_t first_layer = 0, end_layer = 0;
  bool embedding = false, head = false;
};

struct ModelOptions {
  recipe::ModelConfig config;
  // The chunks this rank holds, in model order; empty: one chunk, the whole model.
  std::vector<ChunkLayout> chunks;
  uint64_t seed = 0;
  c10::ScalarType dtype = c10::ScalarType::Float;
  c10::Device device = c10::Device(c10::DeviceType::CPU);
  Recompute recompute = Recompute::None;
  bool deferred_parameters = false;  // ParameterOptions::deferred
  TensorParallel tp;
  ContextParallel cp;
  ExpertParallel ep;
  // Fused GPU kernels to use where tensors allow (model/fused_kernels.h); none by default.
  FusedKernels kernels;
  // The weight of each MoE layer's load-balancing loss in the step's loss (router_aux_loss_coef /
  // (micro-batches x dp)); its gradient enters backward at the layer's output (aux_loss_scaler.h).
  // 0: the losses are only reported.
  double aux_loss_scale = 0;
  // The weight of each MoE layer's router z-loss (router_z_loss_coef / (micro-batches x dp)).
  double z_loss_scale = 0;
};

struct ForwardOutput {
  at::Tensor loss_sum;        // sum over targets not ignored of the cross-entropy (fp32 scalar; fp64 for an fp64 model)
  at::Tensor aux_loss;        // sum over MoE layers of their load-balancing losses (fp32 scalar; 0 for dense)
  int64_t tokens = 0;         // targets in the batch (ignored ones included)
  // Multi-token prediction: the modules' cross-entropy sums added up (undefined without MTP).
  at::Tensor mtp_loss_sum;
  // What backward takes: loss_sum, plus mtp_loss_weight / D times mtp_loss_sum with MTP.
  at::Tensor objective;
};

class Transformer {
 public:
  explicit Transformer(const ModelOptions& options);
  // Layers point into the parameter set: a copy would share them, a move keeps them valid.
  Transformer(const Transformer&) = delete;
  Transformer& operator=(const Transformer&) = delete;
  Transformer(Transformer&&) = default;

  // The whole model (one chunk holding everything). inputs, targets: int64 [B, T] token ids on the
  // model's device; targets may be kIgnoreIndex.
  ForwardOutput forward(const at::Tensor& inputs, const at::Tensor& targets) const;
  // Logits [B, T, vocab] (batch-major, as Hugging Face) in the model dtype (for evaluation and interchange tests).
  at::Tensor logits(const at::Tensor& inputs) const;
  // The last decoder layer's output [T, B, hidden] before the final norm (whole model, one tp rank;
  // for the multi-token prediction reference test).
  at::Tensor last_hidden(const at::Tensor& inputs) const;

  // Local chunk `chunk` (0-based among this rank's chunks, as Parameter::chunk counts): from the
  // tokens (first model chunk) or `hidden` [s, b, h] (the previous chunk's output) to the hidden
  // state for the next chunk, or for the model's last chunk to the loss sum (`out` gets the loss,
  // the MoE loss and the token count). `inputs` [B, T] give the sequence length; `targets` are
  // needed by the last chunk only. `context`: the batch's documents and positions (every chunk)
  // and multi-token prediction's tokens ahead (the last chunk: required under context
  // parallelism, else computed here when undefined).
  at::Tensor forward_chunk(int64_t chunk, const at::Tensor& hidden, const at::Tensor& inputs, const at::Tensor& targets,
                           ForwardOutput* out, const TokenContext& context = {}) const;
  int64_t chunks() const { return int64_t(chunks_.size()); }
  const ChunkLayout& chunk_layout(int64_t chunk) const { return chunks_.at(size_t(chunk)); }

  // This rank's MoE layers with their model indices.
  std::vector<std::pair<int64_t, const Moe*>> moe_layers() const;
  // Clears the MoE layers' per-step state (MoeStepState): call before each step's first forward.
  void begin_step() const;
  // The per-expert routing biases (model.moe.bias_update_rate > 0 or sigmoid scores), or null.
  RoutingBias* routing_bias() const { return routing_bias_.get(); }

  // Parameter::unit of the final norm and LM head.
  int64_t head_unit() const { return options_.config.num_hidden_layers + 1; }

  ParameterSet& parameters() { return params_; }
  const ParameterSet& parameters() const { return params_; }
  const ModelOptions& options() const { return options_; }

 private:
  bool whole_model() const;
  // The multi-token prediction modules and their embedding lookups (in the constructor, on the
  // model's last chunk).
  void add_mtp(int64_t padded_vocab);
  // The chunk's embedding (on the first model chunk) or `hidden`, then its decoder layers; *aux
  // gets the sum of its MoE losses.
  // The rotary tables of this rank's positions and the MoE layers' token order.
  using SequenceTables = SequenceContext;
  SequenceTables sequence_tables(const at::Tensor& inputs, const TokenContext& context = {}) const;
  at::Tensor chunk_layers(int64_t chunk, const at::Tensor& hidden, const at::Tensor& inputs,
                          const SequenceTables& tables, at::Tensor* aux) const;
  // The chunk's decoder layers on x; MoE losses added to *aux.
  at::Tensor run_layers(const ChunkLayout& chunk, at::Tensor x, const SequenceTables& tables, at::Tensor* aux) const;
  // One decoder layer under the recompute policy (full: recomputed as a whole in backward).
  std::pair<at::Tensor, at::Tensor> layer_forward(const DecoderLayer& layer, const at::Tensor& x,
                                                  const SequenceTables& tables) const;
  // Final norm, LM head and the loss over the vocabulary (parallel under tp), then the multi-token
  // prediction modules; returns what backward takes (ForwardOutput::objective).
  at::Tensor loss(const at::Tensor& x, const at::Tensor& inputs, const at::Tensor& targets,
                  const at::Tensor& mtp_ahead, const SequenceTables& tables, ForwardOutput* out) const;
  // The cross-entropy sum of normalised hidden states `h` [s, b, H] (this rank's chunk with sp)
  // against `targets` [b, s] through the LM head.
  at::Tensor head_loss(const at::Tensor& h, const at::Tensor& targets) const;
  // The multi-token prediction modules on h0, the final norm's output, reading the tokens and
  // targets ahead from `ahead` (mtp_ahead's): the sum of their losses.
  at::Tensor mtp_losses(const at::Tensor& h0, const at::Tensor& ahead, const SequenceTables& tables,
                        at::Tensor* aux) const;

  ModelOptions options_;
  ParameterSet params_;
  std::vector<ChunkLayout> chunks_;
  Embedding embed_;                  // on the model's first chunk
  std::vector<DecoderLayer> layers_;  // this rank's, in model order
  std::vector<int64_t> layer_index_;  // their model indices
  RmsNorm final_norm_;               // on the model's last chunk
  Linear lm_head_;                   // there too; over the embedding's parameter when tied
  Rotary rotary_;
  std::unique_ptr<RoutingBias> routing_bias_;
  std::vector<MtpModule> mtp_;  // model.num_nextn_predict_layers, on the model's last chunk
  Embedding mtp_embed_;         // their lookups: the embedding, or its copy on the last stage
};

}  // namespace trainer::model
