#include "estimate/model_counts.h"

#include <algorithm>

#include <fmt/format.h>

#include <stdexcept>

namespace trainer::estimate {

namespace {

void require_positive(int64_t value, const char* name) {
  if (value <= 0) throw std::invalid_argument(fmt::format("count_model: {}={} must be positive", name, value));
}

// A SwiGLU MLP of width `width`: gate/up [width,H] and down [H,width].
int64_t swiglu_params(int64_t hidden, int64_t width) { return 3 * hidden * width; }

}  // namespace

ModelCounts count_model(const recipe::ModelConfig& model, int64_t seq_len) {
  const int64_t V = model.vocab_size, H = model.hidden_size, L = model.num_hidden_layers;
  const int64_t heads = model.num_attention_heads;
  require_positive(V, "vocab_size");
  require_positive(H, "hidden_size");
  require_positive(L, "num_hidden_layers");
  require_positive(heads, "num_attention_heads");
  require_positive(seq_len, "seq_len");
  // Same derivations as the recipe loader, so a hand-built config counts like a loaded one.
  const int64_t kv = model.num_key_value_heads > 0 ? model.num_key_value_heads : heads;
  const int64_t head_dim = model.head_dim > 0 ? model.head_dim : H / heads;
  require_positive(head_dim, "head_dim");

  ModelCounts c;
  c.seq_len = seq_len;
  c.embedding_params = V * H;
  c.lm_head_params = model.tie_word_embeddings ? 0 : V * H;
  c.attention_params_per_layer = H * heads * head_dim      // q_proj
                                 + 2 * H * kv * head_dim   // k_proj, v_proj
                                 + heads * head_dim * H;   // o_proj
  if (model.attention_bias) c.attention_params_per_layer += (heads + 2 * kv) * head_dim;  // q, k, v biases
  c.norm_params_per_layer = 2 * H + (model.qk_norm ? 2 * head_dim : 0);  // (and q_norm, k_norm)
  if (model.mla) {
    const auto& a = *model.mla;
    const int64_t qk = a.qk_head_dim(), q_lora = a.q_lora_rank.value_or(0);
    c.attention_replicated_params_per_layer = H * q_lora + H * (a.kv_lora_rank + a.qk_rope_head_dim);
    c.attention_params_per_layer = c.attention_replicated_params_per_layer +
                                   (q_lora > 0 ? q_lora : H) * heads * qk                   // q_b_proj or q_proj
                                   + a.kv_lora_rank * heads * (a.qk_nope_head_dim + a.v_head_dim)  // kv_b_proj
                                   + heads * a.v_head_dim * H;                              // o_proj
    c.norm_params_per_layer = 2 * H + q_lora + a.kv_lora_rank;  // and q_a_layernorm, kv_a_layernorm
  }
  c.final_norm_params = H;
  c.dense_mlp_params_per_layer = model.intermediate_size > 0 ? swiglu_params(H, model.intermediate_size) : 0;

  if (model.moe) {
    const auto& moe = *model.moe;
    const int64_t E = moe.num_local_experts, top_k = moe.num_experts_per_tok;
    require_positive(E, "moe.num_local_experts");
    require_positive(top_k, "moe.num_experts_per_tok");
    if (top_k > E)
      throw std::invalid_argument(
          fmt::format("count_model: moe.num_experts_per_tok={} exceeds moe.num_local_experts={}", top_k, E));
    const int64_t width = moe.moe_intermediate_size > 0 ? moe.moe_intermediate_size : model.intermediate_size;
    require_positive(width, "moe.moe_intermediate_size");
    c.expert_params = swiglu_params(H, width);
    c.router_params_per_layer = E * H;
    c.shared_expert_params_per_layer = moe.num_shared_experts * c.expert_params;
    c.moe_params_per_layer = c.router_params_per_layer + E * c.expert_params + c.shared_expert_params_per_layer;
    // Every token is scored by the whole router, then runs its top-k experts and the shared ones.
    c.moe_active_params_per_layer =
        c.router_params_per_layer + top_k * c.expert_params + c.shared_expert_params_per_layer;
  }

  int64_t layer_params = 0, layer_active = 0;
  c.layers.reserve(static_cast<size_t>(L));
  std::vector<char> is_moe(static_cast<size_t>(L), 0);  // model.is_moe_layer, without a search per layer
  if (model.moe)
    for (int64_t l : model.moe->layers)
      if (l >= 0 && l < L) is_moe[static_cast<size_t>(l)] = 1;
  for (int64_t l = 0; l < L; ++l) {
    LayerCounts layer;
    layer.index = l;
    layer.moe = is_moe[static_cast<size_t>(l)] != 0;
    if (model.sliding_window && *model.sliding_window < seq_len) layer.window = model.window_of(l);
    const int64_t common = c.attention_params_per_layer + c.norm_params_per_layer;
    if (layer.moe) {
      layer.params = common + c.moe_params_per_layer;
      layer.active_params = common + c.moe_active_params_per_layer;
      ++c.num_moe_layers;
    } else {
      require_positive(model.intermediate_size, "intermediate_size");
      layer.params = layer.active_params = common + c.dense_mlp_params_per_layer;
      ++c.num_dense_layers;
    }
    layer_params += layer.params;
    layer_active += layer.active_params;
    c.layers.push_back(layer);
  }

  if (model.num_nextn_predict_layers > 0) {
    c.mtp_modules = model.num_nextn_predict_layers;
    c.mtp_moe = model.is_moe_layer(L);
    const int64_t own = 2 * H * H + 3 * H;  // eh_proj, enorm, hnorm, shared_head.norm
    const int64_t common = c.attention_params_per_layer + c.norm_params_per_layer;
    c.mtp_module_params = own + common + (c.mtp_moe ? c.moe_params_per_layer : c.dense_mlp_params_per_layer);
    c.mtp_module_active_params =
        own + common + (c.mtp_moe ? c.moe_active_params_per_layer : c.dense_mlp_params_per_layer);
    layer_params += c.mtp_modules * c.mtp_module_params;
    layer_active += c.mtp_modules * c.mtp_module_active_params;
  }
  const int64_t outer = c.embedding_params + c.lm_head_params + c.final_norm_params;
  c.total_params = outer + layer_params;
  c.active_params = outer + layer_active;

  // PaLM (Chowdhery et al. 2022, appendix B), as torchtitan computes it: each parameter in a matrix
  // product costs 2 FLOPs per token forward and 4 backward; attention's QK^T and AV add
  // 2 * 2 * heads * head_dim * seq_len forward per layer, times 3 for training. Norms and the router
  // are inside the 6N term too (negligible, and torchtitan counts them the same way).
  // (Each multi-token prediction module runs the shared LM head once more.)
  c.matmul_params_per_token = c.active_params - c.embedding_params + (model.tie_word_embeddings ? V * H : 0) +
                              c.mtp_modules * V * H;
  c.dense_flops_per_token = 6.0 * static_cast<double>(c.matmul_params_per_token);
  c.attention_flops_per_token = 12.0 * static_cast<double>(L) * static_cast<double>(heads) *
                                static_cast<double>(head_dim) * static_cast<double>(seq_len);
  // A module's attention is one more layer's of the last layer's kind, over the whole sequence.
  const int64_t last_window = c.layers.empty() ? 0 : c.layers.back().window;
  if (std::any_of(c.layers.begin(), c.layers.end(), [](const LayerCounts& l) { return l.window > 0; })) {
    // A window W attends W(W+1)/2 + (T-W)W (query, key) pairs where causal attention attends
    // T(T+1)/2: the layer's length scaled by that ratio.
    const double T = static_cast<double>(seq_len);
    auto layer_length = [T](int64_t window) {
      const double W = static_cast<double>(window);
      return window > 0 ? T * (W * (W + 1) / 2 + (T - W) * W) / (T * (T + 1) / 2) : T;
    };
    double length = 0;
    for (const auto& layer : c.layers) length += layer_length(layer.window);
    length += static_cast<double>(c.mtp_modules) * layer_length(last_window);
    c.attention_flops_per_token =
        12.0 * static_cast<double>(heads) * static_cast<double>(head_dim) * length;
  } else if (c.mtp_modules > 0) {
    c.attention_flops_per_token *= double(L + c.mtp_modules) / double(L);
  }
  if (model.mla)  // QK^T over qk_nope + qk_rope, AV over v_head_dim (not the padding the kernels see)
    c.attention_flops_per_token = 6.0 * static_cast<double>(L + c.mtp_modules) * static_cast<double>(heads) *
                                  static_cast<double>(model.mla->qk_head_dim() + model.mla->v_head_dim) *
                                  static_cast<double>(seq_len);
  c.flops_per_token = c.dense_flops_per_token + c.attention_flops_per_token;
  return c;
}

}  // namespace trainer::estimate
