"""Benchmark: what does verifying T tokens in one pass cost, compared with one decode step?

Run: python -m benchmarks.verify_vs_step [--quick]     (--help for the knobs)

For the target and the draft of the default pair (or --model / --draft): with a KV cache that
holds a P-token prefix (P = 200 and 2000; --quick: 200 only), time one `Transformer.forward`
of T new tokens, T in {1, 2, 4, 8, 16, 17}, exactly as the engine calls it (full logits,
all rows valid). Median of --repeats (default 10; --quick: 5) repeats after warm-up, the T
values taking turns within each repeat (so the ratio to T = 1 is paired: the median of each
repeat's ratio), the cache rolled back to P before every forward (`cache.truncate`); CUDA events
on CUDA. The prefix is a real prefill of seeded random token ids. Reports ms and the ratio
to T = 1 (the seed study: 17 tokens cost 1.2x one token on a GPU), the draft-step / target-step cost
ratio (the seed study: 9.9 / 30.9 ms = 0.32), a PNG of latency vs T, and JSON on the last line.
For bf16 weights on the CPU (off AMX tiles) each pass is also priced against its floor,
max(reading the weights once, its flops at the dot-product peak), both probes timed in every
repeat beside the passes (`specrt.kernels.cpu.bandwidth`, `specrt.kernels.cpu.compute`): which
one holds it, and how far above it the pass runs.
"""
from __future__ import annotations

import argparse
import gc
import time

from benchmarks.harness import cli, machine, model_dirs, plots, report, results, timing

SECTION = "## Verify cost vs T (benchmarks/verify_vs_step.py)"
TS = (1, 2, 4, 8, 16, 17)


def build_parser() -> argparse.ArgumentParser:
    p = cli.parser("benchmarks.verify_vs_step", __doc__,
                   epilog=__doc__.split("\n\n", 2)[2])
    cli.add_common_args(p)
    p.add_argument("--no-draft", action="store_true", help="time the target only")
    p.add_argument("--prefix", default="200,2000", help="prefix lengths P (default 200,2000)")
    p.add_argument("--tokens", default=",".join(map(str, TS)),
                   help="new-token counts T (default 1,2,4,8,16,17)")
    p.add_argument("--repeats", type=cli.count, default=10,
                   help="timed repeats per cell (default 10)")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--quick", action="store_true", help="P = 200 only, 5 repeats")
    cli.add_record_args(p)
    return p


def time_model(name: str, model_dir, args, prefixes, ts, show: bool) -> list[dict]:
    import torch

    from specrt.errors import SpecrtError
    from specrt.kernels.cpu import bandwidth, compute
    from specrt.model import Transformer

    max_seq = max(prefixes) + max(ts) + 1
    try:
        model = Transformer.from_dir(model_dir, args.dtype, args.device, max_seq_len=max_seq)
    except SpecrtError as e:
        cli.fail(str(e))
    cache = model.new_cache(1, max_seq)
    roofline = has_floors(args, model)
    weights = bandwidth.weight_tensors(model) if roofline else []
    gen = torch.Generator().manual_seed(0)
    vocab = model.cfg.vocab_size
    rows = []
    bar = cli.progress(total=len(prefixes) * len(ts), desc=name, disable=not show)
    for P in prefixes:
        cache.reset()
        prefix = torch.randint(0, vocab, (1, P), generator=gen).to(model.device)
        t0 = time.perf_counter()
        model.forward(prefix, cache, last_only=True)              # the real prefill
        timing.sync(args.device)
        prefill_s = time.perf_counter() - t0
        # The T values take turns within each repeat, so a change in the machine's speed
        # (other tenants) hits every T alike and the ratios to T = 1 stay paired.
        inputs = {T: torch.randint(0, vocab, (1, T), generator=gen).to(model.device) for T in ts}
        times = {T: [] for T in ts}
        floors = []                   # per repeat: (read seconds, peak flop/s), or nothing
        for rep in range(args.warmup + args.repeats):
            bar.set_postfix_str(f"P={P} repeat {rep + 1}")
            for T in ts:
                cache.truncate([P])
                dt = timing.measure(lambda: model.forward(inputs[T], cache), 1, warmup=0,
                                    device=args.device)[0]
                if rep >= args.warmup:
                    times[T].append(dt)
            if roofline and rep >= args.warmup:     # the floors, timed beside the passes
                floors.append((bandwidth.read_seconds(weights, args.threads),
                               compute.peak_flops(args.threads, repeats=1)))
        for T in ts:
            ratios = [a / b for a, b in zip(times[T], times[1])]     # main() always adds T = 1
            row = {"model": name, "P": P, "T": T, "ms": timing.median(times[T]) * 1e3,
                   "min_ms": min(times[T]) * 1e3, "max_ms": max(times[T]) * 1e3,
                   "repeats": len(times[T]), "prefill_s": prefill_s,
                   "ratio_to_T1": timing.median(ratios)}
            if floors:
                row.update(_against_floors(times[T], floors, compute.pass_flops(model.cfg, T, P)))
            rows.append(row)
            bar.update(1)
    bar.close()
    wb = model.weight_bytes
    for r in rows:
        r["weight_bytes"] = wb
    del model, cache
    gc.collect()
    return rows


