"""Benchmark: a bf16 model's passes on AMX-BF16 tiles against the AVX-512 kernels.

Run: python -m benchmarks.bf16_amx [--tokens 1,2,3,5,9,17,32,64] [--rounds N] [--with-draft]

Loads the target in bf16 twice in one process, once packed for AMX tiles
(`CpuNative(amx=True)`, `specrt.kernels.cpu.gemv_amx`) and once on the AVX-512 kernels
(`amx=False`), checks that each gives a verify pass the logits of its decode steps, then times
one forward of T new tokens after a 60-token prefix (a decode step at T = 1, a verify pass of
K = T - 1 drafts, past 32 a prompt's), the two copies alternating in each round. Prints
median ms per pass, each pass in decode steps of its own copy, and the median of the per-round
ratios AMX / AVX-512. --with-draft does the same for the draft model in bf16. JSON on the last
line.

With --generate it runs the default pair through `LLM` twice instead (the bf16 target on the
tiles and on the AVX-512 kernels, the int8 draft alike in both), greedy, on the first prompt of
each task of --prompts, plain and every --methods setting, the two alternating per request; prints
decode-only tokens/s and each speculative output's agreement with its own build's plain one.
"""
from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from benchmarks.harness import cli, machine, report, timing
from benchmarks.harness.model_dirs import resolve_models

PROMPTS = Path(__file__).parent / "prompts.json"


def build_parser() -> argparse.ArgumentParser:
    p = cli.parser("benchmarks.bf16_amx", __doc__)
    cli.add_common_args(p, out=False, dtype=False, device=False)     # bf16 on the CPU only
    p.add_argument("--tokens", default="1,2,3,5,9,17,32,64",
                   help="new tokens per pass, comma-separated (default 1,2,3,5,9,17,32,64)")
    p.add_argument("--rounds", type=cli.count, default=5, help="interleaved rounds (default 5)")
    p.add_argument("--with-draft", action="store_true",
                   help="also the draft model in bf16 (default: the target only)")
    p.add_argument("--generate", action="store_true",
                   help="whole requests through LLM instead of single passes")
    p.add_argument("--methods", default="draft_model:4,ngram:8,auto:16",
                   help="with --generate: METHOD:K settings run beside plain (default "
                   "draft_model:4,ngram:8,auto:16)")
    p.add_argument("--prompts", default=str(PROMPTS),
                   help="with --generate: the prompts file (default benchmarks/prompts.json)")
    p.add_argument("--max-new-tokens", type=cli.count, default=64,
                   help="with --generate: tokens per request (default 64)")
    return p


