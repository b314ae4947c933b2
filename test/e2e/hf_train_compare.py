"""Trains a model transformers saved with torch.optim.AdamW (or the recipe's other optimizer, written
out below from its definition), the way trainer trains it, and compares the loss of every step with
trainer's metrics file (test_hf.cpp).
usage: hf_train_compare.py HF_DIR TOKENS.safetensors RECIPE.json METRICS.jsonl [--separator=ID]
  TOKENS: the samples of every step in order ([steps x global batch, seq + 1], from hf_logits_tool);
  RECIPE: the resolved recipe (trainer validate --json) the run used: batch sizes, steps, the
  optimizer and its schedule, gradient clipping.
As trainer does: per global batch, the summed token cross-entropy of each micro-batch over the
global batch's target count, backward per micro-batch; the global gradient norm clipped to
training.grad_clip; AdamW (the fused kernel trainer calls) with weight decay on matrices and none
on vectors (norms, biases), or per optimizer.name and optimizer.state_dtype: AdamW with moments
rounded to bf16 after every step, Lion, 8-bit AdamW (block-wise dynamic quantisation of both
moments, blocks of 256 columns of each row), or Muon (the layers' matrices by name: every 2-D
parameter but the embedding, the LM head and routers; AdamW for the rest); the learning rate of lib/optim/lr_schedule.cpp (linear warm-up, then
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


class Lion(torch.optim.Optimizer):
    """Chen et al. 2023: update sign(b1 m + (1 - b1) g), then m = b2 m + (1 - b2) g."""

    def __init__(self, groups, lr, betas):
        super().__init__(groups, {"lr": lr, "betas": betas, "weight_decay": 0.0})

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            b1, b2 = group["betas"]
            for p in group["params"]:
                m = self.state[p].setdefault("m", torch.zeros_like(p))
                direction = (m * b1 + p.grad * (1 - b1)).sign()
                p.mul_(1 - group["lr"] * group["weight_decay"])
                p.sub_(direction * group["lr"])
                m.copy_(m * b2 + p.grad * (1 - b2))


def dynamic_code(signed):
    """Dettmers et al.'s dynamic code: decades 1e-6..1, each a linear grid of 2^d (signed, both signs)
    or 2^(d+1) fractions between 0.1 and 1 (their midpoints), plus 0 and 1."""
    values = [0.0, 1.0]
    for d in range(7):
        n = 2 ** d if signed else 2 ** (d + 1)
        grid = torch.linspace(0.1, 1, n + 1, dtype=torch.float64)
        for v in (10.0 ** (d - 6) * (grid[:-1] + grid[1:]) / 2).tolist():
            values += [v, -v] if signed else [v]
    values = torch.tensor(sorted(values), dtype=torch.float64)
    assert values.numel() == 256
    return values.float(), ((values[:-1] + values[1:]) / 2).float()


class AdamW8bit(torch.optim.Optimizer):
    """AdamW whose moments are stored as 8-bit codes times an fp32 absolute maximum per block of
    256 columns of each row; matrices under min_size elements and vectors keep fp32 moments."""

    def __init__(self, groups, lr, betas, eps, min_size):
        super().__init__(groups, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": 0.0})
        self.min_size, self.codes = min_size, (dynamic_code(True), dynamic_code(False))

    def blocks(self, x):  # [rows, chunks, 256], zero padded, and the row length
        rows = x.reshape(-1, x.shape[-1])
        length = rows.shape[1]
        chunks = (length + 255) // 256
        return torch.nn.functional.pad(rows, (0, chunks * 256 - length)).reshape(rows.shape[0], chunks, 256), length

    def store(self, x, signed):
        values, midpoints = self.codes[0 if signed else 1]
        b, _ = self.blocks(x)
        absmax = b.abs().amax(dim=2, keepdim=True)
        normalized = b / torch.where(absmax > 0, absmax, torch.ones_like(absmax))
        return torch.bucketize(normalized, midpoints, right=True), absmax

    def load(self, stored, like, signed):
        index, absmax = stored
        values = self.codes[0 if signed else 1][0]
        b = values[index] * absmax
        length = like.shape[-1]
        return b.reshape(b.shape[0], -1)[:, :length].reshape(like.shape)

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            b1, b2 = group["betas"]
            for p in group["params"]:
                st = self.state[p]
                quantized = p.ndim >= 2 and p.numel() >= self.min_size
                st["step"] = st.get("step", 0) + 1
                if quantized:
                    m_old = self.load(st["m"], p, True) if "m" in st else torch.zeros_like(p)
                    v_old = self.load(st["v"], p, False) if "v" in st else torch.zeros_like(p)
                else:
                    m_old, v_old = st.get("m", torch.zeros_like(p)), st.get("v", torch.zeros_like(p))
                g = p.grad
                m = m_old * b1 + g * (1 - b1)
                v = v_old * b2 + (g * g) * (1 - b2)
                p.mul_(1 - group["lr"] * group["weight_decay"])
                denominator = v.sqrt() / math.sqrt(1 - b2 ** st["step"]) + group["eps"]
                p.sub_((m / denominator) * (group["lr"] / (1 - b1 ** st["step"])))
                st["m"], st["v"] = (self.store(m, True), self.store(v, False)) if quantized else (m, v)


class AdamWBf16Moments(torch.optim.Optimizer):
    """torch's fused AdamW on fp32 copies of bf16 moments, rounded back to bf16 after every step."""

    def __init__(self, groups, lr, betas, eps):
        super().__init__(groups, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": 0.0})

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            b1, b2 = group["betas"]
            for p in group["params"]:
                st = self.state[p]
                if not st:
                    st.update(m=torch.zeros_like(p, dtype=torch.bfloat16), v=torch.zeros_like(p, dtype=torch.bfloat16),
                              step=torch.zeros((), dtype=torch.float32))
                m, v = st["m"].float(), st["v"].float()
                st["step"] += 1
                torch._fused_adamw_([p], [p.grad], [m], [v], [], [st["step"]], lr=group["lr"], beta1=b1, beta2=b2,
                                    weight_decay=group["weight_decay"], eps=group["eps"], amsgrad=False,
                                    maximize=False)
                st["m"].copy_(m)
                st["v"].copy_(v)


class Muon(torch.optim.Optimizer):
    """Keller Jordan's Muon with Moonlight's scale on the groups marked "muon": m = mu m + (1 - mu) g,
    the input (1 - mu) g + mu m (Nesterov) or m, orthogonalised by Newton-Schulz in fp32, then
    w = w (1 - lr wd) - lr scale O; torch's fused AdamW on the other groups."""

    def __init__(self, groups, lr, betas, eps, muon):
        super().__init__(groups, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": 0.0, "muon": False})
        self.settings = muon

    @staticmethod
    def newton_schulz(g, steps):
        tall = g.size(0) > g.size(1)
        x = g.t() if tall else g
        x = x / (torch.linalg.vector_norm(x) + 1e-7)
        for _ in range(steps):
            a = x @ x.t()
            x = x * 3.4445 + (a * -4.7750 + (a @ a) * 2.0315) @ x
        return (x.t() if tall else x).contiguous()

    @torch.no_grad()
    def step(self):
        mu, nesterov = self.settings["momentum"], self.settings["nesterov"]
        for group in self.param_groups:
            lr, wd = group["lr"], group["weight_decay"]
            for p in group["params"]:
                st = self.state[p]
                if group["muon"]:
                    if not st:
                        st["m"] = torch.zeros_like(p)
                    g = p.grad
                    st["m"] = st["m"].mul(mu).add(g.mul(1 - mu))
                    x = g.mul(1 - mu).add(st["m"].mul(mu)) if nesterov else st["m"]
                    rows, cols = p.shape
                    scale = (math.sqrt(max(1.0, rows / cols)) if self.settings["scale"] == "spectral"
                             else 0.2 * math.sqrt(max(rows, cols)))
                    p.mul_(1 - lr * wd)
                    p.sub_(self.newton_schulz(x, self.settings["ns_steps"]) * (lr * scale))
                    continue
                if not st:
                    st.update(m=torch.zeros_like(p), v=torch.zeros_like(p), step=torch.zeros((), dtype=torch.float32))
                st["step"] += 1
                b1, b2 = group["betas"]
                torch._fused_adamw_([p], [p.grad], [st["m"]], [st["v"]], [], [st["step"]], lr=lr, beta1=b1, beta2=b2,
                                    weight_decay=wd, eps=group["eps"], amsgrad=False, maximize=False)


groups = [{"params": decay, "weight_decay": opt["weight_decay"]}, {"params": no_decay, "weight_decay": 0.0}]
name = opt.get("name", "adamw")
if name == "muon":
    def layer_matrix(n, p):
        return p.ndim == 2 and n not in ("model.embed_tokens.weight", "lm_head.weight") and not n.endswith(".mlp.gate.weight")
    named = list(model.named_parameters())
    groups = [{"params": [p for n, p in named if layer_matrix(n, p)], "weight_decay": opt["weight_decay"], "muon": True},
              {"params": [p for n, p in named if p.ndim >= 2 and not layer_matrix(n, p)],
               "weight_decay": opt["weight_decay"]},
              {"params": no_decay, "weight_decay": 0.0}]
if name == "muon":
    optimizer = Muon(groups, lr=opt["lr"], betas=betas, eps=opt["eps"], muon=opt["muon"])
elif name == "lion":
    optimizer = Lion(groups, lr=opt["lr"], betas=betas)
elif name == "adamw8bit":
    optimizer = AdamW8bit(groups, lr=opt["lr"], betas=betas, eps=opt["eps"], min_size=opt["min_8bit_size"])
elif opt.get("state_dtype", "fp32") == "bf16":
    optimizer = AdamWBf16Moments(groups, lr=opt["lr"], betas=betas, eps=opt["eps"])
else:
    assert name == "adamw", f"no reference for optimizer.name {name}"
    optimizer = torch.optim.AdamW(groups, lr=opt["lr"], betas=betas, eps=opt["eps"], fused=True)
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
    print(f"step {step + 1}: loss transformers+{type(optimizer).__name__} {loss:.8f} trainer {ours[step]['loss']:.8f} "
          f"relative difference {difference:.2e}")
print(f"largest relative loss difference over {steps} steps: {worst:.2e}")
sys.exit(0 if worst <= 1e-5 else 1)
