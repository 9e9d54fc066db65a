"""One-process GPU measurements for benchmarks/gpu_check.sh (issue 15, item 5).

Builds random bf16 models of the Qwen2.5-1.5B and 0.5B shapes in memory (no checkpoint is
written) and measures, on CUDA graphs where the engine uses them:
  decode      ms per graphed 1-token step, against the weight-read floor (bytes / HBM peak)
  verify      ms per graphed T-token pass for T = 1..17, as a ratio to T = 1
  draft       0.5B step / 1.5B step
  kernels     GPU activities in one eager 1-token step (torch.profiler)
  syncs       host syncs in one eager decode forward and in one graphed verify replay
              (torch.cuda.set_sync_debug_mode), and per speculative round through the
              engine's graphed path, greedy and sampled (the model as its own draft, K = 4,
              so every draft is accepted): sync calls the profiler sees (cuda*Synchronize,
              blocking cudaMemcpy) per round, implicit syncs sync debug mode reports, and the
              engine's read-backs
  exact       bf16: 512 greedy decode steps vs the same tokens verified 8 at a time, rows whose
              logits differ in any bit, and argmax mismatches
  pair        ms per graphed greedy round of the 1.5B with the 0.5B drafting K = 4, and that
              as a multiple of the 1.5B's decode step (the price of 1 + K proposed tokens)
Prints a table last and writes JSON (--json). `--tiny` runs the plumbing on CPU in seconds.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time
import warnings

import torch

from benchmarks.harness import cli
from specrt.engine.engine import Engine
from specrt.engine.request import Request
from specrt.model.config import ModelConfig
from specrt.model.graphs import StaticForward
from specrt.model.transformer import Transformer
from specrt.spec.config import SpecConfig
from specrt.spec.sampling import SamplingParams

SAMPLED = SamplingParams(temperature=1.0, top_p=0.9, seed=0)

SHAPES = {  # layers, hidden, intermediate, q heads, kv heads, head dim, vocab
    "1.5b": (28, 1536, 8960, 12, 2, 128, 151936),
    "0.5b": (24, 896, 4864, 14, 2, 64, 151936),
    "tiny": (2, 128, 256, 2, 1, 64, 320),
}


def build(shape: str, device, dtype, max_seq: int, seed: int = 0) -> Transformer:
    L, H, I, Hq, Hkv, D, V = SHAPES[shape]
    cfg = ModelConfig("Qwen2ForCausalLM", V, H, I, L, Hq, Hkv, D, 1e-6, 1e6, 32768, True, True)
    g = torch.Generator(device).manual_seed(seed)

    def w(*size, scale=0.02):
        return (torch.randn(*size, generator=g, device=device) * scale).to(dtype)

    weights = {"model.embed_tokens.weight": w(V, H), "model.norm.weight": w(H, scale=0.1) + 1}
    for n in range(L):
        p = f"model.layers.{n}."
        for x, out in (("q", Hq * D), ("k", Hkv * D), ("v", Hkv * D)):
            weights[p + f"self_attn.{x}_proj.weight"] = w(out, H)
            weights[p + f"self_attn.{x}_proj.bias"] = w(out, scale=0.5)
        weights[p + "self_attn.o_proj.weight"] = w(H, Hq * D)
        weights[p + "mlp.gate_proj.weight"] = w(I, H)
        weights[p + "mlp.up_proj.weight"] = w(I, H)
        weights[p + "mlp.down_proj.weight"] = w(H, I)
        weights[p + "input_layernorm.weight"] = w(H, scale=0.1) + 1
        weights[p + "post_attention_layernorm.weight"] = w(H, scale=0.1) + 1
    return Transformer(cfg, weights, max_seq)


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def time_ms(fn, device, reps: int) -> float:
    fn()
    _sync(device)
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    _sync(device)
    return (time.perf_counter() - t0) * 1e3 / reps


def runner_ms(model, cache, t: int, reps: int) -> float:
    """ms per graphed T-token pass at the cache's current length (reset before each replay)."""
    r = StaticForward(model, cache, 1, t, use_graph=True)
    saved = cache.lengths.clone()

    def step():
        cache.lengths.copy_(saved)
        r.replay()
    ms = time_ms(step, model.device, reps)
    cache.lengths.copy_(saved)
    return ms


PREVIOUS_TILE = (32, 64, 128, 4, 4, 264)   # the matmul's Tile before the H200's sweeps