def generate(args) -> int:
    """--generate: the default pair's requests, the target on the tiles against the kernels."""
    from benchmarks.e2e_plan import load_prompts, prompt_tasks
    from specrt import LLM
    from specrt.kernels.cpu import gemv_amx

    specs = {"plain": None}               # each output is checked against its plain one
    for name, k in cli.method_ks(args.methods, "--methods", ("draft_model", "ngram", "auto")):
        specs[f"{name}:{k}"] = {"method": name, "num_speculative_tokens": k}
    methods = list(specs)
    prompts = load_prompts(args.prompts, tuple(prompt_tasks(args.prompts)), 1)
    target_dir, draft_dir = resolve_models(args, need_draft=True)
    llms = {}
    for amx in (True, False):          # CpuNative(amx=None) reads gemv_amx.AVAILABLE
        saved, gemv_amx.AVAILABLE = gemv_amx.AVAILABLE, amx
        try:
            llms[amx] = LLM(str(target_dir), draft=str(draft_dir) if draft_dir else None)
        finally:
            gemv_amx.AVAILABLE = saved
    info = machine.machine_info(args.threads, "cpu")
    report.print_header("requests: bf16 target on AMX tiles vs AVX-512 kernels", info,
                        {"methods": ",".join(methods), "max_new_tokens": args.max_new_tokens,
                         "rounds": args.rounds, "prompts": args.prompts})
    ids = {}
    for p in prompts:
        text = p.text if isinstance(p.text, str) else None
        msgs = None if text is not None else [{"role": r, "content": c} for r, c in p.text]
        ids[p.id] = llms[True].encode(messages=msgs or [{"role": "user", "content": text}])
    for llm in llms.values():          # draft loaded and auto's costs calibrated, untimed
        llm.prepare(speculative=next((s for s in specs.values() if s), None))
        if any(s and s["method"] == "auto" for s in specs.values()):
            llm.cost_model()
    speed = {(p.id, m, amx): [] for p in prompts for m in methods for amx in llms}
    outs = {}
    for r in cli.progress(range(args.rounds), desc="rounds", disable=args.no_progress):
        for p in prompts:
            for m in methods:
                for amx in ((True, False) if r % 2 == 0 else (False, True)):
                    res = llms[amx].generate(ids[p.id], max_new_tokens=args.max_new_tokens,
                                             speculative=specs[m])
                    speed[(p.id, m, amx)].append(timing.decode_speed(res))
                    outs[(p.id, m, amx)] = res.token_ids
    rows, out = [], {}
    for p in prompts:
        for m in methods:
            a = statistics.median(speed[(p.id, m, True)])
            b = statistics.median(speed[(p.id, m, False)])
            same = [outs[(p.id, m, amx)] == outs[(p.id, "plain", amx)] for amx in llms]
            rows.append((p.task, m, f"{b:.2f}", f"{a:.2f}", f"{a / b:.2f}",
                         "yes" if all(same) else "NO"))
            out[f"{p.task}:{m}"] = {"avx512_tok_s": b, "amx_tok_s": a, "same_as_plain": same}
    print(report.markdown_table(("task", "method", "AVX-512 tok/s", "AMX tok/s", "AMX / AVX-512",
                                 "== plain (both)"), rows, "llrrrl"))
    report.emit_json({"rounds": args.rounds, "max_new_tokens": args.max_new_tokens,
                      "requests": out})
    return 0 if all(r[-1] == "yes" for r in rows) else 1


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    tokens = sorted({1, *cli.positive_ints(args.tokens, "--tokens")})   # 1: the step
    from specrt.kernels.cpu import gemv_amx

    if not gemv_amx.AVAILABLE:
        cli.fail("no AMX-BF16 here (or SPECRT_AMX=0, or the kernels are not built): "
                 "nothing to compare")
    if args.generate:
        return generate(args)
    import torch

    from specrt.model.backends.cpu_native import CpuNative
    from specrt.model.transformer import Transformer

    cli.setup_torch(args.threads, "cpu")
    target_dir, draft_dir = resolve_models(args, need_draft=args.with_draft)
    dirs = {"target": target_dir, **({"draft": draft_dir} if args.with_draft else {})}
    prefix, room = 60, 60 + max(tokens) + 1
    models = {(name, amx): Transformer.from_dir(d, "bfloat16", "cpu", room,
                                                backend=CpuNative(amx=amx))
              for name, d in dirs.items() for amx in (True, False)}
    info = machine.machine_info(args.threads, "cpu")
    report.print_header("bf16 passes: AMX tiles vs AVX-512 kernels", info,
                        {"models": ", ".join(d.name for d in dirs.values()),
                         "prefix": prefix, "rounds": args.rounds})
    ids = torch.randint(100, 20000, (1, room), generator=torch.Generator().manual_seed(0))
    caches = {k: m.new_cache(1, room) for k, m in models.items()}
    for k, m in models.items():
        m.forward(ids[:, :prefix], caches[k])
        whole = m.forward(ids[:, prefix:prefix + 5], caches[k])
        caches[k].truncate([prefix])
        steps = torch.cat([m.forward(ids[:, prefix + t:prefix + t + 1], caches[k])
                           for t in range(5)], 1)
        if not torch.equal(whole, steps):
            cli.fail(f"{k[0]} ({'AMX' if k[1] else 'AVX-512'}): a verify pass differs from its "
                     "decode steps")
        caches[k].truncate([prefix])

    def seconds(key, t: int) -> float:
        cache = caches[key]
        elapsed = timing.time_once(lambda: models[key].forward(ids[:, prefix:prefix + t], cache))
        cache.truncate([prefix])
        return elapsed

    times = {(k, t): [] for k in models for t in tokens}
    for key in models:
        seconds(key, 1)                                                   # warm-up
    for r in cli.progress(range(args.rounds), desc="rounds", disable=args.no_progress):
        for name in dirs:
            for t in tokens:
                for amx in ((True, False) if r % 2 == 0 else (False, True)):
                    times[((name, amx), t)].append(seconds((name, amx), t) * 1e3)
    rows, out = [], {}
    for name in dirs:
        step = {amx: statistics.median(times[((name, amx), 1)]) for amx in (True, False)}
        for t in tokens:
            a, b = times[((name, True), t)], times[((name, False), t)]
            ratio = statistics.median(x / y for x, y in zip(a, b))
            ma, mb = statistics.median(a), statistics.median(b)
            rows.append((name, t, f"{mb:.1f}", f"{mb / step[False]:.2f}", f"{ma:.1f}",
                         f"{ma / step[True]:.2f}", f"{ratio:.2f}"))
            out[f"{name}:{t}"] = {"avx512_ms": mb, "amx_ms": ma, "amx_over_avx512": ratio}
    print(report.markdown_table(("model", "tokens", "AVX-512 ms", "steps", "AMX ms", "steps",
                                 "AMX / AVX-512 (paired)"), rows, "lrrrrrr"))
    report.emit_json({"rounds": args.rounds, "prefix": prefix, "passes": out})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
