"""Benchmark: what do CUDA graphs save in the draft loop, per draft step?

Run: python -m benchmarks.graphs              (on a GPU: Qwen2.5-Coder-0.5B shapes, bf16)
     python -m benchmarks.graphs --quick      (tiny model; on CPU in seconds)
     Writes the JSON to --out/graphs.json (default benchmarks/results).

A random-weight draft model with Qwen2.5-Coder-0.5B-Instruct's shapes (vocab 151936, hidden
896, intermediate 4864, 24 layers, 14 / 2 heads, q/k/v bias, untied head, rope_theta 1e6) is
built in memory (no files, no download), and the same K-token proposal is made by two
`DraftModelDrafter`s sharing its weights:

  eager    static=False: every draft step is a `Transformer.forward` (one launch per op).
  static   static=True: the catch-up forward (1 or 2 tokens; longer ones feed all but the last
           eagerly first) and all K guesses replay one CUDA graph (`StaticDraftLoop`). On CPU
           the same static buffers run eagerly ("static-eager").

Both drafters are driven in lockstep through the same rounds: a P-token prompt (round 0,
untimed), then rounds that each feed one new committed token, propose K drafts, and accept
min(2, K) of them (so rollback runs too). Every round checks that the two paths' greedy drafts
are identical. Each proposal is timed with CUDA events on CUDA (perf_counter on CPU) and
divided by K: ms per draft step. The floor is the weight-read time of one step: weight bytes /
device copy bandwidth (a large `dst.copy_(src)`, bytes read + written / time, measured in the
same run). Human table first, JSON on the last line; exit status 1 if the drafts differ.
"""
from __future__ import annotations

import argparse
import gc
import time
from pathlib import Path

from benchmarks.harness import cli, machine, report, results, timing

# Qwen2.5-Coder-0.5B-Instruct's config.json, shape fields only.
QWEN_05B = dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_layers=24,
                num_heads=14, num_kv_heads=2)
TINY = dict(vocab_size=1000, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
            num_kv_heads=2)


def build_parser() -> argparse.ArgumentParser:
    p = cli.parser("benchmarks.graphs", __doc__,
                   epilog=__doc__.split("\n\n", 2)[2])
    p.add_argument("--quick", action="store_true",
                   help="tiny model (hidden 64, 2 layers, vocab 1000), few repeats")
    p.add_argument("--device", default=None, type=cli.device_arg,
                   help="cpu, cuda or cuda:N (default: cuda if available)")
    p.add_argument("--dtype", default=None, choices=["bfloat16", "float32", "float16"],
                   help="default bfloat16 on CUDA, float32 on CPU")
    p.add_argument("--shapes", choices=["qwen0.5b", "tiny"], default=None,
                   help="model shapes (default: qwen0.5b on CUDA, tiny on CPU or with --quick)")
    p.add_argument("--batches", default="1,8", help="batch sizes (default 1,8)")
    p.add_argument("--ks", default="4,8", help="draft lengths K (default 4,8)")
    p.add_argument("--prefix", type=int, default=128, help="prompt length P (default 128)")
    p.add_argument("--repeats", type=cli.count, default=None, help="timed rounds (default 30; "
                   "--quick 5)")
    p.add_argument("--warmup", type=int, default=3, help="untimed rounds after the prompt "
                   "round, which is untimed too and captures the graph (default 3)")
    p.add_argument("--threads", type=cli.count, default=None, help="torch intra-op threads "
                   "(default 2; --quick 1: a tiny model gains nothing from more)")
    p.add_argument("--out", default=str(results.DEFAULT_OUT),
                   help="directory for graphs.json (default benchmarks/results)")
    return p


