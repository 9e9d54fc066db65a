"""Benchmark: the AVX2 kernels against the PyTorch path a CPU without AVX-512 ran before them.

Run: python -m benchmarks.cpu_avx2 [--rounds N] [--max-new-tokens N]     (--help for the knobs)

On a CPU with AVX2 but no AVX-512 BF16 (most AMD Zen 2/3 and client Intel parts), specrt's C++
kernels used to be off: the model ran PyTorch's ops (`torch_ref`) and `dtype="auto"` chose
float32 there. Now the kernels run at the AVX2 level (csrc/cpu/gemv_avx2.cpp,
gemv_int8_avx2.cpp, ops_impl.h over simd.h). Two parts, each interleaved within one process so
the machine's drift hits every configuration alike:

1. steps: median ms of a decode step, a 5-token verify pass (position ~130) and a 128-token
   prefill per token, for the target and the draft, the old way (torch_ref; fp32 = the old
   default, bf16) and the new (cpu_native bf16; the draft also int8, the new default, both
   drafts scoring the default shortlist as `LLM` loads them);
2. end to end: the default pair as `LLM` loads it the old way (SPECRT_BACKEND=torch_ref,
   dtype float32) and the new way (the defaults), greedy, chat template, the first prompt of
   each task of benchmarks/prompts.json, plain / draft_model:3 / auto; decode-only tokens/s
   (after the prompt's pass) and whether the output equals plain greedy of the same engine.

Writes the section "AVX2 kernels" of benchmarks/RESULTS.md (--no-record to skip); JSON on the
last line.
"""
from __future__ import annotations

import os
import statistics
import time
from pathlib import Path
from unittest import mock

from benchmarks import e2e_plan
from benchmarks.harness import cli, machine, report, timing
from benchmarks.harness.model_dirs import resolve_with_draft

SECTION = "## AVX2 kernels (benchmarks/cpu_avx2.py)"
METHODS = (("plain", None),
           ("draft_model:3", {"method": "draft_model", "num_speculative_tokens": 3}),
           ("auto", {"method": "auto", "num_speculative_tokens": 8}))


def build_parser():
    p = cli.parser("benchmarks.cpu_avx2", __doc__)
    cli.add_common_args(p, out=False, dtype=False, device=False)   # bf16 on the CPU only
    cli.add_record_args(p)
    p.add_argument("--rounds", type=cli.count, default=3,
                   help="interleaved rounds of part 1 (median)")
    p.add_argument("--max-new-tokens", type=cli.count, default=64, help="part 2's answer length")
    p.add_argument("--skip-e2e", action="store_true", help="part 1 only")
    return p


def _step_times(model, torch) -> tuple[float, float, float]:
    """(prefill seconds per token over 128 tokens, decode step, verify pass of 5 tokens)."""
    cache = model.new_cache(1, 512)
    t0 = time.perf_counter()
    model.forward(torch.arange(100, 228)[None], cache, last_only=True)
    prefill = (time.perf_counter() - t0) / 128
    token = torch.tensor([[42]])
    t0 = time.perf_counter()
    for _ in range(5):
        model.forward(token, cache)
    step = (time.perf_counter() - t0) / 5
    t0 = time.perf_counter()
    for _ in range(3):
        model.forward(torch.arange(300, 305)[None], cache)
    verify = (time.perf_counter() - t0) / 3
    return prefill, step, verify


def steps(args, target_dir, draft_dir) -> tuple[str, dict]:
    import torch

    from specrt.api.tokenizer import Tokenizer
    from specrt.model.transformer import Transformer
    from specrt.model.config import ModelConfig
    from specrt.spec.drafters.draft_model import draft_head_rows

    load = Transformer.from_dir
    ref = {"backend": "torch_ref"}
    models = {"target fp32, torch_ref (old default)": load(target_dir, "float32", "cpu", 512,
                                                           **ref),
              "target bf16, torch_ref": load(target_dir, "bfloat16", "cpu", 512, **ref),
              "target bf16, AVX2 kernels (new default)": load(target_dir, "bfloat16", "cpu", 512)}
    head = draft_head_rows(ModelConfig.from_dir(draft_dir), Tokenizer(target_dir))
    models |= {"draft fp32, torch_ref (old default)": load(draft_dir, "float32", "cpu", 512,
                                                           head_rows=head, **ref),
               "draft bf16, AVX2 kernels": load(draft_dir, "bfloat16", "cpu", 512, head_rows=head),
               "draft int8, AVX2 kernels (new default)": load(draft_dir, "bfloat16", "cpu", 512,
                                                              quant="int8", head_rows=head)}
    times = {name: [] for name in models}
    with torch.inference_mode():
        for r in cli.progress(range(args.rounds), desc="step rounds", disable=args.no_progress):
            order = list(models) if r % 2 == 0 else list(reversed(models))
            for name in order:
                times[name].append(_step_times(models[name], torch))
    med = {name: [statistics.median(t[i] for t in v) * 1e3 for i in range(3)]
           for name, v in times.items()}
    rows = [(name, f"{p:.1f}", f"{s:.1f}", f"{v:.1f}", f"{v / s:.2f}")
            for name, (p, s, v) in med.items()]
    text = report.markdown_table(("model", "prefill ms/token", "decode step ms", "verify(5) ms",
                                  "verify(5) / step"), rows, "lrrrr")
    t_old = med["target fp32, torch_ref (old default)"]
    t_new = med["target bf16, AVX2 kernels (new default)"]
    d_old = med["draft fp32, torch_ref (old default)"]
    d_new = med["draft int8, AVX2 kernels (new default)"]
    d_bf16 = med["draft bf16, AVX2 kernels"]
    ratios = {"target decode step, old / new": t_old[1] / t_new[1],
              "target prefill, old / new": t_old[0] / t_new[0],
              "draft step / target step, old defaults": d_old[1] / t_old[1],
              "draft step / target step, new defaults (int8 draft)": d_new[1] / t_new[1],
              "draft step / target step, bf16 draft, AVX2 kernels": d_bf16[1] / t_new[1]}
    text += "\n\n" + "\n".join(f"- {k}: {v:.3f}" for k, v in ratios.items())
    return text, {"ms": med, "ratios": ratios}