@contextlib.contextmanager
def previous_kernels():
    """The CUDA layer kernels' settings before the H200's first measurements (RESULTS.md,
    "The CUDA path on an H200"): 32 x 64 matmul tiles, 256 keys per attention split. (Splits
    past a row's last key stop at once either way: that change has no switch.)"""
    from specrt.kernels.triton import matmul as mm
    from specrt.kernels.triton import verify_attention as va

    saved = mm.tile_for, va.SPLIT_KEYS
    old_tile = mm.Tile(*PREVIOUS_TILE)
    mm.tile_for = lambda dtype: old_tile if dtype != torch.float32 else saved[0](dtype)
    va.SPLIT_KEYS = 256
    try:
        yield
    finally:
        mm.tile_for, va.SPLIT_KEYS = saved


def before_after(model, cache, reps: int, pairs: int = 3) -> dict:
    """Decode ms per graphed step with the previous kernels and the current ones, alternated
    `pairs` times in this process; medians."""
    before, after = [], []
    for _ in range(pairs):
        with previous_kernels():
            before.append(runner_ms(model, cache, 1, reps))
        after.append(runner_ms(model, cache, 1, reps))
    return {"before_ms": statistics.median(before), "after_ms": statistics.median(after),
            "before_all": before, "after_all": after}


SPLITS = (64, 128, 256)


def split_keys_step(model, cache, reps: int, pairs: int = 2) -> dict[int, float]:
    """Decode ms per graphed step by keys per attention split (`verify_attention.SPLIT_KEYS`),
    each size timed `pairs` times in turn; medians."""
    from specrt.kernels.triton import verify_attention as va
    if model.device.type != "cuda":
        return {}
    saved = va.SPLIT_KEYS
    times: dict[int, list[float]] = {k: [] for k in SPLITS}
    try:
        for _ in range(pairs):
            for k in SPLITS:
                va.SPLIT_KEYS = k
                times[k].append(runner_ms(model, cache, 1, reps))
    finally:
        va.SPLIT_KEYS = saved
    return {k: statistics.median(v) for k, v in times.items()}


def count_kernels(model, cache) -> int | None:
    if model.device.type != "cuda":
        return None
    from torch.profiler import ProfilerActivity, profile
    ids = torch.ones(1, 1, dtype=torch.int64, device=model.device)
    saved = cache.lengths.clone()
    with torch.inference_mode(), profile(activities=[ProfilerActivity.CUDA]) as prof:
        model.forward_static(ids, cache)
        torch.cuda.synchronize()
    cache.lengths.copy_(saved)
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)


def count_syncs(fn, device) -> int | None:
    if device.type != "cuda":
        return None
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in caught)


SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize",
              "cudaMemcpy")   # cudaMemcpy without Async: a blocking copy


def round_syncs(model, prompt: list[int], k: int, rounds: int,
                params: SamplingParams = SamplingParams()) -> dict:
    """Host syncs per speculative round (model as its own draft) on the engine's graphed path:
    profiler sync calls, sync-debug-mode reports, and StaticRound read-backs."""
    device = model.device
    t0 = time.perf_counter()
    eng = Engine(model, model, 1, len(prompt) + 4 * rounds * (k + 1) + 64, static=True,
                 graph_max_k=k)                    # on CUDA: every graph captured here
    capture_s = time.perf_counter() - t0
    eng.admit(Request(tuple(prompt), 3 * rounds * (k + 1), params,
                      spec=SpecConfig("draft_model", k)))
    for _ in range(3):
        eng.step()                                  # the first round's long catch-up is eager
    out = {"k": k, "rounds": rounds, "warm_up_s": capture_s}
    before = eng.graphs.read_backs
    if device.type == "cuda":
        from torch.profiler import ProfilerActivity, profile, record_function
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(rounds):
                with record_function("specrt_round"):
                    eng.step()
            torch.cuda.synchronize()
        events = prof.events()
        spans = [(e.time_range.start, e.time_range.end) for e in events
                 if e.name == "specrt_round"]
        calls = [e for e in events if e.name in SYNC_CALLS]
        # Only the sync calls made inside a round count (not the closing synchronize above,
        # nor any the profiler makes); all of them are listed by name.
        inside = [e.name for e in calls
                  if any(a <= e.time_range.start <= b for a, b in spans)]
        out["profiler_syncs_per_round"] = len(inside) / rounds
        out["profiler_sync_calls_in_rounds"] = {c: inside.count(c) for c in sorted(set(inside))}
        names = [e.name for e in calls]
        out["profiler_sync_calls"] = {c: names.count(c) for c in sorted(set(names))}
        out["debug_mode_syncs_per_round"] = count_syncs(
            lambda: [eng.step() for _ in range(rounds)], device) / rounds
        rounds *= 2
    else:
        for _ in range(rounds):
            eng.step()
    out["read_backs_per_round"] = (eng.graphs.read_backs - before) / rounds
    return out


