"""Trains a model transformers saved with torch.optim.AdamW, the way trainer trains it, and compares
the loss of every step with trainer's metrics file (test_hf.cpp).
usage: hf_train_compare.py HF_DIR TOKENS.safetensors RECIPE.json METRICS.jsonl [--separator=ID]
  TOKENS: the samples of every step in order ([steps x global batch, seq + 1], from hf_logits_tool);
  RECIPE: the resolved recipe (trainer validate --json) the run used: batch sizes, steps, the
  optimizer and its schedule, gradient clipping.
As trainer does: per global batch, the summed token cross-entropy of each micro-batch over the
global batch's target count, backward per micro-batch; the global gradient norm clipped to
training.grad_clip; AdamW (the fused kernel trainer calls) with weight decay on matrices and none
on vectors (norms, biases); the learning rate of lib/optim/lr_schedule.cpp (linear warm-up, then
cosine or linear decay to min_lr over the remaining steps). transformers adds no router loss
(output_router_logits is false): trainer's run must set model.moe.router_aux_loss_coef 0.
With --separator=ID (data.document_masking with data.document_separator_token ID): each sample is
cut into documents after every ID token, and transformers runs each document alone (so its
positions start at 0 and it sees no other document); the target after a separator is left out
and the loss is divided by the global batch's kept targets.
Prints the largest relative difference per step; exits 1 beyond 1e-5."""
import json
import math
import sys

import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

hf_dir, tokens_file, recipe_file, metrics_file = sys.argv[1:5]
separator = None
for arg in sys.argv[5:]:
    assert arg.startswith("--separator="), f"unknown argument {arg}"
    separator = int(arg.split("=", 1)[1])
recipe = json.load(open(recipe_file))
if "recipe" in recipe:
    recipe = recipe["recipe"]
training, opt = recipe["training"], recipe["optimizer"]
steps, batch, micro = training["steps"], training["global_batch_size"], training["micro_batch_size"]
seq = training["seq_len"]
tokens = load_file(tokens_file)["tokens"]
assert tokens.shape[0] >= steps * batch, f"{tokens.shape[0]} samples for {steps} steps of {batch}"


def learning_rate(step):
    warmup, lr, min_lr = opt["warmup_steps"], opt["lr"], opt["min_lr"]
    if step < warmup:
        return lr * (step + 1) / warmup
    if opt["decay"] == "constant":
        return lr
    decay_steps = steps - warmup
    progress = 1.0 if decay_steps <= 1 else min(max((step - warmup) / (decay_steps - 1), 0.0), 1.0)
    if opt["decay"] == "linear":
        return lr + (min_lr - lr) * progress
    return min_lr + (lr - min_lr) * 0.5 * (1.0 + math.cos(math.pi * progress))


torch.manual_seed(0)
model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32, attn_implementation="eager")
model.train()
decay = [p for p in model.parameters() if p.ndim >= 2]
no_decay = [p for p in model.parameters() if p.ndim < 2]
betas = tuple(opt["betas"])
optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": opt["weight_decay"]},
                               {"params": no_decay, "weight_decay": 0.0}],
                              lr=opt["lr"], betas=betas, eps=opt["eps"], fused=True)
ours = [json.loads(line) for line in open(metrics_file) if line.strip()]
ours = [m for m in ours if "loss" in m and "step" in m]
assert len(ours) == steps, f"{len(ours)} logged steps, expected {steps} (logging.interval 1)"
worst = 0.0
for step in range(steps):
    optimizer.zero_grad(set_to_none=True)
    step_tokens = tokens[step * batch:(step + 1) * batch]
    total = 0.0
    if separator is None:
        count = batch * seq
        for first in range(0, batch, micro):
            part = step_tokens[first:first + micro]
            logits = model(input_ids=part[:, :-1]).logits
            loss_sum = torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.size(-1)),
                                                         part[:, 1:].reshape(-1), reduction="sum")
            (loss_sum / count).backward()
            total += loss_sum.item()
    else:
        inputs, targets = step_tokens[:, :-1], step_tokens[:, 1:].clone()
        targets[inputs == separator] = -100  # the target across a document start
        count = int((targets != -100).sum())
        for sample in range(batch):
            row = inputs[sample].tolist()
            starts = [0] + [i for i in range(1, seq) if row[i - 1] == separator] + [seq]
            logits = torch.cat([model(input_ids=inputs[sample:sample + 1, a:b]).logits[0]
                                for a, b in zip(starts, starts[1:])])
            loss_sum = torch.nn.functional.cross_entropy(logits.float(), targets[sample], reduction="sum",
                                                         ignore_index=-100)
            (loss_sum / count).backward()
            total += loss_sum.item()
    loss = total / count
    if training["grad_clip"] > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), training["grad_clip"])
    for group in optimizer.param_groups:
        group["lr"] = learning_rate(step)
    optimizer.step()
    difference = abs(loss - ours[step]["loss"]) / abs(loss)
    worst = max(worst, difference)
    print(f"step {step + 1}: loss transformers+AdamW {loss:.8f} trainer {ours[step]['loss']:.8f} "
          f"relative difference {difference:.2e}")
print(f"largest relative loss difference over {steps} steps: {worst:.2e}")
sys.exit(0 if worst <= 1e-5 else 1)
