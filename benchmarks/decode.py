"""Benchmark: plain greedy decode speed of specrt vs Hugging Face, and vs the memory floor.

Run: python -m benchmarks.decode [--dtypes bfloat16,float32]     (--help for the knobs)

One target model (default: the fetched Qwen2.5-Coder-1.5B-Instruct), a short chat prompt,
N new tokens (default 64), greedy, no speculation, in one process with --threads threads:

- specrt: `LLM.generate`; decode-only speed = (new_tokens - 1) / (seconds - prefill_seconds)
  (the prefill pass makes the first token).
- Hugging Face: `model.generate` of 1 token (prefill) and of N tokens (min_new_tokens = N),
  decode-only speed = (N - 1) / (t_N - t_1).
  The two are interleaved (ABBA order over --repeats rounds) so machine drift cancels; the
  ratio is the median of the per-round ratios.
- The memory-bandwidth floor: a decode step must read every weight once
  (`llm.target.weight_bytes`), so the fastest possible decode is bandwidth / weight_bytes
  tokens/s. The read bandwidth (fp32 `x.sum()` over 1 GiB with the same threads) is measured
  right before each specrt run, because on a shared machine it drifts: readings minutes apart
  have differed by 1.6x. Each round's fraction of the floor pairs the run with its own
  reading; the median is reported, and the readings at the start and end for context.

Goals (printed as PASS/FAIL): bf16 >= 75% of the floor and >= 1.5x Hugging Face;
fp32 >= 1.5x Hugging Face.
"""
from __future__ import annotations

import argparse
import gc
import time

from benchmarks.harness import cli, compare, hf, machine, model_dirs, report, timing

SECTION = "## Decode speed vs Hugging Face (benchmarks/decode.py)"
PROMPT = "Explain in a few paragraphs how a hash table works and why lookups are fast."
GOAL_FLOOR_BF16 = 0.75
GOAL_VS_HF = 1.5


def build_parser() -> argparse.ArgumentParser:
    p = cli.parser("benchmarks.decode", __doc__,
                   epilog=__doc__.split("\n\n", 2)[2])
    cli.add_common_args(p, draft=False, dtype=False)              # --dtypes instead
    p.add_argument("--dtypes", default=None, help="comma-separated dtypes to run "
                   "(default bfloat16,float32)")
    p.add_argument("--new-tokens", type=cli.count, default=64, help="tokens per generation "
                   "(default 64)")
    p.add_argument("--repeats", type=cli.count, default=3, help="interleaved rounds per dtype "
                   "(default 3)")
    p.add_argument("--prompt", default=PROMPT, help="the chat prompt")
    p.add_argument("--no-hf", action="store_true", help="skip Hugging Face (floor only)")
    cli.add_record_args(p)
    return p


def run_dtype(dtype: str, target_dir, args, show: bool) -> dict:
    import specrt
    from specrt.errors import SpecrtError

    n = args.new_tokens
    try:
        llm = specrt.LLM(model=target_dir, draft=None, dtype=dtype, device=args.device,
                         max_seq_len=1024 + n)
        ids = llm.encode(args.prompt, chat=llm.tokenizer is not None
                         and llm.tokenizer.has_chat_template)
    except SpecrtError as e:
        cli.fail(str(e))
    weight_bytes = llm.target.weight_bytes
    hf_model = None if args.no_hf else hf.load(target_dir, dtype, args.device)
    eos = sorted(llm.eos_ids)

    # warm-up: first calls pay for allocation, thread-pool start-up and lazy init
    llm.generate(ids, max_new_tokens=4)
    if hf_model is not None:
        hf.generate(hf_model, ids, 2, eos_ids=eos)

    def run_specrt():
        bw_now = machine.read_bandwidth(args.threads, repeats=3)["gb_per_s"]
        res = llm.generate(ids, max_new_tokens=n)
        s = res.stats
        return {"tok_s": timing.decode_speed(res),
                "new_tokens": s["new_tokens"], "prefill_s": s["prefill_seconds"],
                "seconds": s["seconds"], "ids": res.token_ids, "gb_per_s": bw_now,
                "finish_reason": res.finish_reason}

    def run_hf():
        t1 = timing.time_once(lambda: hf.generate(hf_model, ids, 1, eos_ids=eos), args.device)
        box = {}
        tn = timing.time_once(lambda: box.setdefault("ids", hf.generate(
            hf_model, ids, n, force_length=True, eos_ids=eos)), args.device)
        return {"tok_s": (n - 1) / (tn - t1) if tn > t1 else float("nan"), "prefill_s": t1,
                "seconds": tn, "ids": box["ids"]}

    sp_runs, hf_runs = [], []
    bar = cli.progress(total=args.repeats * (1 if hf_model is None else 2),
                       desc=f"decode {dtype}", disable=not show)
    for r in range(args.repeats):
        order = ["specrt", "hf"] if r % 2 == 0 else ["hf", "specrt"]
        for who in order:
            if who == "hf" and hf_model is None:
                continue
            bar.set_postfix_str(f"round {r + 1} {who}")
            (sp_runs if who == "specrt" else hf_runs).append(run_specrt() if who == "specrt"
                                                             else run_hf())
            bar.update(1)
    bar.close()

    out = summarize_runs(dtype, weight_bytes, len(ids), n, sp_runs, hf_runs)
    del llm, hf_model
    gc.collect()
    return out


