#!/usr/bin/env python3
"""Where a GPU step's time goes, from a Chrome/Kineto trace (trainer's profiling.dir traces or
torch.profiler's export_chrome_trace): GPU kernel time by category and the top kernels, the GPU's
busy share of the traced span, and kernel launches per step.

    scripts/trace_summary.py TRACE.json [--steps N] [--top 25]
"""
import argparse
import collections
import json
import re

CATEGORIES = [  # first match wins
    ("attention", r"flash|fmha|cudnn.*(sdpa|attn)|attention|sm90_xmma_fprop|_efficient_attention"),
    ("matmul", r"gemm|sm90_xmma|cutlass|ampere_.*_s16816|nvjet|cublas|xmma"),
    ("nccl", r"nccl"),
    ("optimizer", r"adam|foreach|multi_tensor|_fused_"),
    ("reduction", r"reduce|norm|softmax|sum|max|logsumexp|cross_entropy|nll"),
    ("copy/cast", r"copy|cast|convert|cat|index|gather|scatter|fill|memset|memcpy"),
    ("elementwise", r"elementwise|vectorized|unrolled|pointwise|triton_poi|mul|add|silu|sigmoid"),
    ("triton (fused)", r"triton"),
]


def category(name):
    low = name.lower()
    # ATen's element-wise kernels carry loader and implementation names with "cast" in them
    # (LoadWithCast, gpu_kernel_impl_nocast) whatever they compute: a mixed-dtype add is an add;
    # only the copy functors (dtype conversions, contiguous copies) are copies.
    if "elementwise_kernel" in low:
        return "copy/cast" if "copy" in low else "elementwise"
    for cat, pattern in CATEGORIES:
        if re.search(pattern, low):
            return cat
    return "other"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("trace")
    p.add_argument("--steps", type=int, default=1, help="optimizer steps in the trace (per-step figures)")
    p.add_argument("--top", type=int, default=25)
    a = p.parse_args()
    events = json.load(open(a.trace))
    events = events["traceEvents"] if isinstance(events, dict) else events
    kernels = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    launches = [e for e in events if e.get("ph") == "X" and e.get("cat") == "cuda_runtime"
                and re.search(r"LaunchKernel|cudaGraphLaunch", e.get("name", ""))]
    syncs = [e for e in events if e.get("ph") == "X" and e.get("cat") == "cuda_runtime"
             and re.search(r"Synchronize|cudaMemcpy(?!Async)|StreamWait", e.get("name", ""))]
    if not kernels:
        print("no GPU kernels in the trace")
        return
    start = min(e["ts"] for e in kernels)
    end = max(e["ts"] + e["dur"] for e in kernels)
    busy = sum(e["dur"] for e in kernels)
    by_cat = collections.Counter()
    by_name = collections.Counter()
    count = collections.Counter()
    for e in kernels:
        by_cat[category(e["name"])] += e["dur"]
        short = e["name"][:90]
        by_name[short] += e["dur"]
        count[short] += 1
    s = a.steps
    print(f"traced span {(end - start) / 1e3 / s:.1f} ms per step, GPU kernels {busy / 1e3 / s:.1f} ms per step "
          f"({busy / (end - start):.1%} busy), {len(kernels) / s:.0f} kernels and {len(launches) / s:.0f} launches per step, "
          f"{len(syncs) / s:.0f} host-blocking calls per step")
    print(f"{'category':<16s} {'ms/step':>9s} {'share':>7s}")
    for cat, dur in by_cat.most_common():
        print(f"{cat:<16s} {dur / 1e3 / s:9.2f} {dur / busy:7.1%}")
    print(f"{'kernel':<90s} {'ms/step':>8s} {'calls':>6s}")
    for name, dur in by_name.most_common(a.top):
        print(f"{name:<90s} {dur / 1e3 / s:8.2f} {count[name] // s:6d}")


if __name__ == "__main__":
    main()