def has_floors(args, model) -> bool:
    """Whether a pass of `model` is priced against its floors: bf16 weights on the CPU, with
    the C++ probes, and not on AMX tiles (which multiply faster than the compute probe)."""
    import torch

    from specrt.kernels.cpu import compute

    return (args.device == "cpu" and compute.AVAILABLE and not compute.amx()
            and model.dtype == torch.bfloat16 and model.quant is None and model.head_rows is None)


def _against_floors(times: list[float], floors: list[tuple[float, float]], flops: float
                    ) -> dict:
    """A pass's times against its floors in the same repeats: max(reading the weights once,
    its flops at the compute probe's rate), and their sum (a pass at 1.0x the sum overlaps
    none of its reading with its products; one at its floor, all). The median of each
    repeat's ratio to each, which floor held it in most repeats ("read" or "compute"), and
    its flop rate at the median time."""
    bound = [max(read, flops / peak) for read, peak in floors]
    both = [read + flops / peak for read, peak in floors]
    held = [("compute" if flops / peak > read else "read") for read, peak in floors]
    return {"over_floor": timing.median([t / b for t, b in zip(times, bound)]),
            "over_sum": timing.median([t / b for t, b in zip(times, both)]),
            "held_by": max(set(held), key=held.count),
            "gflops": flops / timing.median(times) / 1e9,
            "floor_read_ms": timing.median([r for r, _ in floors]) * 1e3,
            "peak_gflops": timing.median([p for _, p in floors]) / 1e9}


def tables(by: dict, names: list[str], prefixes, ts) -> tuple[list[str], list, list]:
    """(headers, ms rows, ratio-to-T=1 rows); `by`: (model, P, T) -> row."""
    headers = ["model", "P"] + [f"T={t}" for t in ts]
    ms_rows = [[n, P] + [f"{by[(n, P, t)]['ms']:.1f}" for t in ts]
               for n in names for P in prefixes]
    ratio_rows = [[n, P] + [f"{by[(n, P, t)]['ratio_to_T1']:.2f}x" for t in ts]
                  for n in names for P in prefixes]
    return headers, ms_rows, ratio_rows


def floor_rows(by: dict, names: list[str], prefixes, ts) -> list:
    """Rows of each pass's time over its floor ("1.31x r": held by the read, "c": by
    compute), over the floors' sum, and its flop rate, for the models priced against their
    floors."""
    return [[n, P] + [f"{by[(n, P, t)]['over_floor']:.2f}x {by[(n, P, t)]['held_by'][0]} "
                      f"{by[(n, P, t)]['over_sum']:.2f}x {by[(n, P, t)]['gflops']:.0f}"
                      for t in ts]
            for n in names for P in prefixes if "over_floor" in by[(n, P, ts[0])]]


def floors_text(by: dict, names: list[str], prefixes) -> list[str]:
    """One line per model: its floors' medians."""
    return [f"{n}: reading the weights once {by[(n, P, 1)]['floor_read_ms']:.1f} ms, "
            f"the dot-product peak {by[(n, P, 1)]['peak_gflops']:.0f} GFLOP/s"
            for n in names for P in prefixes[:1] if "over_floor" in by[(n, P, 1)]]


def step_ratios(by: dict, names: list[str], prefixes) -> dict:
    """{P: draft step ms / target step ms} (empty without a draft)."""
    if "draft" not in names:
        return {}
    return {P: by[("draft", P, 1)]["ms"] / by[("target", P, 1)]["ms"] for P in prefixes}


def print_report(by: dict, prefixes, headers, ms_rows, ratio_rows, step_ratio: dict,
                 info: dict, floors: list) -> None:
    """The tables (the floors' where measured), the draft/target step ratios and weight bytes,
    the load at the end."""
    print("median ms per forward of T new tokens (KV cache holding P tokens)")
    print(report.table(headers, ms_rows))
    print()
    print("ratio to T = 1 (seed study, 3B on a GPU: T = 17 costs 1.2x T = 1)")
    print(report.table(headers, ratio_rows))
    print()
    if floors:
        print("over the floor, max(read the weights once, flops at the dot-product peak), "
              "median of each repeat's ratio; r / c: held by the read / by compute; over the "
              "floors' sum (1.00x: no overlap); GFLOP/s")
        print(report.table(headers, floors))
        print("\n".join(floors_text(by, list(dict.fromkeys(r[0] for r in floors)), prefixes)))
        print()
    for P, ratio in step_ratio.items():
        print(f"draft step / target step at P={P}: {by[('draft', P, 1)]['ms']:.1f} / "
              f"{by[('target', P, 1)]['ms']:.1f} ms = {ratio:.2f} "
              "(seed study 9.9 / 30.9 ms = 0.32)")
    if step_ratio:
        wb_t = by[("target", prefixes[0], 1)]["weight_bytes"]
        wb_d = by[("draft", prefixes[0], 1)]["weight_bytes"]
        print(f"weight bytes per step: draft / target = {wb_d / 1e9:.2f} / {wb_t / 1e9:.2f} GB "
              f"= {wb_d / wb_t:.2f}")
    print(f"load average at the end: {info['load_average_end']}")
    print()


