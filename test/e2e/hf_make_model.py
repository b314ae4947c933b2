"""Creates a small model with transformers itself: its own random weights and its own config.json,
for the test that trainer reads what transformers writes (test_hf.cpp).
usage: hf_make_model.py OUT_DIR VARIANT
  VARIANT theta:   Llama, rope_theta 50000, tied embeddings
          llama3:  Llama, rope_theta 500000 with llama3 scaling (factor 8, original context 32)
          mistral: Mistral, rope_theta 1e6, sliding window 7 (shorter than the test's 48 tokens)
          mixtral: Mixtral, 4 experts, top-2
          qwen2:   Qwen2, q/k/v biases (drawn at random: transformers initialises them to zero),
                   rope_theta 1e6, tied embeddings, sliding window 5 in layer 1 only
                   (use_sliding_window with max_window_layers 1)
          qwen3:   Qwen3, per-head q/k norms (weights drawn at random around 1), head_dim 16 (not
                   hidden / heads = 12), untied, sliding window off, YaRN (factor 4 over an original
                   context of 32)
          qwen3_moe: Qwen3-MoE, q/k norms, head_dim 16, 5 experts of width 40, top-3 without
                   renormalisation (norm_topk_prob false), layer 0 dense (mlp_only_layers)
          deepseek_v3: DeepSeek-V3, latent attention (q_lora_rank 28, kv_lora_rank 20, qk 14 + 8 rotary
                   interleaved, v 10), YaRN (factor 4, mscale 1, mscale_all_dim 0.7: the softmax scale
                   and the attention factor both differ from 1), layer 0 dense, layer 1 MoE: 8 experts
                   in 4 groups, top-3 of the best 2 groups, sigmoid scores, one shared expert, routed
                   scaling 2.5, routing biases drawn at random (transformers initialises them to zero)
          deepseek_v3_dense: DeepSeek-V3 without a query latent (q_lora_rank null), rotary halves
                   (rope_interleave false), plain RoPE, both layers dense (first_k_dense_replace 2)
  Every variant but DeepSeek's has 6 query heads over 2 key/value heads (a GQA group of 3) and head_dim 12 (qwen3: 16).
Writes OUT_DIR/new (as transformers 5 saves it: rope_parameters) and OUT_DIR/old (the same weights,
the config rewritten in transformers 4's layout: top-level rope_theta and rope_scaling)."""
import json
import os
import sys

import torch
import transformers

out_dir, variant = sys.argv[1], sys.argv[2]
torch.manual_seed(1)
common = dict(vocab_size=256, hidden_size=72, intermediate_size=100, num_hidden_layers=2, num_attention_heads=6,
              num_key_value_heads=2, head_dim=12, max_position_embeddings=256, rms_norm_eps=1e-5,
              initializer_range=0.1, tie_word_embeddings=False)
if variant == "theta":
    common["tie_word_embeddings"] = True
    config = transformers.LlamaConfig(**common, rope_theta=50000.0)
elif variant == "llama3":
    config = transformers.LlamaConfig(**common, rope_theta=500000.0, rope_scaling={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 32})
elif variant == "mistral":
    config = transformers.MistralConfig(**common, rope_theta=1e6, sliding_window=7)
elif variant == "qwen2":
    common["tie_word_embeddings"] = True
    config = transformers.Qwen2Config(**common, rope_theta=1e6, use_sliding_window=True, sliding_window=5,
                                      max_window_layers=1)
    assert config.layer_types == ["full_attention", "sliding_attention"], config.layer_types
elif variant == "qwen3":
    common["head_dim"] = 16
    # YaRN as Qwen3 configures it for long contexts, over an original context shorter than the test's.
    config = transformers.Qwen3Config(**common, use_sliding_window=False, max_window_layers=1, rope_parameters={
        "rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0, "original_max_position_embeddings": 32})
elif variant == "qwen3_moe":
    common["head_dim"] = 16
    config = transformers.Qwen3MoeConfig(**common, rope_theta=1e6, num_experts=5, num_experts_per_tok=3,
                                         moe_intermediate_size=40, norm_topk_prob=False, mlp_only_layers=[0],
                                         decoder_sparse_step=1)
elif variant in ("deepseek_v3", "deepseek_v3_dense"):
    common["num_key_value_heads"] = 6  # latent attention: every head its own key and value
    del common["head_dim"]
    dense = variant == "deepseek_v3_dense"
    rope = {"rope_type": "default", "rope_theta": 10000.0} if dense else {
        "rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 32,
        "mscale": 1.0, "mscale_all_dim": 0.7, "beta_fast": 32.0, "beta_slow": 1.0}
    config = transformers.DeepseekV3Config(**common, q_lora_rank=None if dense else 28, kv_lora_rank=20,
                                           qk_nope_head_dim=14, qk_rope_head_dim=8, v_head_dim=10,
                                           rope_interleave=not dense, n_routed_experts=8, n_shared_experts=1,
                                           moe_intermediate_size=40, num_experts_per_tok=3, n_group=4, topk_group=2,
                                           norm_topk_prob=True, routed_scaling_factor=2.5,
                                           first_k_dense_replace=2 if dense else 1, rope_parameters=rope)
elif variant == "mixtral":
    config = transformers.MixtralConfig(**common, rope_theta=20000.0, num_local_experts=4, num_experts_per_tok=2)
else:
    sys.exit(f"unknown variant {variant}")
model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
with torch.no_grad():
    for name, buffer in model.named_buffers():
        if name.endswith("e_score_correction_bias"):
            buffer.normal_(0.0, 0.1)
    for name, parameter in model.named_parameters():
        if name.endswith(".bias"):
            parameter.normal_(0.0, 0.5)
        elif name.endswith(("q_norm.weight", "k_norm.weight")):
            parameter.normal_(1.0, 0.3)
new_dir, old_dir = os.path.join(out_dir, "new"), os.path.join(out_dir, "old")
model.save_pretrained(new_dir)

with open(os.path.join(new_dir, "config.json")) as f:
    saved = json.load(f)
assert "rope_parameters" in saved and "rope_theta" not in saved, f"not the transformers 5 layout: {saved}"
old = dict(saved)
rope = dict(old.pop("rope_parameters"))
old["rope_theta"] = rope.pop("rope_theta")
old["rope_scaling"] = None if rope["rope_type"] == "default" else rope
os.makedirs(old_dir, exist_ok=True)
with open(os.path.join(old_dir, "config.json"), "w") as f:
    json.dump(old, f, indent=2)
for name in os.listdir(new_dir):
    if name != "config.json":
        os.symlink(os.path.join(os.path.abspath(new_dir), name), os.path.join(old_dir, name))
print(f"{variant}: transformers {transformers.__version__} wrote rope_parameters {saved['rope_parameters']}")