def summarize_runs(dtype: str, weight_bytes: int, prompt_tokens: int, n: int,
                   sp_runs: list[dict], hf_runs: list[dict]) -> dict:
    """One dtype's result from its interleaved runs: medians, the floor, the ratio to HF."""
    sp = timing.median([x["tok_s"] for x in sp_runs])
    gb_s = timing.median([x["gb_per_s"] for x in sp_runs])
    floor_tok_s = gb_s * 1e9 / weight_bytes
    out = {
        "dtype": dtype, "weight_bytes": weight_bytes, "prompt_tokens": prompt_tokens,
        "new_tokens": n, "specrt_tok_s": sp,
        "specrt_tok_s_all": [x["tok_s"] for x in sp_runs],
        "specrt_new_tokens": sp_runs[-1]["new_tokens"],
        "specrt_prefill_s": timing.median([x["prefill_s"] for x in sp_runs]),
        "gb_per_s": gb_s, "gb_per_s_all": [x["gb_per_s"] for x in sp_runs],
        "floor_tok_s": floor_tok_s, "floor_ms_per_token": weight_bytes / (gb_s * 1e9) * 1e3,
        "specrt_ms_per_token": 1e3 / sp,
        "fraction_of_floor": timing.median([x["tok_s"] * weight_bytes / (x["gb_per_s"] * 1e9)
                                            for x in sp_runs]),
        "specrt_effective_gb_s": sp * weight_bytes / 1e9,
    }
    if hf_runs:
        hfv = timing.median([x["tok_s"] for x in hf_runs])
        ratios = [a["tok_s"] / b["tok_s"] for a, b in zip(sp_runs, hf_runs)]
        # HF runs with min_new_tokens = n, so where specrt ended at an EOS it cannot: compare
        # the tokens before it
        last = list(sp_runs[-1]["ids"])
        if sp_runs[-1].get("finish_reason") == "eos":
            last = last[:-1]
        diff = compare.first_difference(last, hf_runs[-1]["ids"][: len(last)])
        out.update({"hf_tok_s": hfv, "hf_tok_s_all": [x["tok_s"] for x in hf_runs],
                    "hf_prefill_s": timing.median([x["prefill_s"] for x in hf_runs]),
                    "ratio_vs_hf": timing.median(ratios), "ratio_vs_hf_all": ratios,
                    "same_tokens_as_hf": diff is None, "first_difference_vs_hf": diff})
    return out


HEADERS = ["dtype", "weights GB", "specrt tok/s", "HF tok/s", "specrt/HF", "read GB/s",
           "floor tok/s", "of floor", "specrt ms/tok", "floor ms/tok", "same as HF"]
GOAL_LABELS = {"bf16_ge_75pct_of_floor": "bf16 >= 75% of the bandwidth floor",
               "bf16_ge_1.5x_hf": "bf16 >= 1.5x Hugging Face",
               "fp32_ge_1.5x_hf": "fp32 >= 1.5x Hugging Face"}


def table_rows(results: list[dict]) -> list[list]:
    rows = []
    for r in results:
        same = "-" if "hf_tok_s" not in r else ("yes" if r["same_tokens_as_hf"] else
                                                f"no (from token {r['first_difference_vs_hf']})")
        rows.append([r["dtype"], f"{r['weight_bytes'] / 1e9:.2f}", f"{r['specrt_tok_s']:.2f}",
                     f"{r['hf_tok_s']:.2f}" if "hf_tok_s" in r else "-",
                     f"{r['ratio_vs_hf']:.2f}x" if "ratio_vs_hf" in r else "-",
                     f"{r['gb_per_s']:.1f}", f"{r['floor_tok_s']:.2f}",
                     f"{r['fraction_of_floor']:.0%}",
                     f"{r['specrt_ms_per_token']:.0f}", f"{r['floor_ms_per_token']:.0f}", same])
    return rows