def plot(by: dict, names: list[str], prefixes, ts, args, path):
    plt = plots.pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for n in names:
        for P in prefixes:
            ax.plot(ts, [by[(n, P, t)]["ms"] for t in ts], marker="o", label=f"{n}, P={P}")
    ax.set_xlabel("new tokens T in one forward")
    ax.set_ylabel("median ms")
    ax.set_xticks(ts)
    ax.set_ylim(bottom=0)
    ax.set_title(f"Forward latency vs T ({args.dtype}, {args.device}, {args.threads} threads)")
    ax.grid(alpha=0.3)
    ax.legend()
    return plots.save_figure(fig, path)


def markdown(args, info, target_dir, draft_dir, png, headers, ms_rows, ratio_rows,
             step_ratio: dict, floors: list, floor_lines: list[str]) -> str:
    """The body of this benchmark's RESULTS.md section."""
    return "\n".join([
        report.results_preamble(info, args.note),
        f"Models: target `{target_dir.name}`"
        + (f", draft `{draft_dir.name}`" if draft_dir else "") + f", {args.dtype}, "
        f"{args.device}. Median of {args.repeats} repeats after {args.warmup} warm-up, the T "
        "values interleaved in each repeat; ratios: the median of each repeat's ratio; "
        f"load average at the end: {info['load_average_end'][0]:.2f}.",
        "",
        results.image(png, "verify vs step"),
        "",
        "Median ms per forward of T new tokens with P tokens in the cache:",
        "",
        report.markdown_table(headers, ms_rows),
        "",
        "Ratio to T = 1 (seed study, 3B on a GPU: T = 17 costs 1.2x):",
        "",
        report.markdown_table(headers, ratio_rows),
        "",
    ] + ([
        "Over the floor, max(reading the weights once, the pass's flops at the dot-product "
        "peak of `specrt.kernels.cpu.compute`), each timed beside the passes (the median of "
        "each repeat's ratio; r / c: held by the read / by compute; then over the floors' "
        "sum, where 1.00x overlaps none of the reading with the products; then GFLOP/s):",
        "",
        report.markdown_table(headers, floors),
        "",
    ] + [f"- {line}." for line in floor_lines] + [""] if floors else []) + [
        f"- Draft step / target step at P={P}: **{v:.2f}** (seed study 0.32)."
         for P, v in step_ratio.items()])


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.quick:
        args.prefix, args.repeats = "200", min(args.repeats, 5)
    prefixes = cli.positive_ints(args.prefix, "--prefix")
    ts = cli.positive_ints(args.tokens, "--tokens")
    if 1 not in ts:
        ts = [1] + ts
    if args.repeats < 1:
        cli.fail("--repeats must be >= 1")
    cli.setup_torch(args.threads, args.device)
    target_dir, draft_dir = model_dirs.resolve_models(args, need_draft=not args.no_draft)
    out = cli.out_dir(args)
    info = machine.machine_info(args.threads, args.device)
    report.print_header("verify pass of T tokens vs one decode step", info, {
        "target": target_dir.name, "draft": draft_dir.name if draft_dir else None,
        "dtype": args.dtype, "P": prefixes, "T": ts, "repeats": args.repeats,
        "warmup": args.warmup})

    models = [("target", target_dir)] + ([("draft", draft_dir)] if draft_dir else [])
    rows = []
    for name, d in models:
        rows += time_model(name, d, args, prefixes, ts, not args.no_progress)
    info["load_average_end"] = list(machine.load_average())

    by = {(r["model"], r["P"], r["T"]): r for r in rows}
    names = [n for n, _ in models]
    headers, ms_rows, ratio_rows = tables(by, names, prefixes, ts)
    step_ratio = step_ratios(by, names, prefixes)
    floors = floor_rows(by, names, prefixes, ts)
    print_report(by, prefixes, headers, ms_rows, ratio_rows, step_ratio, info, floors)
    png = plot(by, names, prefixes, ts, args, out / "verify_vs_step.png")
    if args.record:
        report.record_section(SECTION, markdown(args, info, target_dir, draft_dir, png, headers,
                                                ms_rows, ratio_rows, step_ratio, floors,
                                                floors_text(by, names, prefixes)),
                              args.results_md)

    report.emit_json({
        "benchmark": "verify_vs_step", "machine": info,
        "config": {"target": str(target_dir), "draft": str(draft_dir) if draft_dir else None,
                   "dtype": args.dtype, "P": prefixes, "T": ts, "repeats": args.repeats,
                   "warmup": args.warmup},
        "rows": [{k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()}
                 for r in rows],
        "draft_over_target_step": {str(P): round(v, 4) for P, v in step_ratio.items()},
        "plot": str(png),
    }, out / "verify_vs_step.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
