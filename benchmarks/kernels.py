"""Benchmark: how fast are the Triton kernels against PyTorch on the same inputs?

Run: python -m benchmarks.kernels            (on a GPU; a few minutes)
     python -m benchmarks.kernels --quick    (small shapes; on CPU the kernels run under the
                                              Triton interpreter, which only proves the script)
     --out DIR also writes the JSON to DIR/kernels.json.

Sections (median of repeats, each kernel timed in turns with what it is compared with; CUDA
events on a GPU, with L2 flushed before each call so cache-sized inputs are read from HBM;
time.perf_counter on CPU):
  copy          device copy bandwidth: a large `dst.copy_(src)`, bytes read + written / time.
  verify_attention   kernel vs F.scaled_dot_product_attention with an explicit boolean mask
                (enable_gqa) for T new tokens against a full cache of length L, Qwen2.5-1.5B
                heads (Hq=12, Hkv=2, D=128), bf16. Bandwidth = K/V bytes read / time, also
                as a fraction of the copy bandwidth. max|diff| checks both agree.
  greedy_accept / rejection_sample   kernel vs the PyTorch reference at K=8, V=151936:
                time, bytes the kernel must read, and the time that would take at the copy
                bandwidth (the floor).
Human-readable tables first, JSON on the last line.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import pathlib

import torch
import torch.nn.functional as F

if not torch.cuda.is_available():
    # Must precede the first import of a kernel module (the @triton.jit decorators read it).
    os.environ.setdefault("TRITON_INTERPRET", "1")

import importlib  # noqa: E402

import triton  # noqa: E402

from benchmarks.harness import cli, results, timing  # noqa: E402
from specrt.kernels import reference  # noqa: E402

attention_kernel = importlib.import_module("specrt.kernels.triton.verify_attention")
acceptance_kernel = importlib.import_module("specrt.kernels.triton.acceptance")

CUDA = torch.cuda.is_available()
DEVICE = torch.device("cuda" if CUDA else "cpu")
HQ, HKV, HEAD_DIM = 12, 2, 128  # Qwen2.5-1.5B
VOCAB = 151936


class Timer:
    """Median ms of callables timed in turns (`timing.interleaved`); on CUDA with L2 flushed
    before each call, so cache-sized inputs are read from HBM."""

    def __init__(self, reps: int, warmup: int):
        self.reps, self.warmup = reps, warmup
        flush = torch.empty(256 * 2**20, dtype=torch.int8, device=DEVICE) if CUDA else None
        self.setup = flush.zero_ if flush is not None else None

    def __call__(self, *fns) -> list[float]:
        times = timing.interleaved(dict(enumerate(fns)), self.reps, self.warmup, DEVICE,
                                   self.setup)
        return [timing.median(times[i]) * 1e3 for i in range(len(fns))]


def sdpa_attention(q, k_cache, v_cache, mask, scale):
    """F.scaled_dot_product_attention on [B, T, Hq, D] queries; mask [B, 1, T, S] bool."""
    qh = q.transpose(1, 2)  # [B, Hq, T, D]
    try:
        out = F.scaled_dot_product_attention(qh, k_cache, v_cache, attn_mask=mask, scale=scale,
                                             enable_gqa=True)
    except TypeError:  # torch without enable_gqa: repeat the kv heads
        rep = q.shape[2] // k_cache.shape[1]
        out = F.scaled_dot_product_attention(qh, k_cache.repeat_interleave(rep, 1),
                                             v_cache.repeat_interleave(rep, 1),
                                             attn_mask=mask, scale=scale)
    return out.transpose(1, 2)


def bench_attention(timer, copy_gbps, batches, ts, lengths, dtype):
    rows = []
    elem = torch.finfo(dtype).bits // 8
    g = torch.Generator(device=DEVICE).manual_seed(0)
    for B in batches:
        for L in lengths:
            k = torch.randn(B, HKV, L, HEAD_DIM, generator=g, device=DEVICE).to(dtype)
            v = torch.randn(B, HKV, L, HEAD_DIM, generator=g, device=DEVICE).to(dtype)
            lens = torch.full((B,), L, dtype=torch.int32, device=DEVICE)
            for T in ts:
                q = torch.randn(B, T, HQ, HEAD_DIM, generator=g, device=DEVICE).to(dtype)
                scale = 1.0 / math.sqrt(HEAD_DIM)
                qpos = lens.view(B, 1) - T + torch.arange(T, device=DEVICE)
                mask = (torch.arange(L, device=DEVICE).view(1, 1, L)
                        <= qpos.view(B, T, 1)).view(B, 1, T, L)        # [B, 1, T, L]

                out_t = attention_kernel.verify_attention(q, k, v, lens, scale)
                out_s = sdpa_attention(q, k, v, mask, scale)
                diff = (out_t.float() - out_s.float()).abs().max().item()
                ms_t, ms_s = timer(
                    lambda: attention_kernel.verify_attention(q, k, v, lens, scale),
                    lambda: sdpa_attention(q, k, v, mask, scale))
                kv_bytes = 2 * B * HKV * L * HEAD_DIM * elem
                gbps = kv_bytes / (ms_t * 1e-3) / 1e9
                rows.append({
                    "B": B, "T": T, "cache_len": L, "triton_ms": ms_t, "sdpa_ms": ms_s,
                    "speedup_vs_sdpa": ms_s / ms_t, "kv_bytes": kv_bytes, "triton_gbps": gbps,
                    "fraction_of_copy_bw": gbps / copy_gbps, "max_abs_diff": diff,
                })
    return rows


def acceptance_inputs(B, K, V, dtype, g):
    logits = torch.randn(B, K + 1, V, generator=g, device=DEVICE) * 3
    target = torch.softmax(logits, -1)
    draft = torch.softmax(logits[:, :K] + torch.randn(B, K, V, generator=g, device=DEVICE), -1)
    drafts = torch.multinomial(draft.reshape(-1, V), 1, generator=g).view(B, K)
    uniforms, noise = reference.draw_randomness(B, K, V, g, DEVICE)
    return logits.to(dtype), target.to(dtype), draft.to(dtype), drafts, uniforms, noise


def bench_acceptance(timer, copy_gbps, batches, K, V, dtype):
    rows = []
    elem = torch.finfo(dtype).bits // 8
    g = torch.Generator(device=DEVICE).manual_seed(1)
    for B in batches:
        logits, target, draft, drafts, u, noise = acceptance_inputs(B, K, V, dtype, g)
        cases = {
            # op: (triton fn, reference fn, bytes the kernel reads)
            "greedy_accept": (lambda: acceptance_kernel.greedy_accept(logits, drafts),
                              lambda: reference.greedy_accept(logits, drafts),
                              B * (K + 1) * V * elem),
            # one target row, one draft row and the noise row per sequence (+ K gathers)
            "rejection_sample": (
                lambda: acceptance_kernel.rejection_sample(target, draft, drafts, u, noise),
                lambda: reference.rejection_sample(target, draft, drafts, u, noise),
                B * V * (2 * elem + 4)),
            "rejection_sample_one_hot": (
                lambda: acceptance_kernel.rejection_sample(target, None, drafts, u, noise),
                lambda: reference.rejection_sample(target, None, drafts, u, noise),
                B * V * (elem + 4)),
        }
        for op, (fn_t, fn_r, nbytes) in cases.items():
            (n_t, out_t), (n_r, out_r) = fn_t(), fn_r()
            agree = bool(torch.equal(n_t, n_r) and torch.equal(out_t, out_r))
            ms_t, ms_r = timer(fn_t, fn_r)
            floor_ms = nbytes / (copy_gbps * 1e9) * 1e3
            rows.append({
                "op": op, "B": B, "K": K, "V": V, "triton_ms": ms_t, "reference_ms": ms_r,
                "speedup_vs_reference": ms_r / ms_t, "bytes_read": nbytes,
                "floor_ms_at_copy_bw": floor_ms,
                "triton_gbps": nbytes / (ms_t * 1e-3) / 1e9, "agrees_with_reference": agree,
            })
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.kernels",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="small shapes, few repeats (CPU smoke run)")
    parser.add_argument("--out", type=pathlib.Path, help="also write the JSON to DIR/kernels.json")
    parser.add_argument("--reps", type=cli.count, default=None,
                        help="timed repeats per measurement")
    args = parser.parse_args()

    # On CPU the interpreter's bf16 arithmetic is wrong, so the smoke run uses fp32/fp16.
    attn_dtype = torch.bfloat16 if CUDA else torch.float16
    acc_dtype = torch.bfloat16 if CUDA else torch.float32
    if args.quick:
        batches, ts, lengths, vocab, k, copy_bytes = (1,), (1, 5), (128, 256), 4096, 8, 2**24
        reps, warmup = args.reps or 3, 1
    else:
        batches, ts, lengths = (1, 8), (1, 5, 9, 17), (512, 1024, 2048, 4096, 8192)
        vocab, k, copy_bytes = VOCAB, 8, 2**30
        reps, warmup = args.reps or 50, 5
    timer = Timer(reps, warmup)
    device_name = torch.cuda.get_device_name() if CUDA else "cpu (Triton interpreter)"

    copy_gbps = timing.copy_bandwidth(DEVICE, copy_bytes, reps, warmup, timer.setup)
    print(f"device: {device_name}; torch {torch.__version__}, triton {triton.__version__}; "
          f"median of {reps} repeats{' (quick)' if args.quick else ''}")
    print(f"copy bandwidth: {copy_gbps:,.1f} GB/s (read + write of {copy_bytes / 2**20:,.0f} MiB)")

    attn = bench_attention(timer, copy_gbps, batches, ts, lengths, attn_dtype)
    print("")
    print(f"verify_attention, Hq={HQ} Hkv={HKV} D={HEAD_DIM} "
          f"{str(attn_dtype).removeprefix('torch.')}, "
          "full cache (lens = L); bandwidth = K/V bytes / time")
    print(f"{'B':>3} {'T':>3} {'L':>6} {'triton ms':>10} {'sdpa ms':>10} {'speedup':>8} "
          f"{'GB/s':>9} {'of copy':>8} {'max|diff|':>10}")
    for r in attn:
        print(f"{r['B']:>3} {r['T']:>3} {r['cache_len']:>6} {r['triton_ms']:>10.4f} "
              f"{r['sdpa_ms']:>10.4f} {r['speedup_vs_sdpa']:>7.2f}x {r['triton_gbps']:>9.2f} "
              f"{r['fraction_of_copy_bw']:>7.0%} "
              f"{r['max_abs_diff']:>10.2e}")

    acc = bench_acceptance(timer, copy_gbps, batches, k, vocab, acc_dtype)
    print("")
    print(f"acceptance, K={k} V={vocab:,} {str(acc_dtype).removeprefix('torch.')}; "
          "floor = bytes read / copy bandwidth")
    print(f"{'op':<26} {'B':>3} {'triton ms':>10} {'ref ms':>10} {'speedup':>8} {'MB read':>8} "
          f"{'floor ms':>9} {'GB/s':>8} {'agree':>6}")
    for r in acc:
        print(f"{r['op']:<26} {r['B']:>3} {r['triton_ms']:>10.4f} {r['reference_ms']:>10.4f} "
              f"{r['speedup_vs_reference']:>7.2f}x {r['bytes_read'] / 1e6:>8.2f} "
              f"{r['floor_ms_at_copy_bw']:>9.4f} "
              f"{r['triton_gbps']:>8.2f} {str(r['agrees_with_reference']):>6}")

    result = {
        "benchmark": "kernels", "device": device_name, "torch": torch.__version__,
        "triton": triton.__version__,
        "quick": args.quick, "reps": reps, "copy_bandwidth_gbps": copy_gbps,
        "attention_dtype": str(attn_dtype), "acceptance_dtype": str(acc_dtype),
        "verify_attention": attn, "acceptance": acc,
    }
    line = json.dumps(result)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        results.write_atomically(args.out / "kernels.json", line + "\n")
    print(line)


if __name__ == "__main__":
    main()