def pair_round(target, draft, prompt: list[int], k: int, rounds: int) -> dict:
    """ms per greedy speculative round of the pair (draft model, K drafts, graphed), timed
    over `rounds` rounds after three warm-up rounds. A round costs the same whatever is
    accepted (the graphs run K drafts and K + 1 verified tokens), so with random weights
    (almost nothing accepted) it still prices the round: at acceptance a per draft it commits
    1 + a + ... + a^K tokens."""
    device = target.device
    t0 = time.perf_counter()
    eng = Engine(target, draft, 1, len(prompt) + 2 * (rounds + 3) * (k + 1) + 64, static=True,
                 graph_max_k=k)
    capture_s = time.perf_counter() - t0
    eng.admit(Request(tuple(prompt), (rounds + 3) * (k + 1), SamplingParams(),
                      spec=SpecConfig("draft_model", k)))
    for _ in range(3):
        eng.step()
    _sync(device)
    t0 = time.perf_counter()
    committed = 0
    for _ in range(rounds):
        committed += sum(len(s.new_tokens) for s in eng.step())
    _sync(device)
    return {"k": k, "rounds": rounds, "round_ms": (time.perf_counter() - t0) * 1e3 / rounds,
            "tokens_per_round": committed / rounds, "warm_up_s": capture_s}


def exactness(model, prompt, steps: int, chunk: int) -> dict:
    """Greedy decode `steps` tokens one at a time (graphed), then feed the same inputs through
    `chunk`-token verify passes; count logits rows that differ in any bit, and argmax flips."""
    V = model.cfg.vocab_size
    caches = [model.new_cache(1, prompt.shape[1] + steps + chunk) for _ in range(2)]
    for c in caches:
        model.forward(prompt, c)
    one = StaticForward(model, caches[0], 1, 1, use_graph=True)
    inputs = torch.empty(steps, dtype=torch.int64, device=model.device)
    logits = torch.empty(steps, V, device=model.device)
    tok = prompt[:, -1:]
    for i in range(steps):
        inputs[i] = tok[0, 0]
        logits[i] = one.run(tok)[0, 0]
        tok = logits[i].argmax().view(1, 1)
    many = StaticForward(model, caches[1], 1, chunk, use_graph=True)
    differ = flips = 0
    for s in range(0, steps - chunk + 1, chunk):
        out = many.run(inputs[s:s + chunk].view(1, chunk))[0]
        differ += int((out != logits[s:s + chunk]).any(dim=-1).sum())
        flips += int((out.argmax(-1) != logits[s:s + chunk].argmax(-1)).sum())
    return {"tokens": steps, "chunk": chunk, "rows_differ": differ, "argmax_flips": flips}


def gpu_script_parser(prog: str, doc: str, budget: float) -> argparse.ArgumentParser:
    """The options the GPU check's scripts share (this one and benchmarks.gpu_kernels)."""
    p = argparse.ArgumentParser(prog=prog, description=doc.split("\n\n")[0])
    p.add_argument("--tiny", action="store_true", help="CPU plumbing run on a tiny model")
    p.add_argument("--context", type=cli.count, default=512, help="tokens of history")
    p.add_argument("--budget", type=float, default=budget,
                   help="seconds; later sections skipped")
    p.add_argument("--json", default=None, help="write the results here")
    return p


