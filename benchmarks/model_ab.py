"""Benchmark: one model's forward passes under two builds of specrt, interleaved in one run.

Run: python -m benchmarks.model_ab [--base REV] [--model DIR] [--quant int8] [--rounds N]
                                   [--widths 1,4]

`kernel_ab` times two builds of the matrix products alone; this times what a model does with
them: a decode step, a 4-token pass (a draft's first forward of a round, a short verify pass;
--widths: passes of other widths, such as a target's verify passes of K + 1 tokens) and a
prompt pass of --prompt tokens, through the whole forward (the C++ layer loop, the
attention, the head). The base revision's tree is copied out (git archive) and its extensions
built there (~1-3 min); each build then serves from its own process with the model loaded once,
and the rounds alternate between them (ABBA), so the machine's swings in memory bandwidth hit
both alike. Prints each build's median milliseconds per pass and the median per-round ratio
base / new (> 1: the working tree is faster); JSON on the last line. The two builds' numbers
may differ in their bits (a kernel change that is not bit-identical, such as a new int8
layout): this times them, it does not compare their outputs.

Default: the pair's draft (qwen2.5-coder-0.5b-instruct) in int8 as `LLM` loads it (its
output-head shortlist included).
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.harness import cli, machine, report, revisions


# What each build's process runs: load the model, then time the passes once per line read.
CHILD = r"""
import sys, time, torch
from specrt.api.tokenizer import Tokenizer
from specrt.model.config import ModelConfig
from specrt.model.transformer import Transformer
from specrt.spec.drafters.draft_model import draft_head_rows

model_dir, quant, threads, prompt, widths = sys.argv[1:6]
widths = [int(w) for w in widths.split(",")]
torch.set_num_threads(int(threads))
quant = None if quant == "none" else quant
head = draft_head_rows(ModelConfig.from_dir(model_dir), Tokenizer(model_dir)) if quant else None
model = Transformer.from_dir(model_dir, "bfloat16", "cpu", int(prompt) + 128, quant=quant,
                             head_rows=head)


def timed(tokens, passes):
    cache = model.new_cache(1, int(prompt) + 128)
    model.forward(torch.arange(100, 160)[None], cache)
    ids = torch.arange(200, 200 + tokens)[None]
    t0 = time.perf_counter()
    for _ in range(passes):
        model.forward(ids, cache)
    return (time.perf_counter() - t0) / passes


def prompt_pass():
    cache = model.new_cache(1, int(prompt) + 128)
    t0 = time.perf_counter()
    model.forward(torch.arange(1000, 1000 + int(prompt))[None], cache)
    return time.perf_counter() - t0


# warm-up: a process's first wide pass is ~2x slower
[timed(w, 2) for w in widths], prompt_pass()
# the backend it runs on and its build id: "library" in it names an extension that did not
# load (setup.py skips a failing one), whose part then runs on PyTorch's ops
print("ready", getattr(model.backend, "name", type(model.backend).__name__),
      getattr(model.backend, "build_id", ""), flush=True)
for _ in sys.stdin:
    print(*[timed(w, 20 if w == 1 else 10) for w in widths], prompt_pass(), flush=True)
