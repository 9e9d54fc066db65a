"""Where a GPU decode step's time goes, and which matmul tile reads the weights fastest
(benchmarks/gpu_check.sh, step `kernels`).

  profile  one eager 1-token step of the 1.5B and 0.5B shapes (random bf16 weights, as
           `benchmarks.gpu_probe` builds them) under torch.profiler: GPU time per kernel, the
           matmuls split by the weight they read (a step calls them in a fixed order: qkv, o,
           gate_up, down per layer, then the head), the sum of kernel times against the span
           from the first kernel's start to the last one's end
  matmul   each decode-pass weight shape of both models timed with every candidate `Tile` at
           M = 1 and M = 17, and cuBLAS (`F.linear`) at M = 1. The launches are replayed in a
           CUDA graph over enough copies of the weight (256 MB, or 128 copies: >= 4x the
           H200's 50 MB L2) that none is read from L2,
           as in a real step (1-3 GB of weights), so a time is an HBM read plus the launch gap
           inside a graph. Each candidate is also checked for batch invariance on the GPU: row
           0 of the M = 17 product equals the M = 1 product bit for bit. Per candidate, the sum
           over one step's matmuls (layers x (qkv + o + gate_up + down) + head)

    python -m benchmarks.gpu_kernels --budget 150 --json out.json
    python -m benchmarks.gpu_kernels --tiny      # plumbing on CPU, under TRITON_INTERPRET=1
"""
from __future__ import annotations

import dataclasses
import json
import math
import time

import torch
import torch.nn.functional as F

from benchmarks.gpu_probe import PREVIOUS_TILE, SHAPES, build, gpu_script_parser
from specrt.kernels.triton import matmul as mm

BASE = mm.tile_for(torch.bfloat16)
# The launcher's tile, the one it replaced (32 x 64) and neighbours of it; 30 tiles timed in
# three runs chose it (RESULTS.md, "The CUDA path on an H200").
_CHANGES = [{}, {"num_stages": 3}, {"target_programs": 528}, {"block_n": 64}]
CANDIDATES = list(dict.fromkeys([dataclasses.replace(BASE, **c) for c in _CHANGES]
                                + [mm.Tile(*PREVIOUS_TILE)]))
PARTS = ("qkv", "o", "gate_up", "down")
MIN_BYTES = 256 << 20          # weight copies per graph: more than 5x the H200's 50 MB L2


def tile_name(t: mm.Tile) -> str:
    return (f"m{t.block_m} n{t.block_n} k{t.block_k} w{t.num_warps} s{t.num_stages} "
            f"p{t.target_programs}")


def weight_shapes(shape: str) -> tuple[dict[str, tuple[int, int]], int]:
    """{part: (N, K)} of one decode step's matmuls, and the layer count."""
    L, H, I, Hq, Hkv, D, V = SHAPES[shape]
    return {"qkv": ((Hq + 2 * Hkv) * D, H), "o": (H, Hq * D), "gate_up": (2 * I, H),
            "down": (H, I), "head": (V, H)}, L


def step_sum(per_part: dict[str, float], layers: int) -> float | None:
    if any(per_part.get(p) is None for p in PARTS + ("head",)):
        return None
    return layers * sum(per_part[p] for p in PARTS) + per_part["head"]


# -- profile --------------------------------------------------------------------------------

def _elapsed_us(e) -> float:
    return e.time_range.end - e.time_range.start


def kernel_profile(model, cache) -> dict:
    """GPU time of one eager decode step, per kernel (matmuls per weight)."""
    from torch.profiler import ProfilerActivity, profile
    device = model.device
    ids = torch.ones(1, 1, dtype=torch.int64, device=device)
    saved = cache.lengths.clone()
    for _ in range(3):                                   # compile and warm up
        model.forward_static(ids, cache)
        cache.lengths.copy_(saved)
    torch.cuda.synchronize()
    with torch.inference_mode(), profile(activities=[ProfilerActivity.CUDA]) as prof:
        model.forward_static(ids, cache)
        torch.cuda.synchronize()
    cache.lengths.copy_(saved)
    kernels = sorted((e for e in prof.events()
                      if e.device_type == torch.autograd.DeviceType.CUDA),
                     key=lambda e: e.time_range.start)
    L = model.cfg.num_layers
    matmuls = [e for e in kernels if "matmul" in e.name]
    per: dict[str, list[float]] = {}
    for i, e in enumerate(matmuls):
        label = PARTS[i % 4] if i < 4 * L and len(matmuls) == 4 * L + 1 else \
            ("head" if len(matmuls) == 4 * L + 1 else "matmul (unlabelled)")
        per.setdefault(f"matmul {label}", []).append(_elapsed_us(e))
    for e in kernels:
        if "matmul" not in e.name:
            per.setdefault(e.name[:60], []).append(_elapsed_us(e))
    busy = sum(sum(v) for v in per.values())
    span = kernels[-1].time_range.end - kernels[0].time_range.start if kernels else 0.0
    rows = sorted(((k, len(v), sum(v)) for k, v in per.items()), key=lambda r: -r[2])
    return {"kernels": len(kernels), "busy_us": busy, "span_us": span,
            "rows": [{"kernel": k, "count": n, "total_us": t, "mean_us": t / n}
                     for k, n, t in rows]}


