"""Compares trainer's logits and loss with Hugging Face transformers on the same weights and tokens.
usage: hf_compare.py HF_DIR TRAINER_OUTPUT.safetensors...
Prints, per trainer output, the largest absolute logits difference and both losses; exits 1 when
any is beyond the tolerances (1e-4 on logits, 1e-5 on the loss)."""
import sys

import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

hf_dir, trainer_files = sys.argv[1], sys.argv[2:]
model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32, attn_implementation="eager")
model.eval()
ok = True
for trainer_file in trainer_files:
    ours = load_file(trainer_file)
    tokens = ours["tokens"]
    with torch.no_grad():
        logits = model(input_ids=tokens[:, :-1]).logits
        # transformers shifts labels inside; compute the loss on our (input, next token) pairs instead.
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), tokens[:, 1:].reshape(-1))
    diff = (logits - ours["logits"]).abs().max().item()
    scale = ours["logits"].abs().max().item()
    print(f"{trainer_file}: architecture {model.config.architectures[0]}: max |logits difference| {diff:.3e} "
          f"(logits up to {scale:.2f}); loss transformers {loss.item():.8f} trainer {ours['loss'].item():.8f}")
    ok = ok and diff <= 1e-4 and abs(loss.item() - ours["loss"].item()) <= 1e-5
sys.exit(0 if ok else 1)
