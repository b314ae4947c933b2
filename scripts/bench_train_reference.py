#!/usr/bin/env python3
"""The eager PyTorch side of scripts/bench_train: the trainer's Llama training step, written the
way a plain PyTorch user would write it, timed step by step.

It mirrors lib/model/*.cpp, lib/optim/*.cpp and lib/train/trainer.cpp (one process; CPU by default,
`--device cuda` for scripts/bench_gpu):
  - embedding -> L x [RMSNorm -> GQA attention (q/k/v/o, no bias, HF rotate_half RoPE,
    F.scaled_dot_product_attention(is_causal=True, enable_gqa=True)) -> residual ->
    RMSNorm -> SwiGLU MLP -> residual] -> RMSNorm -> LM head (tied to the embedding with --tie);
  - `--dtype bf16`: fp32 parameters, gradients and AdamW states, forward and backward under
    torch.autocast(bfloat16), the plain PyTorch user's mixed precision (the trainer keeps bf16
    compute weights beside fp32 masters: the same arithmetic, different bookkeeping);
  - `--compile`: the model wrapped in torch.compile (default mode), the first steps compile;
  - RMSNorm computed in fp32 and cast back, weight * normed;
  - loss = cross_entropy(logits fp32, reduction="sum") / tokens of the global batch, backward per
    micro-batch (gradient accumulation when global batch > micro batch);
  - global grad norm with clip_grad_norm_(max_norm=grad_clip), AdamW(fused=True) with two groups
    (weight decay on matrices, none on norm weights), the trainer's lr schedule (linear warm-up,
    cosine decay to min_lr), zero_grad after the step;
  - loss and grad norm are read back to Python every step (.item()), as the trainer does.

The tokens are uniform random ids of the trainer's batch shape, generated before the timed loop.
What is timed per step: from the lr computation to the end of optimizer.zero_grad(), the same span
as the trainer's time_s (which also includes building its synthetic micro-batches, a few microseconds).

Prints one JSON object on stdout's last line: {"step_times": [...], "losses": [...], ...}; on CUDA
also "peak_allocated_bytes" (torch.cuda.max_memory_allocated over the whole run).
"""
import argparse
import json
import math
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class RMSNorm(nn.Module):
    def __init__(self, hidden, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden))
        self.eps = eps

    def forward(self, x):
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * normed.to(x.dtype)


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary(x, cos, sin):
    return x * cos + rotate_half(x) * sin


class Attention(nn.Module):
    def __init__(self, hidden, heads, kv_heads, head_dim):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.q_proj = nn.Linear(hidden, heads * head_dim, bias=False)
        self.k_proj = nn.Linear(hidden, kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(hidden, kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(heads * head_dim, hidden, bias=False)

    def forward(self, x, cos, sin):
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        q = apply_rotary(q, cos, sin)
        k = apply_rotary(k, cos, sin)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.heads != self.kv_heads)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, self.heads * self.head_dim))