def random_model(shapes: dict, dtype, device, max_seq_len: int, seed: int = 0):
    """A Transformer with the given shapes and random weights, built directly in memory.

    Matrices ~ N(0, 0.02) (the checkpoints' initializer_range), norms = 1, biases ~ N(0, 0.02):
    activations stay finite through every layer, so argmax drafts are well defined."""
    import torch

    from specrt.model.config import ModelConfig
    from specrt.model import Transformer

    cfg = ModelConfig(architecture="Qwen2ForCausalLM", head_dim=shapes["hidden_size"]
                      // shapes["num_heads"], rms_norm_eps=1e-6, rope_theta=1e6,
                      max_position_embeddings=32768, tie_word_embeddings=False,
                      attention_bias=True, **shapes)
    gen = torch.Generator(device=device).manual_seed(seed)

    def normal(*shape):
        return (torch.randn(*shape, generator=gen, device=device, dtype=torch.float32)
                * 0.02).to(dtype)

    h, i, v = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
    w = {"model.embed_tokens.weight": normal(v, h), "lm_head.weight": normal(v, h),
         "model.norm.weight": torch.ones(h, dtype=dtype, device=device)}
    for n in range(cfg.num_layers):
        p = f"model.layers.{n}."
        w.update({
            p + "input_layernorm.weight": torch.ones(h, dtype=dtype, device=device),
            p + "post_attention_layernorm.weight": torch.ones(h, dtype=dtype, device=device),
            p + "self_attn.q_proj.weight": normal(cfg.q_size, h),
            p + "self_attn.k_proj.weight": normal(cfg.kv_size, h),
            p + "self_attn.v_proj.weight": normal(cfg.kv_size, h),
            p + "self_attn.q_proj.bias": normal(cfg.q_size),
            p + "self_attn.k_proj.bias": normal(cfg.kv_size),
            p + "self_attn.v_proj.bias": normal(cfg.kv_size),
            p + "self_attn.o_proj.weight": normal(h, cfg.q_size),
            p + "mlp.gate_proj.weight": normal(i, h),
            p + "mlp.up_proj.weight": normal(i, h),
            p + "mlp.down_proj.weight": normal(h, i),
        })
    return Transformer(cfg, w, max_seq_len)


def run_config(model, drafters, B: int, K: int, prompts, rounds: int, warmup: int,
               device: str) -> dict:
    """Drive the eager and the static drafter in lockstep; time each proposal."""
    from specrt.spec.drafters.base import DraftContext
    from specrt.spec.sampling import SamplingParams

    params = SamplingParams()
    vocab = model.cfg.vocab_size
    histories = [list(p) for p in prompts]
    times = {name: [] for name in drafters}
    mismatched_rounds, first_mismatch = 0, None
    accept = min(2, K)
    for d in drafters.values():
        d.reset(list(range(B)))
    for r in range(1 + warmup + rounds):
        ctx = DraftContext([list(h) for h in histories], [True] * B, [params] * B, [None] * B)
        out = {}
        for name, d in (drafters.items() if r % 2 == 0 else list(drafters.items())[::-1]):
            box = []
            timing.sync(device)
            secs = timing.time_once(lambda: box.append(d.propose(ctx, K)), device)
            out[name] = box[0].tokens.tolist()                       # [B, K]
            if r > warmup:                                           # round 0 is the prompt
                times[name].append(secs)
            d.rollback([accept] * B)
        eager, static = out["eager"], out["static"]
        if eager != static:
            mismatched_rounds += 1
            if first_mismatch is None:
                first_mismatch = {"round": r, "eager": eager, "static": static}
        # Commit the accepted drafts plus one "recovered" token (any deterministic choice):
        # next round, each drafter catches up on exactly that one token.
        for b in range(B):
            histories[b] += eager[b][:accept] + [(eager[b][accept % K] + 1) % vocab]
    row = {"B": B, "K": K, "rounds_timed": rounds, "rounds_checked": 1 + warmup + rounds,
           "drafts_identical": mismatched_rounds == 0, "mismatched_rounds": mismatched_rounds}
    for name in drafters:
        med = timing.median(times[name])
        row[f"{name}_ms_per_propose"] = med * 1e3
        row[f"{name}_ms_per_step"] = med * 1e3 / K
        row[f"{name}_min_ms_per_step"] = min(times[name]) * 1e3 / K
    row["speedup"] = row["eager_ms_per_step"] / row["static_ms_per_step"]
    if first_mismatch is not None:
        row["first_mismatch"] = first_mismatch
    return row


def sweep(model, shapes: dict, batches, ks, args, repeats: int, device: str, max_seq: int,
          floor_ms: float) -> list[dict]:
    """One row per (B, K): eager vs static drafter on the same prompts."""
    import torch

    from specrt.spec.drafters.draft_model import DraftModelDrafter

    gen = torch.Generator().manual_seed(0)
    rows = []
    for B in batches:
        # the eager drafter drafts all K too (no draft_stop), as the static one always does
        drafters = {"eager": DraftModelDrafter(model, shapes["vocab_size"], B, max_seq,
                                               static=False, stop_below=0.0),
                    "static": DraftModelDrafter(model, shapes["vocab_size"], B, max_seq,
                                                static=True)}
        for K in ks:
            prompts = torch.randint(0, shapes["vocab_size"], (B, args.prefix),
                                    generator=gen).tolist()
            row = run_config(model, drafters, B, K, prompts, repeats, args.warmup, device)
            row["graphs_captured"] = sum(
                loop.graph is not None for loop in drafters["static"]._loops.values())
            for name in ("eager", "static"):
                row[f"{name}_x_floor"] = row[f"{name}_ms_per_step"] / floor_ms
            rows.append(row)
            print(f"B={B} K={K}: eager {row['eager_ms_per_step']:.3f} ms/step, static "
                  f"{row['static_ms_per_step']:.3f} ms/step, drafts identical: "
                  f"{row['drafts_identical']}", flush=True)
        del drafters
        gc.collect()
    return rows