def goals_of(results: list[dict]) -> dict[str, bool]:
    """GOAL_LABELS key -> met."""
    goals = {}
    for r in results:
        if r["dtype"] == "bfloat16":
            goals["bf16_ge_75pct_of_floor"] = r["fraction_of_floor"] >= GOAL_FLOOR_BF16
        if "ratio_vs_hf" in r and r["dtype"] in ("bfloat16", "float32"):
            key = ("bf16" if r["dtype"] == "bfloat16" else "fp32") + "_ge_1.5x_hf"
            goals[key] = r["ratio_vs_hf"] >= GOAL_VS_HF
    return goals


def print_report(args, results: list[dict], goals: dict) -> None:
    print(f"decode-only speed (prefill excluded), {args.new_tokens} new tokens, median of "
          f"{args.repeats} interleaved rounds; read GB/s: median of the readings taken right "
          f"before each specrt run; of floor: median of each run against its own reading")
    print(report.table(HEADERS, table_rows(results)))
    print()
    for k, ok in goals.items():
        print(f"goal: {GOAL_LABELS[k]}: {report.pass_fail(ok)}")
    print()


def markdown(args, info: dict, target_dir, results: list[dict], goals: dict, bw: dict,
             bw_end: dict) -> str:
    """The body of this benchmark's RESULTS.md section."""
    return "\n".join([
        report.results_preamble(info, args.note),
        f"Model `{target_dir.name}`, {args.device}, chat prompt of "
        f"{results[0]['prompt_tokens']} tokens, {args.new_tokens} new tokens, greedy, "
        f"decode-only (prefill excluded), median of {args.repeats} interleaved rounds. Read "
        f"bandwidth ({bw['method']}) measured right before each specrt run (read GB/s: "
        f"their median; of floor: the median of each run against its own reading); "
        f"{bw['gb_per_s']:.1f} GB/s at the start of the benchmark, "
        f"{bw_end['gb_per_s']:.1f} GB/s at the end. Load average at the "
        f"end: {info['load_average_end'][0]:.2f}.",
        "",
        report.markdown_table(HEADERS, table_rows(results)),
        "",
    ] + [f"- Goal {GOAL_LABELS[k]}: **{report.pass_fail(ok)}**" for k, ok in goals.items()])


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    dtypes = [d.strip() for d in (args.dtypes or "bfloat16,float32").split(",") if d.strip()]
    for d in dtypes:
        if d not in ("bfloat16", "float32", "float16"):
            cli.fail(f"unknown dtype {d!r} in --dtypes (bfloat16, float32, float16)")
    if args.new_tokens < 2 or args.repeats < 1:
        cli.fail("--new-tokens must be >= 2 and --repeats >= 1")
    cli.setup_torch(args.threads, args.device)
    target_dir, _ = model_dirs.resolve_models(args, need_draft=False)
    out = cli.out_dir(args)
    info = machine.machine_info(args.threads, args.device)
    report.print_header("plain greedy decode: specrt vs Hugging Face vs the bandwidth floor",
                        info, {"model": target_dir.name, "dtypes": dtypes,
                               "new_tokens": args.new_tokens, "repeats": args.repeats,
                               "hf": not args.no_hf})

    t0 = time.perf_counter()
    bw = machine.read_bandwidth(args.threads)
    print(f"read bandwidth ({bw['method']}, {args.threads} threads): {bw['gb_per_s']:.1f} GB/s "
          f"median, {bw['best_gb_per_s']:.1f} GB/s best", flush=True)
    results = [run_dtype(d, target_dir, args, not args.no_progress) for d in dtypes]
    bw_end = machine.read_bandwidth(args.threads)
    info["load_average_end"] = list(machine.load_average())
    print(f"read bandwidth at the end: {bw_end['gb_per_s']:.1f} GB/s median; load average "
          f"{info['load_average_end']}; {time.perf_counter() - t0:.0f} s in all")
    print()

    goals = goals_of(results)
    print_report(args, results, goals)
    if args.record:
        report.record_section(SECTION, markdown(args, info, target_dir, results, goals, bw,
                                                bw_end), args.results_md)
    report.emit_json({
        "benchmark": "decode", "machine": info,
        "config": {"model": str(target_dir), "dtypes": dtypes, "new_tokens": args.new_tokens,
                   "repeats": args.repeats, "prompt": args.prompt},
        "bandwidth": bw, "bandwidth_end": bw_end,
        "results": [{k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()}
                    for r in results],
        "goals": goals,
    }, out / "decode.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
