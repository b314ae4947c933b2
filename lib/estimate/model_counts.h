#pragma once
// Parameter and FLOP counts of a model: the one source of truth (DESIGN.md section 3, invariant 7)
// shared by the runtime's metrics (tokens/s -> TFLOP/s -> MFU) and the memory/time estimator.
// Torch-free: the counts follow from the typed ModelConfig alone, never from built tensors.
//
// Architecture counted (Hugging Face Llama / Mixtral names, no biases):
//   embed_tokens [V,H]
//   per layer: input_layernorm [H], q_proj [heads*head_dim, H], k_proj and v_proj [kv*head_dim, H],
//              o_proj [H, heads*head_dim], post_attention_layernorm [H], then either
//              a dense SwiGLU MLP gate_proj, up_proj [I,H], down_proj [H,I], or (model.moe.layers)
//              a router gate [E,H], E experts w1, w3 [I_moe,H], w2 [H,I_moe] and
//              num_shared_experts always-active SwiGLU experts of width I_moe
//   norm [H], lm_head [V,H] (absent when tie_word_embeddings)
#include <cstdint>
#include <vector>

#include "recipe/recipe.h"

namespace trainer::estimate {

// One decoder layer.
struct LayerCounts {
  int64_t index = 0;
  bool moe = false;
  int64_t window = 0;         // model.sliding_window in this layer when shorter than seq_len, else 0
  int64_t params = 0;         // every parameter of the layer
  int64_t active_params = 0;  // the parameters one token passes through
};

struct ModelCounts {
  // --- parameters ---
  int64_t embedding_params = 0;             // embed_tokens: V*H
  int64_t lm_head_params = 0;               // V*H, or 0 when tied to the embedding
  int64_t attention_params_per_layer = 0;   // q, k, v, o projections (and q, k, v biases); MLA's projections
  // Of those, MLA's down-projections q_a_proj and kv_a_proj_with_mqa: replicated over tp.
  int64_t attention_replicated_params_per_layer = 0;
  int64_t norm_params_per_layer = 0;        // input_layernorm + post_attention_layernorm: 2H (+ q/k or latent norms)
  int64_t dense_mlp_params_per_layer = 0;   // 3*H*I (what a dense layer carries)
  int64_t expert_params = 0;                // one SwiGLU expert: 3*H*I_moe (0 without MoE)
  int64_t router_params_per_layer = 0;      // E*H (0 without MoE)
  int64_t shared_expert_params_per_layer = 0;  // num_shared_experts * expert_params
  int64_t moe_params_per_layer = 0;         // router + all E experts + shared experts (0 without MoE)
  int64_t moe_active_params_per_layer = 0;  // router + top-k experts + shared experts (0 without MoE)
  int64_t final_norm_params = 0;            // H
  int64_t num_dense_layers = 0;
  int64_t num_moe_layers = 0;
  std::vector<LayerCounts> layers;          // one entry per decoder layer, in order
  // Multi-token prediction: modules on the last stage, each a decoder layer (MoE when mtp_moe),
  // eh_proj [H, 2H] and three norms; they share the embedding and the LM head.
  int64_t mtp_modules = 0;
  bool mtp_moe = false;
  int64_t mtp_module_params = 0;
  int64_t mtp_module_active_params = 0;

  int64_t total_params = 0;   // every parameter (a tied LM head counted once)
  int64_t active_params = 0;  // parameters used per token: all but the unchosen experts; includes the embedding

  // --- FLOPs (PaLM appendix B / torchtitan), training = forward + backward, no recomputation ---
  int64_t seq_len = 0;
  // Parameters that take part in a matrix product per token: active_params minus the embedding
  // (a lookup, no FLOPs), plus the LM head's V*H even when it is tied (the product still runs).
  int64_t matmul_params_per_token = 0;
  double dense_flops_per_token = 0;      // 6 * matmul_params_per_token
  // 12 * L * heads * head_dim * seq_len (not halved for causal masking); a windowed layer counts
  // seq_len * (its attended (query, key) pairs / a causal layer's) instead of seq_len.
  double attention_flops_per_token = 0;
  double flops_per_token = 0;            // dense + attention
};

// Counts `model` trained on sequences of `seq_len` tokens. Fields of the model left at 0 that the
// recipe derives take the recipe's defaults (num_key_value_heads = heads, head_dim = H / heads,
// moe_intermediate_size = intermediate_size). Throws std::invalid_argument when a size that must be
// positive is not, or when the MoE section names no experts or more active experts than exist.
ModelCounts count_model(const recipe::ModelConfig& model, int64_t seq_len);

}  // namespace trainer::estimate
