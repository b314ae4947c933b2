#!/usr/bin/env python3
"""The MoE layer's expert GEMMs two ways, side by side in one run: at::_grouped_mm (what
lib/model/grouped_experts.cpp runs on CUDA in bf16) against a loop of one matmul per expert (its
fallback), on the same uneven token split (one expert empty). Checks that both give the same
result, then times the SwiGLU forward (gate, up, down) of each with CUDA events (median of
--repeat after warm-up) and prints TFLOP/s and the ratio. On the CPU it runs in fp32 (a check of
the script; times there mean nothing).

    scripts/bench_grouped_mm.py                       # Mixtral 8x7B's expert shape, 8 local experts
    scripts/bench_grouped_mm.py --experts 4 --hidden 2048 --width 1408 --tokens 8192
"""
import argparse
import statistics

import torch


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--experts", type=int, default=8)
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--width", type=int, default=14336)
    p.add_argument("--tokens", type=int, default=16384, help="token copies routed to these experts (top-k included)")
    p.add_argument("--repeat", type=int, default=20)
    a = p.parse_args()
    cuda = torch.cuda.is_available()
    device, dtype = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float32)
    g = torch.Generator().manual_seed(1)
    # Uneven split, expert 1 empty (_grouped_mm needs 16-byte aligned strides, not group sizes).
    weights = torch.rand(a.experts, generator=g)
    weights[1] = 0
    counts = (weights / weights.sum() * a.tokens).long()
    counts[0] += a.tokens - counts.sum()
    offsets = torch.cumsum(counts, 0).to(torch.int32).to(device)
    x = torch.randn(a.tokens, a.hidden, device=device, dtype=dtype)
    w1 = torch.randn(a.experts, a.width, a.hidden, device=device, dtype=dtype) * a.hidden ** -0.5
    w3 = torch.randn(a.experts, a.width, a.hidden, device=device, dtype=dtype) * a.hidden ** -0.5
    w2 = torch.randn(a.experts, a.hidden, a.width, device=device, dtype=dtype) * a.width ** -0.5

    def grouped():
        h = torch.nn.functional.silu(torch._grouped_mm(x, w1.transpose(1, 2), offsets)) * torch._grouped_mm(
            x, w3.transpose(1, 2), offsets)
        return torch._grouped_mm(h, w2.transpose(1, 2), offsets)

    def loop():
        outs, start = [], 0
        for e, n in enumerate(counts.tolist()):
            xe = x[start:start + n]
            outs.append((torch.nn.functional.silu(xe @ w1[e].t()) * (xe @ w3[e].t())) @ w2[e].t())
            start += n
        return torch.cat(outs)

    a_out, b_out = grouped().float(), loop().float()
    error = ((a_out - b_out).abs().max() / b_out.abs().max()).item()
    flops = 6 * a.tokens * a.hidden * a.width

    def time_it(f):
        for _ in range(3):
            f()
        if not cuda:
            import time
            times = []
            for _ in range(a.repeat):
                t0 = time.perf_counter(); f(); times.append(time.perf_counter() - t0)
            return statistics.median(times)
        times = []
        for _ in range(a.repeat):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record(); f(); end.record(); torch.cuda.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        return statistics.median(times)

    t_grouped, t_loop = time_it(grouped), time_it(loop)
    print(f"{a.experts} experts, {a.tokens} rows split {counts.tolist()}, hidden {a.hidden}, width {a.width}, "
          f"{dtype}, {device}: max relative difference {error:.2e}")
    print(f"{'path':<16s} {'ms':>9s} {'TFLOP/s':>9s}")
    for name, t in (("_grouped_mm", t_grouped), ("loop", t_loop)):
        print(f"{name:<16s} {t * 1e3:9.3f} {flops / t / 1e12:9.1f}")
    print(f"loop / grouped: {t_loop / t_grouped:.2f}")


if __name__ == "__main__":
    main()
