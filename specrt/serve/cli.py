"""`python -m specrt.serve`: the OpenAI-compatible server's command line.

Flags follow `vllm serve` where vLLM has them (--model, --served-model-name, --host, --port,
--speculative-config, --max-model-len, --max-num-seqs, --dtype, --device). With no --model it
serves the default pair, like `python -m specrt.generate`. This is an edge: it configures the
root logger (specrt's records and uvicorn's) and prints nothing else.
"""
from __future__ import annotations

import argparse
import json
import logging

from specrt.api.args import DTYPE_NAMES
from specrt.api.cli import add_draft_args

log = logging.getLogger("specrt.serve")


def build_parser() -> argparse.ArgumentParser:
    from specrt.commands import OneLineParser

    p = OneLineParser(prog="python -m specrt.serve",
                                description="Serve a model over OpenAI's HTTP API, with "
                                            "speculative decoding.")
    p.add_argument("--model", help="target model directory or known name "
                   "(default: the fetched qwen2.5-coder-1.5b-instruct)")
    p.add_argument("--draft", help="draft model directory or known name (default with no "
                   "--model: qwen2.5-coder-0.5b-instruct)")
    p.add_argument("--served-model-name", help="the model name clients send "
                   "(default: the model directory's name)")
    p.add_argument("--host", default="127.0.0.1", help="(default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="(default 8000)")
    p.add_argument("--speculative-config", default=None,
                   help="JSON with vLLM's keys, applied to every request that does not send "
                        "its own \"speculative\" field (default: auto K=16 with a draft, ngram "
                        "K=4 without); 'none' for plain decoding")
    p.add_argument("--max-model-len", "--max-seq-len", dest="max_seq_len", type=int,
                   default=4096, help="tokens per sequence (prompt + answer) in the KV cache "
                   "(default 4096)")
    p.add_argument("--max-num-seqs", type=int, default=4,
                   help="requests decoded together (KV-cache slots; default 4)")
    p.add_argument("--max-queue", type=int, default=256,
                   help="requests waiting for a slot before new ones get 503 (default 256)")
    p.add_argument("--dtype", default="auto", choices=DTYPE_NAMES,
                   help="auto (default): bfloat16 on a CUDA device with bf16 or where "
                        "specrt's CPU kernels run it, else float32")
    add_draft_args(p)
    p.add_argument("--device", default=None,
                   help="cpu, cuda or cuda:N (default: cuda if available)")
    p.add_argument("--log-level", default="info",
                   choices=["debug", "info", "warning", "error"], help="(default info)")
    return p


def speculative_from_flag(value: str | None, has_draft: bool) -> dict | None:
    """The server-wide speculative config: the flag's JSON, 'none', or the CLI default."""
    from specrt.api.cli import default_speculative
    from specrt.spec.config import SpecConfig, means_plain

    if value is None:
        return default_speculative(has_draft)
    if means_plain(value):
        return None
    SpecConfig.parse(value)                      # a bad config fails now, not per request
    return json.loads(value)


# the flags whose names differ from LLM's arguments, which the checks' messages name
FLAG_OF = {"max_seq_len": "--max-model-len", "max_batch_size": "--max-num-seqs"}


def check_flags(args) -> None:
    """LLM's checks of the flags it is built from, and the speculative config's, run on the
    flags alone: a typo costs no fetch and no model load."""
    from specrt.api.args import LLMArgs
    from specrt.errors import ArgumentError

    try:
        LLMArgs(model=args.model, draft=args.draft, dtype=args.dtype, device=args.device,
                max_seq_len=args.max_seq_len, max_batch_size=args.max_num_seqs,
                max_queue=args.max_queue, draft_dtype=args.draft_dtype,
                draft_vocab=args.draft_vocab, draft_stop=args.draft_stop)
    except ArgumentError as e:
        name = str(e).split(" ", 1)[0]
        if name in FLAG_OF:
            raise ArgumentError(f"{FLAG_OF[name]}: {e}") from None
        raise
    speculative_from_flag(args.speculative_config, has_draft=True)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from specrt.commands import run_command

    # Exit status as in every specrt command: 2 bad input, 1 runtime failure, 130 Ctrl-C.
    return run_command(lambda: _serve(args), interrupted="")


def _serve(args) -> int:
    import torch
    import uvicorn

    from specrt.api.async_llm import AsyncLLM
    from specrt.hub.resolve import resolve_pair
    from specrt.checks import check_int
    from specrt.serve.app import ServeConfig, build_app

    check_int("--port", args.port, 0, 65535, fix="a TCP port (0: any free one)")
    check_flags(args)                   # before resolve_pair, which may fetch ~6 GB
    model, draft = resolve_pair(args.model, args.draft, progress=True)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    spec = speculative_from_flag(args.speculative_config, draft is not None)
    name = args.served_model_name or model.name
    log.info("loading %s%s (%s, %s)", model, f" with draft {draft}" if draft else "",
             args.dtype, device)
    allm = AsyncLLM(model, draft=draft, dtype=args.dtype, device=device,
                    max_seq_len=args.max_seq_len, max_batch_size=args.max_num_seqs,
                    max_queue=args.max_queue, draft_dtype=args.draft_dtype,
                    draft_vocab=args.draft_vocab, draft_stop=args.draft_stop)
    try:
        app = build_app(allm, ServeConfig(name, spec))
        log.info("serving %r on http://%s:%d/v1 (speculative: %s, %d slots)", name, args.host,
                 args.port, json.dumps(spec), args.max_num_seqs)
        uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level,
                    log_config=None)
    finally:
        allm.close()
    return 0
