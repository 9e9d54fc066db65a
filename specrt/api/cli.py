"""`python -m specrt.generate`: the generation command line (one of the CLIs, the only printers).

With no --model it runs the default pair (Qwen2.5-Coder-1.5B-Instruct verified by
Qwen2.5-Coder-0.5B-Instruct drafts), fetching it first if needed; with no --prompt it answers a
built-in coding prompt. The answer streams to stdout as rounds commit; a summary line (and the
per-round trace with --trace) goes to stderr, so stdout holds only the answer (or, with --json,
one JSON object).
"""
from __future__ import annotations

import argparse
import json
import sys

DEFAULT_PROMPT = ("Write a Python function `merge_intervals(intervals)` that merges "
                  "overlapping intervals and returns them sorted. Include a docstring.")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m specrt.generate",
                                description="Generate text with speculative decoding.")
    p.add_argument("--model", help="target model directory or known name "
                   "(default: the fetched qwen2.5-coder-1.5b-instruct)")
    p.add_argument("--draft", help="draft model directory or known name (default with no "
                   "--model: qwen2.5-coder-0.5b-instruct)")
    p.add_argument("--prompt", help="prompt text (default: a built-in coding prompt)")
    p.add_argument("--prompt-ids", help="prompt as comma-separated token ids (instead of text)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--stop", action="append", default=None,
                   help="stop string (repeatable); text from it on is not printed")
    p.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available)")
    p.add_argument("--max-seq-len", type=int, default=4096)
    p.add_argument("--speculative-config", default=None,
                   help="JSON with vLLM's keys: method (draft_model | ngram | auto), model, "
                        "num_speculative_tokens, prompt_lookup_min, prompt_lookup_max")
    p.add_argument("--no-spec", action="store_true", help="plain decoding (no speculation)")
    p.add_argument("--no-chat", action="store_true", help="do not apply the chat template")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    p.add_argument("--trace", action="store_true", help="print one line per round to stderr")
    p.add_argument("--cuda-graphs", action=argparse.BooleanOptionalAction, default=None,
                   help="capture the draft loop in CUDA graphs (default: on with CUDA)")
    return p


def default_speculative(has_draft: bool) -> dict:
    if has_draft:
        return {"method": "auto", "num_speculative_tokens": 8}
    return {"method": "ngram", "num_speculative_tokens": 4}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from specrt.logs import configure_logging

    configure_logging()
    from specrt.errors import SpecrtError

    try:
        return _run(args)
    except SpecrtError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130


def _run(args) -> int:
    import torch

    from specrt.api.llm import LLM
    from specrt.errors import SpecrtError
    from specrt.hub.resolve import resolve_pair

    model, draft = resolve_pair(args.model, args.draft, progress=True)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if args.prompt is not None and args.prompt_ids is not None:
        raise SpecrtError("give --prompt or --prompt-ids, not both")
    if args.prompt_ids is not None:
        try:
            prompt = [int(t) for t in args.prompt_ids.split(",") if t.strip()]
        except ValueError:
            raise SpecrtError(f"--prompt-ids must be comma-separated integers, got "
                              f"{args.prompt_ids!r}") from None
    else:
        prompt = args.prompt if args.prompt is not None else DEFAULT_PROMPT

    print(f"loading {model}" + (f" with draft {draft}" if draft else "") + f" ({args.dtype}, "
          f"{device})", file=sys.stderr)
    llm = LLM(model=model, draft=draft, dtype=args.dtype, device=device,
              max_seq_len=args.max_seq_len, cuda_graphs=args.cuda_graphs)
    if args.no_spec:
        spec = None
    elif args.speculative_config is not None:
        spec = args.speculative_config
    else:
        spec = default_speculative(llm.engine.draft is not None)
    chat = not args.no_chat and isinstance(prompt, str) and llm.tokenizer is not None \
        and llm.tokenizer.has_chat_template
    run = llm.submit(prompt, max_new_tokens=args.max_new_tokens,
                     temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                     seed=args.seed, stop=args.stop, chat=chat, speculative=spec)
    try:
        for chunk in run.chunks():
            if args.trace and chunk.step is not None and chunk.step.index > 0:
                print(_trace_line(llm, chunk.step), file=sys.stderr)
            if chunk.text and not args.json:
                sys.stdout.write(chunk.text)
                sys.stdout.flush()
    finally:
        llm.close()
    result = run.result()
    if args.json:
        print(json.dumps({"token_ids": result.token_ids, "text": result.text,
                          "finish_reason": result.finish_reason, "stats": result.stats}))
    else:
        print()
    print(summary_line(result.stats, spec), file=sys.stderr)
    return 0


def summary_line(stats: dict, spec) -> str:
    from specrt.spec.config import SpecConfig

    cfg = SpecConfig.parse(spec)
    method = "plain" if cfg is None else f"{cfg.method} K={cfg.num_speculative_tokens}"
    return (f"[specrt] {stats['new_tokens']} new tokens in {stats['seconds']:.2f} s "
            f"({stats['tokens_per_second']:.2f} tok/s) | {method} | acceptance "
            f"{stats['acceptance_rate']:.1%} | mean acceptance length "
            f"{stats['mean_acceptance_length']:.2f} | {stats['target_passes']} target passes")


def _trace_line(llm, step) -> str:
    def show(ids):
        if llm.tokenizer is None:
            return ",".join(str(t) for t in ids)
        return ",".join(json.dumps(llm.tokenizer.token_text(t)) for t in ids)

    drafts = step.draft_tokens
    kept = step.num_accepted
    target = step.new_tokens[kept:]
    return (f"round {step.index} | {step.plan} | draft: {show(drafts) or '-'} | "
            f"kept {kept}/{len(drafts)} | target: {show(target) or '-'}")


if __name__ == "__main__":
    sys.exit(main())
