"""Benchmark: how often the draft agrees with the target for each draft vocabulary.

Run: python -m benchmarks.draft_vocab [--sizes 32768,49152,65536] [--traces FILE]   (--help)

A shortlisted draft scores the first N token ids and the special ones, plus (the eager draft
model) every id its request has read: the prompt and the answer so far
(`DraftModelDrafter._read_past_shortlist`). This measures what each choice keeps of the
draft's guesses without running a single round: the recorded answers of --traces
(`benchmarks.auto_replay record`: each prompt and the target's greedy answer) are read by the
draft as `LLM` loads it (int8 on a CPU whose kernel runs it) but scoring the whole vocabulary
with its quantized head (`LLM`'s draft scores its read ids from their bf16 rows: a few ties may
fall the other way), teacher-forced, once per prompt; at each answer position its top-1 among
each vocabulary's ids is compared with the target's token. Prints, per vocabulary: the share
of positions that agree (the mean of each prompt's share), per prompt set, the prompt that
loses most against the largest --sizes entry with read ids off (the default before read ids),
and the bytes of an int8 output head of that many rows (what each decode step reads for it).
Writes the section "Draft vocabulary" of benchmarks/RESULTS.md (--no-record to skip); JSON on
the last line.

Top-1 agreement at a position is the chance the draft's first guess there is accepted in a
greedy round; later guesses follow the draft's own earlier guesses, which this does not model.
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from benchmarks.harness import cli, machine, report, results
from benchmarks.harness.model_dirs import resolve_with_draft

SECTION = "## Draft vocabulary (benchmarks/draft_vocab.py)"
TRACES = Path(__file__).parent / "results" / "auto_traces.json"


def build_parser() -> argparse.ArgumentParser:
    p = cli.parser("benchmarks.draft_vocab", __doc__)
    cli.add_common_args(p, out=False, dtype=False, device=False)
    cli.add_record_args(p)
    p.add_argument("--sizes", default="32768,40960,49152,65536",
                   type=lambda s: cli.positive_ints(s, "--sizes", unique_sorted=True),
                   help="shortlist sizes N to compare, comma-separated (default "
                        "32768,40960,49152,65536); the whole vocabulary is always added")
    p.add_argument("--traces", default=str(TRACES),
                   help="recorded answers (default benchmarks/results/auto_traces.json)")
    p.add_argument("--draft-dtype", default="auto", choices=["auto", "int8", "bfloat16"],
                   help="the draft's weights (auto: as LLM loads it)")
    return p


def agreement(logits, prompt: list[int], output: list[int], scored: list[int],
              read_ids: bool) -> float:
    """The share of answer positions at which the draft's top-1 among `scored` ids (plus, with
    `read_ids`, every id of the prompt and the answer before the position) is the target's
    token. logits: [N, V] the draft's teacher-forced scores of output[0..N-1]."""
    import torch

    from specrt.spec.drafters.draft_model import hide_unread

    V = logits.shape[-1]
    mask = torch.full((V,), float("-inf"))                                      # [V]
    mask[scored] = 0.0
    scores = logits + mask                                                      # [N, V]
    if read_ids:
        text = prompt + output
        inside = set(scored)
        read = [t for t in dict.fromkeys(text) if t < V and t not in inside]
        scores[:, read] = logits[:, read]
        # row i has read the prompt and output[:i]: text[:len(prompt) + i]
        hide_unread(scores, text, read, start=len(prompt) - 1)
    return int((scores.argmax(-1) == torch.tensor(output)).sum()) / len(output)


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    import torch

    from specrt.api.tokenizer import Tokenizer
    from specrt.model.config import ModelConfig
    from specrt.model.transformer import Transformer
    from specrt.model.backends.quantized import auto_draft_format
    from specrt.spec.drafters.draft_model import draft_head_rows

    try:
        traces = json.loads(Path(args.traces).read_text())["traces"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        cli.fail(f"--traces {args.traces}: not a trace file of benchmarks.auto_replay record "
                 f"({e}); record one with python -m benchmarks.auto_replay record")
    cli.setup_torch(args.threads, "cpu")
    target_dir, draft_dir = resolve_with_draft(args, "its guesses are compared")
    cfg = ModelConfig.from_dir(draft_dir)
    quant = (auto_draft_format(cfg, torch.device("cpu"), torch.bfloat16)
             if args.draft_dtype == "auto" else args.draft_dtype)
    quant = quant if quant in ("int8", "int4") else None
    info = machine.machine_info(args.threads, "cpu")
    report.print_header("Draft vocabulary", info)
    draft = Transformer.from_dir(draft_dir, "bfloat16", "cpu", 4096, quant=quant)
    tokenizer = Tokenizer(target_dir)
    sizes = [n for n in args.sizes if n < cfg.vocab_size]
    if not sizes:
        cli.fail(f"--sizes: every size is at least the draft's vocabulary ({cfg.vocab_size:,} "
                 "ids); give smaller ones")
    forms = [(n, read) for n in sizes for read in (False, True)] + [(None, False)]
    rows_of = {n: draft_head_rows(cfg, tokenizer, n) or list(range(cfg.vocab_size))
               for n in sizes + [None]}
    shares = {f: {} for f in forms}
    for key, t in cli.progress(traces.items(), desc="prompts", disable=args.no_progress):
        text = t["prompt"] + t["output"]
        if len(text) > draft.max_positions:
            cli.fail(f"{key}: {len(text)} tokens, more than this benchmark loads for (4096)")
        with torch.inference_mode():
            logits = draft.forward(torch.tensor([text]), draft.new_cache(1, len(text)))[0]
        logits = logits[len(t["prompt"]) - 1:len(text) - 1].float()       # [N, V]
        for n, read in forms:
            shares[(n, read)][key] = agreement(logits, t["prompt"], t["output"], rows_of[n],
                                               read)
    base = shares[(sizes[-1], False)]
    sets = sorted({k.split(":")[0] for k in traces})
    rows = []
    for n, read in forms:
        got = shares[(n, read)]
        by_set = {s: statistics.mean(v for k, v in got.items() if k.split(":")[0] == s)
                  for s in sets}
        low = min(got, key=lambda k: got[k] - base[k])
        rows.append({"ids": "all" if n is None else n, "read_ids": read,
                     "agreement": statistics.mean(got.values()), "by_set": by_set,
                     "lowest_change": got[low] - base[low], "lowest_prompt": low,
                     "head_mb": len(rows_of[n]) * cfg.hidden_size / 1e6})
    text = report.markdown_table(
        ("draft scores", "agreement", *sets, f"lowest prompt vs the first {sizes[-1]:,}",
         "int8 head MB"),
        [(("the whole vocabulary" if r["ids"] == "all" else f"first {r['ids']:,}")
          + (" + read ids" if r["read_ids"] else ""), f"{r['agreement']:.2%}",
          *(f"{r['by_set'][s]:.2%}" for s in sets),
          f"{r['lowest_change']:+.3f} ({r['lowest_prompt'].split(':', 1)[1]})",
          f"{r['head_mb']:.1f}") for r in rows], "lr" + "r" * len(sets) + "lr")
    print(text)
    if args.record:
        report.record_section(SECTION, report.results_preamble(info, args.note)
                              + "\nTop-1 agreement with the target's greedy answers of "
                              f"{len(traces)} recorded prompts "
                              f"({results.shown_path(args.traces)}), draft {quant or 'bf16'}, "
                              "teacher-forced:\n\n" + text + "\n",
                              Path(args.results_md))
    report.emit_json({"rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