def main(argv=None) -> int:
    p = gpu_script_parser("python -m benchmarks.gpu_probe", __doc__, budget=200)
    p.add_argument("--hbm-tbps", type=float, default=4.8, help="HBM peak, TB/s (H200: 4.8)")
    p.add_argument("--reps", type=cli.count, default=50)
    args = p.parse_args(argv)
    t_start = time.perf_counter()
    device = torch.device("cpu" if args.tiny else "cuda")
    dtype = torch.float32 if args.tiny else torch.bfloat16
    shapes = ["tiny"] if args.tiny else ["1.5b", "0.5b"]
    reps = 3 if args.tiny else args.reps
    res: dict = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
                 "dtype": str(dtype), "context": args.context, "models": {}}
    rows = []
    kept: dict = {}
    for shape in shapes:
        if time.perf_counter() - t_start > args.budget:
            rows.append((shape, "skipped: over budget", ""))
            continue
        torch.manual_seed(0)
        model = build(shape, device, dtype, args.context + 600)
        cache = model.new_cache(1, args.context + 600)
        prompt = torch.randint(0, model.cfg.vocab_size, (1, args.context), device=device)
        model.forward(prompt, cache)
        floor_ms = model.weight_bytes / (args.hbm_tbps * 1e12) * 1e3
        m = {"weight_bytes": model.weight_bytes, "floor_ms": floor_ms,
             "backend": model.backend.name}
        m["decode_ms"] = runner_ms(model, cache, 1, reps)
        m["before_after"] = before_after(model, cache, reps)   # on CPU: the plumbing only
        m["split_keys_ms"] = split_keys_step(model, cache, reps)
        m["decode_over_floor"] = m["decode_ms"] / floor_ms
        m["verify_over_step"] = {t: runner_ms(model, cache, t, reps) / m["decode_ms"]
                                 for t in range(1, 18)}
        m["kernels_per_step"] = count_kernels(model, cache)
        one = StaticForward(model, cache, 1, 8, use_graph=True)
        one.run(torch.ones(1, 8, dtype=torch.int64, device=device))   # capture outside the count
        cache.truncate([args.context])
        m["syncs_graphed_verify"] = count_syncs(
            lambda: one.run(torch.ones(1, 8, dtype=torch.int64, device=device)), device)
        cache.truncate([args.context])
        one_token = torch.ones(1, 1, dtype=torch.int64, device=device)
        m["syncs_eager_decode"] = count_syncs(lambda: model.forward(one_token, cache), device)
        cache.truncate([args.context])
        if shape in ("1.5b", "tiny") and time.perf_counter() - t_start < args.budget:
            m["exact"] = exactness(model, prompt[:, :64], 512 if not args.tiny else 16, 8)
        if shape in ("1.5b", "tiny") and time.perf_counter() - t_start < args.budget:
            m["round"] = round_syncs(model, prompt[0, :64].tolist(), 4, 10 if args.tiny else 20)
        if shape in ("1.5b", "tiny") and time.perf_counter() - t_start < args.budget:
            m["sampled_round"] = round_syncs(model, prompt[0, :64].tolist(), 4,
                                             10 if args.tiny else 20, SAMPLED)
        res["models"][shape] = m
        kept[shape] = model                      # for the pair's rounds below
        del cache, one
        if device.type == "cuda":
            torch.cuda.empty_cache()
    ms = res["models"]
    if "1.5b" in ms and "0.5b" in ms:
        res["draft_over_target"] = ms["0.5b"]["decode_ms"] / ms["1.5b"]["decode_ms"]
    pair = ("1.5b", "0.5b") if not args.tiny else ("tiny", "tiny")
    if all(p in kept for p in pair) and time.perf_counter() - t_start < args.budget:
        target, draft = kept[pair[0]], kept[pair[1]]
        prompt = torch.randint(0, target.cfg.vocab_size, (64,)).tolist()
        res["pair"] = pair_round(target, draft, prompt, 4, 3 if args.tiny else 20)
        res["pair"]["round_over_target_step"] = \
            res["pair"]["round_ms"] / ms[pair[0]]["decode_ms"]
    kept.clear()
    res["seconds"] = time.perf_counter() - t_start
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    for shape, m in ms.items():
        v = m["verify_over_step"]
        rows += [
            (shape, "decode ms/token (floor)", f"{m['decode_ms']:.3f} ({m['floor_ms']:.3f}, "
                                               f"{m['decode_over_floor']:.2f}x)"),
            (shape, "verify(T)/step T=2,5,9,17", " ".join(f"{v[t]:.2f}" for t in (2, 5, 9, 17))),
        ]
        if "before_after" in m:
            ba = m["before_after"]
            rows.append((shape, "decode ms: previous kernels / current (medians, alternated)",
                         f"{ba['before_ms']:.3f} / {ba['after_ms']:.3f}"))
        if m.get("split_keys_ms"):
            rows.append((shape, "decode ms by keys per attention split " + "/".join(
                map(str, m["split_keys_ms"])), " / ".join(
                f"{v:.3f}" for v in m["split_keys_ms"].values())))
        rows += [
            (shape, "kernels per eager step", str(m["kernels_per_step"])),
            (shape, "syncs: eager decode / graphed verify",
             f"{m['syncs_eager_decode']} / {m['syncs_graphed_verify']}"),
        ]
        for key, kind in (("round", "greedy"), ("sampled_round", "sampled")):
            if key in m:
                r = m[key]
                rows.append((shape, f"syncs per {kind} round (K={r['k']}): profiler / debug / "
                                    "read-backs",
                             f"{r.get('profiler_syncs_per_round', 'n/a')} / "
                             f"{r.get('debug_mode_syncs_per_round', 'n/a')} / "
                             f"{r['read_backs_per_round']}"))
        if "exact" in m:
            e = m["exact"]
            rows.append((shape, f"verify==decode over {e['tokens']} tokens",
                         f"{e['rows_differ']} rows differ, {e['argmax_flips']} argmax flips"))
    if "draft_over_target" in res:
        rows.append(("0.5b/1.5b", "draft step / target step", f"{res['draft_over_target']:.2f}"))
    if "pair" in res:
        r = res["pair"]
        rows.append(("/".join(pair), f"greedy round, K={r['k']} (ms; target steps)",
                     f"{r['round_ms']:.3f}; {r['round_over_target_step']:.2f}"))
    print("\n| model | measure | value |\n|---|---|---|")
    for r in rows:
        print(f"| {r[0]} | {r[1]} | {r[2]} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