def print_report(rows: list[dict], repeats: int, static_label: str, wb: int,
                 copy_gbps: float, floor_ms: float) -> bool:
    """The per-step table and any mismatches; -> whether every draft was identical."""
    print()
    print(f"ms per draft step (median of {repeats} proposals / K); static = {static_label}; "
          f"floor = {wb / 1e9:.3f} GB / {copy_gbps:,.0f} GB/s = {floor_ms:.4f} ms")
    print(report.table(
        ["B", "K", "eager ms", "static ms", "speedup", "eager x floor", "static x floor",
         "same drafts"],
        [[r["B"], r["K"], f"{r['eager_ms_per_step']:.3f}", f"{r['static_ms_per_step']:.3f}",
          f"{r['speedup']:.2f}x", f"{r['eager_x_floor']:.1f}x", f"{r['static_x_floor']:.1f}x",
          report.pass_fail(r["drafts_identical"])] for r in rows]))
    identical = all(r["drafts_identical"] for r in rows)
    if not identical:
        for r in rows:
            if "first_mismatch" in r:
                print(f"MISMATCH B={r['B']} K={r['K']}: {r['mismatched_rounds']} of "
                      f"{r['rounds_checked']} rounds differ; first: {r['first_mismatch']}")
    print()
    return identical


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    args.threads = args.threads or (1 if args.quick else 2)
    torch = cli.setup_torch(args.threads, args.device or "cpu")   # fails on cuda w/o CUDA
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    cuda = device.startswith("cuda")
    dtype_name = args.dtype or ("bfloat16" if cuda else "float32")
    dtype = getattr(torch, dtype_name)
    shapes_name = args.shapes or ("tiny" if args.quick or not cuda else "qwen0.5b")
    shapes = TINY if shapes_name == "tiny" else QWEN_05B
    repeats = args.repeats or (5 if args.quick else 30)
    batches = cli.positive_ints(args.batches, "--batches")
    ks = cli.positive_ints(args.ks, "--ks")
    if args.prefix < 1 or repeats < 1 or args.warmup < 1:
        cli.fail("--prefix, --repeats and --warmup must be >= 1")
    static_label = "cuda graph" if cuda else "static-eager (CPU: no CUDA graph)"

    info = machine.machine_info(args.threads, device)
    rounds_total = 1 + args.warmup + repeats
    max_seq = args.prefix + rounds_total * (max(ks) + 1) + max(ks) + 8
    report.print_header("draft loop: eager vs CUDA graph, per draft step", info, {
        "shapes": shapes_name, "dtype": dtype_name, "device": device, "B": batches, "K": ks,
        "P": args.prefix, "repeats": repeats, "warmup": args.warmup, "static": static_label})

    t0 = time.perf_counter()
    model = random_model(shapes, dtype, device, max_seq)
    timing.sync(device)
    build_s = time.perf_counter() - t0
    copy_bytes = (1 << 30) if cuda else (1 << 26)
    copy_gbps = timing.copy_bandwidth(device, copy_bytes, repeats=10 if cuda else 5)
    wb = model.weight_bytes
    floor_ms = wb / (copy_gbps * 1e9) * 1e3
    print(f"model: {shapes_name} {dtype_name} on {device}, {wb / 1e9:.3f} GB of weights read "
          f"per step (built in {build_s:.1f} s)")
    print(f"copy bandwidth: {copy_gbps:,.1f} GB/s (read + write of {copy_bytes >> 20} MiB); "
          f"weight-read floor per step: {floor_ms:.4f} ms")
    print(flush=True)

    rows = sweep(model, shapes, batches, ks, args, repeats, device, max_seq, floor_ms)
    identical = print_report(rows, repeats, static_label, wb, copy_gbps, floor_ms)

    out = cli.out_dir(args)
    report.emit_json({
        "benchmark": "graphs", "machine": info,
        "config": {"shapes": shapes_name, **shapes, "dtype": dtype_name, "device": device,
                   "static": static_label, "P": args.prefix, "repeats": repeats,
                   "warmup": args.warmup},
        "weight_bytes": wb, "copy_bandwidth_gbps": round(copy_gbps, 2),
        "floor_ms_per_step": round(floor_ms, 5), "drafts_identical": identical,
        "rows": [{k: (round(v, 5) if isinstance(v, float) else v) for k, v in r.items()}
                 for r in rows],
    }, Path(out) / "graphs.json")
    return 0 if identical else 1


if __name__ == "__main__":
    raise SystemExit(main())