def _engine(old: bool, target_dir, draft_dir):
    import specrt

    # the backend is chosen when the models load: inside the first generate
    with mock.patch.dict(os.environ, {"SPECRT_BACKEND": "torch_ref"} if old else {}):
        kw = dict(dtype="float32", draft_dtype="float32") if old else {}
        llm = specrt.LLM(str(target_dir), draft=str(draft_dir), max_seq_len=1024, **kw)
        llm.generate(llm.encode("Hi", chat=True), max_new_tokens=2)       # loads, calibrates
    return llm


def end_to_end(args, target_dir, draft_dir) -> tuple[str, dict]:
    path = str(Path(__file__).parent / "prompts.json")
    items = e2e_plan.load_prompts(path, tuple(e2e_plan.prompt_tasks(path)), 1)
    if any(not isinstance(item.text, str) for item in items):
        cli.fail(f"{path}: part 2 encodes text prompts; give each item a \"prompt\"")
    engines = {"old": _engine(True, target_dir, draft_dir),
               "new": _engine(False, target_dir, draft_dir)}
    rows, out = [], {}
    for item in cli.progress(items, desc="prompts", disable=args.no_progress):
        task = item.task
        for name in (("old", "new") if len(rows) % 2 == 0 else ("new", "old")):
            llm = engines[name]
            ids = llm.encode(item.text, chat=True)
            plain_ids = None
            for method, spec in METHODS:
                res = llm.generate(ids, max_new_tokens=args.max_new_tokens, speculative=spec)
                tps = timing.decode_speed(res)
                plain_ids = list(res.token_ids) if spec is None else plain_ids
                same = list(res.token_ids) == plain_ids
                out[(task, name, method)] = (tps, same)
        rows.append(task)
    table_rows = []
    for task in rows:
        for method, _ in METHODS:
            o, n = out[(task, "old", method)], out[(task, "new", method)]
            table_rows.append((task, method, f"{o[0]:.2f}", f"{n[0]:.2f}", f"{n[0] / o[0]:.2f}x",
                               "yes" if o[1] and n[1] else "NO"))
    text = report.markdown_table(("task", "method", "old tok/s", "new tok/s", "new / old",
                                  "= plain greedy"), table_rows, "llrrrl")
    mism = sum(not v[1] for v in out.values())
    text += f"\n\nSpeculative outputs differing from plain greedy of their engine: {mism}."
    return text, {f"{t}|{e}|{m}": v for (t, e, m), v in out.items()}


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    cli.setup_torch(args.threads, "cpu")
    from specrt.kernels.cpu import gemv

    target_dir, draft_dir = resolve_with_draft(args, "its steps are measured")
    info = machine.machine_info(args.threads, "cpu")
    report.print_header("AVX2 kernels vs the PyTorch path", info, {"kernel level": gemv.LEVEL})
    if gemv.LEVEL == "avx512":
        print("note: this CPU has AVX-512; set SPECRT_CPU_LEVEL=avx2 to measure the AVX2 level")
    text, js = steps(args, target_dir, draft_dir)
    body = (f"Kernel level: {gemv.LEVEL}. Part 1, median of {args.rounds} interleaved rounds:\n\n"
            + text + "\n")
    print(text)
    if not args.skip_e2e:
        e2e_text, e2e_js = end_to_end(args, target_dir, draft_dir)
        print(e2e_text)
        body += (f"\nPart 2, {args.max_new_tokens} new tokens, decode-only tok/s, old = "
                 "SPECRT_BACKEND=torch_ref dtype=float32 draft_dtype=float32 (what `auto` "
                 "picked on this CPU before), new = the defaults:\n\n" + e2e_text + "\n")
        js["e2e"] = e2e_js
    if args.record:
        report.record_section(SECTION, report.results_preamble(info, args.note) + "\n" + body,
                              Path(args.results_md))
    report.emit_json({"steps": js["ms"], "ratios": js["ratios"],
                     "e2e": {k: v for k, v in js.get("e2e", {}).items()}})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