"""


def build_parser() -> argparse.ArgumentParser:
    p = cli.parser("benchmarks.model_ab", __doc__)
    p.add_argument("--base", default="HEAD~1", help="git revision of build A (default HEAD~1); "
                   "B is the working tree as it is")
    p.add_argument("--model", help="model directory (default: the fetched "
                   "qwen2.5-coder-0.5b-instruct)")
    p.add_argument("--quant", default="int8", choices=["int8", "int4", "none"],
                   help="the model's weights: int8 (default), int4, or none (bf16)")
    p.add_argument("--prompt", type=cli.count, default=252, help="prompt pass tokens (default 252)")
    p.add_argument("--rounds", type=cli.count, default=11, help="interleaved rounds (default 11)")
    p.add_argument("--threads", type=cli.count, default=2, help="torch threads (default 2)")
    p.add_argument("--widths", type=_widths, default=[1, 4],
                   help="comma-separated widths (tokens) of the passes timed besides the "
                        "prompt's (default 1,4: a decode step and a 4-token pass)")
    return p


def _widths(text: str) -> list[int]:
    try:
        widths = [int(w) for w in text.split(",")]
    except ValueError:
        widths = []
    if not widths or min(widths) < 1:
        raise argparse.ArgumentTypeError(f"expected comma-separated token counts >= 1, such as "
                                         f"1,4, got {text!r}")
    return widths


def _pass_name(width: int) -> str:
    return "step" if width == 1 else f"{width}-token pass"


def _start(tree: Path, args, model_dir: Path) -> tuple[subprocess.Popen, str]:
    """The build's process, loaded, and the backend its model runs on (name and build id)."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(model_dir), args.quant,
                             str(args.threads), str(args.prompt),
                             ",".join(map(str, args.widths))],
                            cwd=tree, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    ready, _, backend = proc.stdout.readline().strip().partition(" ")
    if ready != "ready":
        cli.fail(f"the model did not load under {tree}")
    return proc, backend


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    from specrt.hub.paths import model_dir as fetched
    model_dir = Path(args.model) if args.model else fetched("qwen2.5-coder-0.5b-instruct")
    if not (model_dir / "config.json").exists():
        cli.fail(f"{model_dir} has no config.json (python -m specrt.models fetch)")
    info = machine.machine_info(args.threads, "cpu")
    report.print_header("model A/B: one model under two builds", info,
                        {"base": args.base, "model": model_dir.name, "quant": args.quant})
    with tempfile.TemporaryDirectory(prefix="model_ab_") as tmp:
        trees = {"A": revisions.built(args.base, Path(tmp) / "A"), "B": revisions.ROOT}
        started = {tag: _start(tree, args, model_dir) for tag, tree in trees.items()}
        procs = {tag: proc for tag, (proc, _) in started.items()}
        backends = {tag: backend for tag, (_, backend) in started.items()}
        if any(b.startswith(("torch_ref", "TorchReference")) or "library" in b
               for b in backends.values()):
            for proc in procs.values():
                proc.kill()
            cli.fail(f"the builds run on backends A: {backends['A']}, B: {backends['B']}: an "
                     "extension did not load (\"library\": its part runs on PyTorch's ops; "
                     "python setup.py build_ext --inplace in the working tree, or see the base "
                     "build's log), so this would time the fallback, not the build")
        times: dict[str, list[list[float]]] = {"A": [], "B": []}
        for r in range(args.rounds):
            for tag in ("A", "B") if r % 2 == 0 else ("B", "A"):
                procs[tag].stdin.write("go\n")
                procs[tag].stdin.flush()
                times[tag].append([float(v) for v in procs[tag].stdout.readline().split()])
        for proc in procs.values():
            proc.stdin.close()
            proc.wait()
    med = {tag: [statistics.median(c) * 1e3 for c in zip(*rows)] for tag, rows in times.items()}
    passes = [*map(_pass_name, args.widths), "prompt pass"]
    ratio = [statistics.median(a[i] / b[i] for a, b in zip(times["A"], times["B"]))
             for i in range(len(passes))]
    names = [p if p != "prompt pass" else f"{args.prompt}-token prompt pass" for p in passes]
    print(report.table(["pass", f"A {args.base} ms", "B worktree ms", "A / B per round"],
                       [[n, f"{a:.2f}", f"{b:.2f}", f"{r:.3f}"]
                        for n, a, b, r in zip(names, med["A"], med["B"], ratio)]))
    report.emit_json({"base": args.base, "ms": med, "a_over_b": dict(zip(passes, ratio))})
    return 0


if __name__ == "__main__":
    sys.exit(main())