# -- matmul sweep ---------------------------------------------------------------------------

def graphed_us(launches, reps: int = 5) -> float:
    """Mean us per launch of `launches` (callables queueing one kernel each), replayed in one
    CUDA graph."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for f in launches:                               # warm up off the capture
            f()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for f in launches:
            f()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / (reps * len(launches))


def sweep(shapes: list[str], candidates: list[mm.Tile], device, budget_s: float,
          t0: float) -> dict:
    out: dict = {"candidates": [tile_name(t) for t in candidates], "shapes": {}}
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    gen = torch.Generator(device).manual_seed(0)
    for shape in shapes:
        parts, layers = weight_shapes(shape)
        res: dict = {"layers": layers, "parts": {}}
        for part, (n, k) in parts.items():
            if time.perf_counter() - t0 > budget_s:
                res["parts"][part] = "skipped: over budget"
                continue
            nbytes = n * k * torch.finfo(dtype).bits // 8
            copies = 1 if device.type != "cuda" else \
                min(128, max(2, math.ceil(MIN_BYTES / nbytes)))
            ws = [(torch.randn(n, k, generator=gen, device=device) * 0.02).to(dtype)
                  for _ in range(copies)]
            x1 = torch.randn(1, k, generator=gen, device=device).to(dtype)
            x17 = torch.randn(17, k, generator=gen, device=device).to(dtype)
            x17[0] = x1[0]
            out_dtype = torch.float32 if part == "head" else None
            entry: dict = {"n": n, "k": k, "bytes": nbytes, "copies": copies, "tiles": {}}
            if device.type == "cuda":
                entry["cublas_m1_us"] = graphed_us(
                    [lambda w=w: F.linear(x1, w) for w in ws])
            for tile in candidates:
                if time.perf_counter() - t0 > budget_s:
                    break
                name = tile_name(tile)
                try:
                    one = mm.matmul(x1, ws[0], None, out_dtype, tile=tile)
                    many = mm.matmul(x17, ws[0], None, out_dtype, tile=tile)
                    ref = (x1.float() @ ws[0].float().T)
                    row = {"invariant": bool(torch.equal(one[0], many[0])),
                           "max_err": float((one.float() - ref).abs().max())}
                    if device.type == "cuda":
                        row["m1_us"] = graphed_us([lambda w=w: mm.matmul(
                            x1, w, None, out_dtype, tile=tile) for w in ws])
                        row["m17_us"] = graphed_us([lambda w=w: mm.matmul(
                            x17, w, None, out_dtype, tile=tile) for w in ws])
                        row["m1_gbps"] = nbytes / row["m1_us"] / 1e3
                except Exception as e:     # a candidate that fails to compile or launch
                    row = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
                entry["tiles"][name] = row
            res["parts"][part] = entry
            del ws
            if device.type == "cuda":
                torch.cuda.empty_cache()
        out["shapes"][shape] = res
    return out


ATTENTION_SPLITS = (64, 128, 256, 512)
ATTENTION_CASES = ((512, 576), (2048, 2112), (512, 16384))      # (history, S_max)


def attention_sweep(shapes: list[str], device, budget_s: float, t0: float) -> list[dict]:
    """The fused decode attention (`rope_verify_attention`, T = 1) per split size, history and
    cache size, us per launch in a graph of 20."""
    from specrt.kernels.triton.verify_attention import rope_verify_attention
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    rows = []
    for shape in shapes:
        _, _, _, Hq, Hkv, D, _ = SHAPES[shape]
        width = (Hq + 2 * Hkv) * D
        for history, s_max in ATTENTION_CASES if device.type == "cuda" else ((40, 96),):
            if time.perf_counter() - t0 > budget_s:
                return rows
            qkv = torch.randn(1, 1, width, device=device).to(dtype)
            bias = torch.randn(width, device=device).to(dtype)
            cos, sin = (torch.randn(s_max, D, device=device).to(dtype) for _ in range(2))
            k, v = (torch.randn(1, Hkv, s_max, D, device=device).to(dtype) for _ in range(2))
            lens = torch.tensor([history + 1], dtype=torch.int32, device=device)
            outs = {}
            for split in ATTENTION_SPLITS:
                def launch(split=split):
                    return rope_verify_attention(qkv, bias, cos, sin, k, v, lens, Hq,
                                                 split_keys=split)
                outs[split] = launch()
                row = {"shape": shape, "history": history, "s_max": s_max, "split_keys": split}
                if device.type == "cuda":
                    row["us"] = graphed_us([launch] * 20)
                rows.append(row)
            ref = outs[ATTENTION_SPLITS[0]].float()
            for row in rows[-len(ATTENTION_SPLITS):]:
                row["max_diff_vs_64"] = float((outs[row["split_keys"]].float() - ref).abs().max())
    return rows


def summarize(sw: dict) -> list[str]:
    lines = []
    for shape, res in sw["shapes"].items():
        L = res["layers"]
        parts = {p: e for p, e in res["parts"].items() if isinstance(e, dict)}
        lines.append(f"\n{shape}: us per launch at M = 1 (M = 17), GB/s at M = 1; "
                     f"invariant = M=17 row 0 == M=1 bit for bit")
        head = "| tile | " + " | ".join(parts) + " | step matmuls us | invariant |"
        lines += [head, "|" + "---|" * (len(parts) + 3)]
        cub = {p: e.get("cublas_m1_us") for p, e in parts.items()}
        if cub and all(v is not None for v in cub.values()):
            total = step_sum(cub, L)
            lines.append("| cuBLAS (M = 1) | " + " | ".join(
                f"{v:.1f} {parts[p]['bytes'] / v / 1e3:.0f}" for p, v in cub.items())
                + (f" | {total:.0f} | - |" if total else " | - | - |"))
        best: dict[str, tuple[float, str]] = {}
        for name in sw["candidates"]:
            cells, m1, inv = [], {}, True
            for p, e in parts.items():
                r = e["tiles"].get(name)
                if r is None or "error" in r:
                    cells.append("error" if r else "-")
                    inv = False                  # not shown invariant if not run
                    continue
                inv &= r["invariant"]
                if "m1_us" in r:
                    m1[p] = r["m1_us"]
                    cells.append(f"{r['m1_us']:.1f} ({r['m17_us']:.1f}) {r['m1_gbps']:.0f}")
                    if r["invariant"] and r["m1_us"] < best.get(p, (math.inf, ""))[0]:
                        best[p] = (r["m1_us"], name)
                else:
                    cells.append(f"err {r['max_err']:.1e}")
            total = step_sum(m1, L)
            lines.append(f"| {name} | " + " | ".join(cells)
                         + (f" | {total:.0f} |" if total else " | - |")
                         + f" {'yes' if inv else 'NO'} |")
        if best:
            total = step_sum({p: v[0] for p, v in best.items()}, L)
            lines.append("best per part: " + "; ".join(f"{p} {v[1]} {v[0]:.1f}"
                                                       for p, v in best.items())
                         + (f"; step matmuls {total:.0f} us" if total else ""))
    return lines


def main(argv=None) -> int:
    args = gpu_script_parser("python -m benchmarks.gpu_kernels", __doc__,
                             budget=150).parse_args(argv)
    t0 = time.perf_counter()
    device = torch.device("cpu" if args.tiny else "cuda")
    shapes = ["tiny"] if args.tiny else ["1.5b", "0.5b"]
    res: dict = {"profile": {}}
    lines = []
    if device.type == "cuda":
        for shape in shapes:
            model = build(shape, device, torch.bfloat16, args.context + 64)
            cache = model.new_cache(1, args.context + 64)
            prompt = torch.randint(0, model.cfg.vocab_size, (1, args.context), device=device)
            model.forward(prompt, cache)
            prof = res["profile"][shape] = kernel_profile(model, cache)
            lines.append(f"\n{shape}: one eager decode step, {prof['kernels']} kernels, "
                         f"GPU busy {prof['busy_us']:.0f} us of a {prof['span_us']:.0f} us span")
            lines += ["| kernel | count | total us | mean us |", "|---|---|---|---|"]
            lines += [f"| {r['kernel']} | {r['count']} | {r['total_us']:.1f} | "
                      f"{r['mean_us']:.2f} |" for r in prof["rows"][:14]]
            del model, cache
            torch.cuda.empty_cache()
    res["attention"] = attention_sweep(shapes, device, args.budget, t0)
    lines += ["\nfused decode attention (T = 1), us per launch by keys per split",
              "| model | history | S_max | " + " | ".join(map(str, ATTENTION_SPLITS)) + " |",
              "|---|---|---|" + "---|" * len(ATTENTION_SPLITS)]
    by_case: dict = {}
    for r in res["attention"]:
        by_case.setdefault((r["shape"], r["history"], r["s_max"]), []).append(
            f"{r['us']:.1f}" if "us" in r else f"diff {r['max_diff_vs_64']:.1e}")
    lines += [f"| {k[0]} | {k[1]} | {k[2]} | " + " | ".join(v) + " |" for k, v in by_case.items()]
    candidates = CANDIDATES if device.type == "cuda" else CANDIDATES[:3]
    res["matmul"] = sweep(shapes, candidates, device, args.budget, t0)
    lines += summarize(res["matmul"])
    res["seconds"] = time.perf_counter() - t0
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
