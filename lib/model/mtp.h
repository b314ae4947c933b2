#pragma once
// One multi-token prediction module of DeepSeek-V3 (model.num_nextn_predict_layers; DeepSeek-V3
// technical report, section 2.2, with the concatenation order of DeepSeek's released weights and
// Megatron's: the embedding first). Module k at position i combines the previous depth's normed
// hidden state h_i with the embedding of token i + k:
//   h'_i = eh_proj([enorm(Emb(t_{i+k})); hnorm(h_i)]),  h^k = shared_head.norm(Block_k(h')),
// and predicts token i + k + 1 from h^k_i through the shared LM head. h^0 is the main model's
// final norm output, the LM head's input (as in Megatron's MTP block, whose per-module final
// norm is shared_head.norm and whose output feeds the next depth, and in vLLM's DeepSeek MTP). Its
// parameters are DeepSeek's model.layers.{num_hidden_layers + k - 1}.*; the block is a decoder
// layer of the last layer's kind (MoE in DeepSeek-V3).
//
// eh_proj is replicated over tp: its input and output are the residual stream's (this rank's
// sequence chunk with sequence parallelism, whose weight gradient is then a partial sum over tp,
// as the norms').
#include <ATen/core/Tensor.h>

#include <utility>

#include "model/decoder_layer.h"
#include "model/layers.h"
#include "recipe/recipe.h"

namespace trainer::model {

// What the modules read beyond each position, from the whole sequence: int64 [2, depth, B, T]
// where [0][k-1][b][i] is token i + k (the inputs, then the last target; 0 past the window) and
// [1][k-1][b][i] is target i + k (kIgnoreIndex past the window). inputs, targets: [B, T], the
// whole sequence. Computed before context parallelism's zigzag split, it splits with the inputs.
// `documents` (data.document_masking without predict_across_documents): int64 [B, T + 1], the
// document of each input and of the last target; a module's target in another document than its
// position is left out too (kIgnoreIndex), as the main model's crossing target is.
at::Tensor mtp_ahead(const at::Tensor& inputs, const at::Tensor& targets, int64_t depth,
                     const at::Tensor& documents = at::Tensor());

class MtpModule {
 public:
  // depth: k, from 1.
  MtpModule(ParameterSet& params, int64_t depth, const recipe::ModelConfig& config, TensorParallel tp,
            ContextParallel cp, ExpertParallel ep, double aux_loss_scale, double z_loss_scale,
            const FusedKernels& kernels);

  // h: the previous depth's normed hidden state, next: the embedding of the tokens k ahead (both
  // [s, b, hidden], this rank's chunk with sp). Returns the block's output (before the head norm,
  // which the caller applies) and its MoE loss (undefined for a dense block).
  std::pair<at::Tensor, at::Tensor> forward(const at::Tensor& h, const at::Tensor& next, const SequenceContext& seq,
                                            bool recompute_attention_core, bool lean) const;
  // shared_head.norm: the norm before the shared LM head.
  const RmsNorm& head_norm() const { return head_norm_; }
  const DecoderLayer& block() const { return block_; }
  DecoderLayer& block() { return block_; }

 private:
  RmsNorm enorm_, hnorm_, head_norm_;
  Linear eh_proj_;
  DecoderLayer block_;
};

}  // namespace trainer::model