class SwigluMlp(nn.Module):
    def __init__(self, hidden, intermediate):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.input_layernorm = RMSNorm(a.hidden, a.rms_norm_eps)
        self.self_attn = Attention(a.hidden, a.heads, a.kv_heads, a.hidden // a.heads)
        self.post_attention_layernorm = RMSNorm(a.hidden, a.rms_norm_eps)
        self.mlp = SwigluMlp(a.hidden, a.intermediate)

    def forward(self, x, cos, sin):
        h = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return h + self.mlp(self.post_attention_layernorm(h))


class Llama(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.embed_tokens = nn.Embedding(a.vocab, a.hidden)
        self.layers = nn.ModuleList(DecoderLayer(a) for _ in range(a.layers))
        self.norm = RMSNorm(a.hidden, a.rms_norm_eps)
        self.lm_head = nn.Linear(a.hidden, a.vocab, bias=False)
        if a.tie:
            self.lm_head.weight = self.embed_tokens.weight
        head_dim = a.hidden // a.heads
        inv = 1.0 / (a.rope_theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
        self.register_buffer("inv_freq", inv.float(), persistent=False)
        for name, p in self.named_parameters():
            if p.dim() >= 2:  # every matrix ~ N(0, 0.02); norm weights stay 1 (as the trainer)
                nn.init.normal_(p, mean=0.0, std=a.initializer_range)

    def forward(self, inputs, targets):
        t = inputs.shape[1]
        positions = torch.arange(t, device=inputs.device)
        freqs = torch.outer(positions.float(), self.inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos(), emb.sin()
        x = self.embed_tokens(inputs)
        for layer in self.layers:
            x = layer(x, cos, sin)
        logits = self.lm_head(self.norm(x))
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1), reduction="sum")


def learning_rate(a, step):
    """lib/optim/lr_schedule.cpp: linear warm-up to lr, then cosine to min_lr at the last step."""
    if step < a.warmup_steps:
        return a.lr * (step + 1) / a.warmup_steps
    decay_steps = a.steps - a.warmup_steps
    progress = 1.0 if decay_steps <= 1 else min(max((step - a.warmup_steps) / (decay_steps - 1), 0.0), 1.0)
    return a.min_lr + (a.lr - a.min_lr) * 0.5 * (1.0 + math.cos(math.pi * progress))


def recipe_defaults(path):
    """The model, batch and optimizer of a recipe as `trainer validate --json` resolves it (its
    "recipe" object, or the object itself), as this script's option defaults."""
    r = json.load(open(path))
    r = r.get("recipe", r)
    m, t, o = r["model"], r["training"], r["optimizer"]
    return dict(vocab=m["vocab_size"], hidden=m["hidden_size"], intermediate=m["intermediate_size"],
                layers=m["num_hidden_layers"], heads=m["num_attention_heads"], kv_heads=m["num_key_value_heads"],
                rope_theta=m["rope_theta"], rms_norm_eps=m["rms_norm_eps"], seq_len=t["seq_len"],
                micro_batch=t["micro_batch_size"], global_batch=t["global_batch_size"], steps=t["steps"], lr=o["lr"],
                min_lr=o["min_lr"], warmup_steps=o["warmup_steps"], weight_decay=o["weight_decay"],
                grad_clip=t["grad_clip"], dtype=t["dtype"], tie=bool(m["tie_word_embeddings"]))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--recipe", help="take the defaults below from `trainer validate --world-size 1 --json` output")
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--intermediate", type=int, default=704)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--rope-theta", type=float, default=10000.0)
    p.add_argument("--rms-norm-eps", type=float, default=1e-5)
    p.add_argument("--initializer-range", type=float, default=0.02)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--global-batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--min-lr", type=float, default=3e-4)
    p.add_argument("--warmup-steps", type=int, default=5)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--betas", type=float, nargs=2, default=(0.9, 0.95))
    p.add_argument("--eps", type=float, default=1e-8)
    p.add_argument("--grad-clip", type=float, default=1.0)
    p.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: leave as is)")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    p.add_argument("--tie", action="store_true", help="tie the LM head to the embedding")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--profile-steps", type=int, nargs=2, metavar=("FIRST", "LAST"),
                   help="record steps FIRST..LAST (1-based) with torch.profiler into --profile-out")
    p.add_argument("--profile-out", default="reference-trace.json")
    known, _ = p.parse_known_args()
    if known.recipe:
        p.set_defaults(**recipe_defaults(known.recipe))  # options given on the command line still win
    a = p.parse_args()
    if a.global_batch % a.micro_batch:
        p.error("--global-batch must be a multiple of --micro-batch")
    if a.hidden % a.heads or a.heads % a.kv_heads:
        p.error("--hidden must divide into --heads, and --heads into --kv-heads groups")

    if a.threads > 0:
        torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    device = torch.device(a.device)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False  # as libtorch's default, which the trainer keeps
    model = Llama(a).to(device)
    forward = torch.compile(model) if a.compile else model
    decay = [p_ for p_ in model.parameters() if p_.dim() >= 2]  # parameters(): a tied weight once
    no_decay = [p_ for p_ in model.parameters() if p_.dim() < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": a.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=a.lr, betas=tuple(a.betas), eps=a.eps, fused=True)
    params = decay + no_decay

    accum = a.global_batch // a.micro_batch
    global_tokens = a.global_batch * a.seq_len
    # All batches up front (outside the timed loop): [steps, accum, micro, seq_len + 1].
    data = torch.randint(0, a.vocab, (a.steps, accum, a.micro_batch, a.seq_len + 1), dtype=torch.long).to(device)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=a.dtype == "bf16")
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()

    step_times, losses, grad_norms = [], [], []
    profiler = None
    for step in range(a.steps):
        if a.profile_steps and step + 1 == a.profile_steps[0]:
            activities = [torch.profiler.ProfilerActivity.CPU]
            if device.type == "cuda":
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            profiler = torch.profiler.profile(activities=activities)
            profiler.start()
        t0 = time.perf_counter()
        lr = learning_rate(a, step)
        for group in optimizer.param_groups:
            group["lr"] = lr
        loss_sum = 0.0
        for micro in range(accum):
            tokens = data[step, micro]
            inputs, targets = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
            with autocast:
                micro_loss_sum = forward(inputs, targets)
            (micro_loss_sum / global_tokens).backward()
            loss_sum += micro_loss_sum.item()
        loss = loss_sum / global_tokens
        if not math.isfinite(loss):
            sys.exit(f"step {step + 1}: the loss is {loss}")
        grad_norm = torch.nn.utils.clip_grad_norm_(params, a.grad_clip if a.grad_clip > 0 else float("inf")).item()
        if not math.isfinite(grad_norm):
            sys.exit(f"step {step + 1}: the gradient norm is {grad_norm}")
        optimizer.step()
        optimizer.zero_grad()
        if device.type == "cuda":
            torch.cuda.synchronize()  # the fused AdamW step is asynchronous: count it in its own step
        step_times.append(time.perf_counter() - t0)
        if profiler is not None and step + 1 == a.profile_steps[1]:
            if device.type == "cuda":
                torch.cuda.synchronize()
            profiler.stop()
            profiler.export_chrome_trace(a.profile_out)
            profiler = None
        losses.append(loss)
        grad_norms.append(grad_norm)
        print(f"step {step + 1}/{a.steps} | loss {loss:.4f} | lr {lr:.2e} | gnorm {grad_norm:.3f} | "
              f"{global_tokens / step_times[-1]:.0f} tok/s | {step_times[-1]:.3f} s", file=sys.stderr, flush=True)

    print(json.dumps({
        "step_times": step_times,
        "losses": losses,
        "grad_norms": grad_norms,
        "parameters": sum(p_.numel() for p_ in params),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "peak_allocated_bytes": torch.cuda.max_memory_allocated() if device.type == "cuda" else None,
    }))


if __name__ == "__main__":
    main()
