"""Benchmark: end-to-end speedup of speculative decoding per kind of text, side by side with
Hugging Face transformers (and llama.cpp with --llamacpp), in one run.

Run: python -m benchmarks.e2e [--quick] [--llamacpp]      (--help for the knobs)

Tasks (benchmarks/prompts.json, the seed study's four kinds of text, 3 prompts each): code,
rewrite (the answer copies a paragraph of the prompt), explain, story. Chat template, greedy.

Methods, all on the same model pair and dtype in the same process:
  specrt  plain; draft_model:K and ngram:K (prompt_lookup_min 1, max 3) for K in --ks;
          auto:16 (adaptive drafter and K; --auto-k)
  HF      hf:plain (`generate`), hf:assisted:K (`assistant_model=` the same draft, constant
          K: num_assistant_tokens=K, schedule "constant", confidence threshold off) and
          hf:lookup:K (`prompt_lookup_num_tokens=K`, max_matching_ngram_size 3), K in --hf-k
For each prompt every method runs back to back (the order rotated per repeat and prompt,
reversed on every other one), so machine drift hits them all alike; speed is new tokens / wall
time of the whole call (prefill included) and a task's speed is its total tokens / total time.
Every speculative output is compared token for token with plain greedy of the same engine.

Prints per task x method: tokens/s, speedup vs plain, acceptance rate, mean acceptance length,
tokens per target pass, draft share of time, mismatches; specrt's best per task vs HF's best;
goals as PASS/FAIL; where specrt stands vs the seed study. Writes the section
"End-to-end speedup" of benchmarks/RESULTS.md (--no-record to skip; with another --prompts file
than benchmarks/prompts.json, a section of its own whose heading ends "on FILE"),
benchmarks/results/e2e.json, e2e_speedup.png, e2e_theory.png and e2e_auto_choices.png; JSON on
the last line.

--llamacpp (llama.cpp built once by `make bench-llamacpp`; without it this exits 2 saying so):
  llamacpp:plain (llama-completion), llamacpp:draft:K (llama-speculative-simple --spec-type
  draft-simple, the same draft, --spec-draft-n-max K), llamacpp:ngram-simple:K and
  llamacpp:ngram-map-k:K (lookup n-gram 3, draft m-gram K), K in --llamacpp-ks (2,4,8), on
  bf16 GGUFs made by llama.cpp's own converter, with --threads threads. Each prompt goes to
  llama.cpp already formatted with the chat template (its token ids are checked against
  specrt's before the sweep); specrt's and llama.cpp's methods alternate within each prompt's
  sweep. Adds a table of decode-only tokens/s (after the prompt's pass: llama.cpp's own
  timing lines, specrt's time after prefill) per task x method, and per task specrt best /
  llama.cpp best and specrt plain / llama.cpp plain; records the section "specrt vs
  llama.cpp" of RESULTS.md instead of "End-to-end speedup". Pass --no-hf to leave HF out.
  A llama.cpp speculative method that fails (crash, timeout, unreadable output) is left out
  of the run with a warning and a note saying where and why; llamacpp:plain failing ends it.

--quick: one prompt per task, K in {2, 4}, auto:16, HF with K = 4 only, and 64 new tokens
(unless --max-new-tokens is given), for a run of well under 10 minutes.
Full run: 12 prompts x 15 methods (specrt: plain, draft_model and ngram at K = 1, 2, 4, 8,
auto:16; HF: plain, assisted and lookup at K = 4, 8) = 180 generations of 128 tokens. HF's
K defaults to {4, 8} because its best K was 4 or 8 on every task in every run so far (and
in the issue's reference numbers) while HF's K = 1, 2 rows would add ~25 min at HF's speed;
--hf-k 1,2,4,8 runs them. The progress bar's ETA tells early how long a run will take.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from benchmarks import e2e_llamacpp, e2e_measure, e2e_plan, e2e_plots, e2e_report, e2e_summary
from benchmarks.e2e_records import RunConfig
from benchmarks.harness import cli, machine, report, results

SECTION = "## End-to-end speedup (benchmarks/e2e.py)"
PROMPTS = Path(__file__).resolve().parent / "prompts.json"


def build_parser() -> argparse.ArgumentParser:
    p = cli.parser("benchmarks.e2e", __doc__,
                   epilog=__doc__.split("\n\n", 1)[1])
    cli.add_common_args(p)
    p.add_argument("--quick", action="store_true", help="1 prompt per task, K in {2,4}, HF K=4, "
                   "64 new tokens (see below)")
    p.add_argument("--max-new-tokens", type=cli.count, default=None,
                   help="new tokens per generation (default 128; 64 with --quick)")
    p.add_argument("--tasks", default=None, help="comma-separated subset of the prompts "
                   "file's tasks (default: all of them)")
    p.add_argument("--prompts-per-task", type=cli.count, default=None,
                   help="default 3 (1 with --quick)")
    p.add_argument("--prompts", default=str(PROMPTS), help="prompts file (default "
                   "benchmarks/prompts.json)")
    p.add_argument("--ks", default=None, help="K values of draft_model/ngram (default 1,2,4,8; "
                   "2,4 with --quick)")
    p.add_argument("--auto-k", type=cli.count, default=16, help="num_speculative_tokens of auto "
                   "(default 16, as the library's)")
    p.add_argument("--methods", default=None, help="specrt's methods, e.g. plain,ngram:4,"
                   "draft_model:4,auto:16 (a name without :K means every K in --ks; plain is "
                   "always added); hf:... and llamacpp:... entries replace that system's "
                   "default set, which runs otherwise (--no-hf leaves HF out)")
    p.add_argument("--hf-k", default=None, help="K values of the HF methods (default 4,8; "
                   "4 with --quick)")
    p.add_argument("--no-hf", action="store_true", help="skip Hugging Face")
    p.add_argument("--llamacpp", action="store_true", help="also run llama.cpp (see below)")
    p.add_argument("--llamacpp-ks", default=None, help="K values of llama.cpp's draft and "
                   "n-gram methods (default 2,4,8; 2,4 with --quick)")
    p.add_argument("--llamacpp-dir", default=None, help="the `make bench-llamacpp` folder "
                   "(default $SPECRT_LLAMACPP_DIR, else $SPECRT_CACHE/llamacpp)")
    p.add_argument("--llamacpp-timeout", type=float, default=600.0,
                   help="seconds one llama.cpp process may take (default 600)")
    p.add_argument("--repeats", type=cli.count, default=1, help="sweeps over the prompts; the "
                   "median time per prompt x method is used (default 1)")
    p.add_argument("--max-seq-len", type=cli.count, default=4096)
    cli.add_record_args(p)
    return p


def section(heading: str, config: RunConfig) -> str:
    """`heading`, naming the prompts file where it is not the tuning set (PROMPTS), so a run on
    another set records a section of its own instead of overwriting the tuning set's."""
    if config.prompts.resolve() == PROMPTS:
        return heading
    return f"{heading} on {results.shown_path(config.prompts)}"


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    config = e2e_plan.build_config(args)
    prompts = e2e_plan.load_prompts(args.prompts, config.tasks, config.prompts_per_task)
    out = cli.out_dir(args)
    info = machine.machine_info(config.threads, config.device)
    e2e_report.print_start(config, info)

    records, elapsed, config = e2e_measure.measure(config, prompts)
    info["load_average_end"] = list(machine.load_average())
    result = e2e_summary.summarize(config, info, records, elapsed)

    e2e_report.print_report(result)
    pngs = e2e_plots.draw(result, out)
    payload = e2e_report.json_payload(result, pngs)
    if config.has_llamacpp:
        side = e2e_llamacpp.side_by_side(result)
        e2e_llamacpp.print_report(side)
        payload["llamacpp"] = side.json()
        if args.record:
            report.record_section(section(e2e_llamacpp.SECTION, config),
                                  e2e_llamacpp.markdown(result, side, args.note),
                                  args.results_md)
    elif args.record:
        report.record_section(section(SECTION, config),
                              e2e_report.markdown(result, pngs, args.note), args.results_md)
    report.emit_json(payload, out / "e2e.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
