"""Compares trainer's logits and loss with Hugging Face transformers on the same weights and tokens.
usage: hf_compare.py HF_DIR TRAINER_OUTPUT.safetensors
Prints the largest absolute logits difference and both losses; exits 1 beyond the tolerances."""
import sys

import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

hf_dir, trainer_file = sys.argv[1], sys.argv[2]
ours = load_file(trainer_file)
model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32, attn_implementation="eager")
model.eval()
tokens = ours["tokens"]
with torch.no_grad():
    out = model(input_ids=tokens[:, :-1], labels=tokens[:, :-1].clone())
    logits = out.logits
    # transformers shifts labels inside; compute the loss on our (input, next token) pairs instead.
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), tokens[:, 1:].reshape(-1))
diff = (logits - ours["logits"]).abs().max().item()
scale = ours["logits"].abs().max().item()
print(f"architecture {model.config.architectures[0]}: max |logits difference| {diff:.3e} (logits up to {scale:.2f}); "
      f"loss transformers {loss.item():.8f} trainer {ours['loss'].item():.8f}")
ok = diff <= 1e-4 and abs(loss.item() - ours["loss"].item()) <= 1e-5
sys.exit(0 if ok else 1)
