"""`python -m specrt.serve`: the OpenAI-compatible server's command line.

Flags follow `vllm serve` where vLLM has them (--model, --served-model-name, --host, --port,
--speculative-config, --max-model-len, --max-num-seqs, --dtype, --device). With no --model it
serves the default pair, like `python -m specrt.generate`. This is an edge: it configures the
root logger (specrt's records and uvicorn's) and prints nothing else.

Before anything is fetched or loaded it checks the flags, that the `serve` extra is installed,
and binds --host:--port, so a typo, a busy port or a missing package costs no model load.
Exit status: 2 bad input (a flag, a busy port, an unknown host), 1 a runtime failure (the
`serve` extra missing, a failed fetch), 130 on Ctrl-C before the server runs (while loading);
once it runs, SIGINT (Ctrl-C) or SIGTERM shuts it down gracefully (in-flight responses end)
and it exits 0.
"""
from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

from specrt.api.cli import add_model_args, add_weights_args
from specrt.commands import interruptible, named_flags

log = logging.getLogger("specrt.serve")
SERVE_EXTRA = ("fastapi", "uvicorn", "prometheus_client")     # pyproject's `serve` extra
# A shutdown waited for every running and queued request to end (10 clients x 1,500 tokens:
# over 30 s, past a container runtime's usual 30 s grace before SIGKILL); what is still running
# after this is cancelled, its clients' streams ended.
SHUTDOWN_TIMEOUT_S = 10.0
HANDLERS_END_S = 5.0    # after that, for the handlers to answer their cancelled requests


def build_parser() -> argparse.ArgumentParser:
    from specrt.commands import OneLineParser, prog_name

    p = OneLineParser(prog=prog_name("specrt.serve", "specrt-serve"),
                                description="Serve a model over OpenAI's HTTP API, with "
                                            "speculative decoding.")
    add_model_args(p)
    p.add_argument("--served-model-name", help="the model name clients send "
                   "(default: a Hugging Face id as given, without its @revision, else the "
                   "model directory's name)")
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
    p.add_argument("--shutdown-timeout", type=float, default=SHUTDOWN_TIMEOUT_S,
                   help="on SIGTERM or Ctrl-C, seconds the running requests may take to end "
                   "before they are cancelled (default %(default)g; 0: cancel at once)")
    add_weights_args(p)
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


# LLM's argument names, which the checks' messages start with -> the flag that sets each here
FLAG_OF = {"max_seq_len": "--max-model-len", "max_batch_size": "--max-num-seqs",
           "max_queue": "--max-queue", "draft_vocab": "--draft-vocab",
           "draft_stop": "--draft-stop"}


def check_flags(args):
    """LLM's checks of the flags it is built from, and the speculative config's, run on the
    flags alone: a typo costs no fetch and no model load. Returns the checked LLMArgs (dtype
    and device resolved)."""
    from specrt.api.args import LLMArgs
    from specrt.api.cli import check_draft_flags_used, check_draft_given, draft_in_config
    from specrt.engine.request import positions_needed
    from specrt.spec.config import SpecConfig

    with named_flags(FLAG_OF.get):
        checked = LLMArgs(model=args.model, draft=args.draft, dtype=args.dtype,
                          device=args.device, max_seq_len=args.max_seq_len,
                          max_batch_size=args.max_num_seqs, max_queue=args.max_queue,
                          draft_dtype=args.draft_dtype, draft_vocab=args.draft_vocab,
                          draft_stop=args.draft_stop)
    # with no --model the default pair brings a draft; a --model alone runs without one
    has_draft = args.model is None or args.draft is not None
    spec = SpecConfig.parse(speculative_from_flag(args.speculative_config, has_draft))
    check_draft_given(spec, args.model, args.draft)
    check_draft_flags_used(args, spec)
    checked, _ = draft_in_config(spec, checked)       # the config's "model": the server's draft
    # the shortest request (a 1-token prompt, 1 token) under the server's config: if even it
    # does not fit, only requests sending a smaller K or "speculative": false will be served
    k = spec.num_speculative_tokens if spec is not None else 0
    need = positions_needed(1, 1, spec)
    if k and need > checked.max_seq_len:
        log.warning("--max-model-len %d is too short for the server's speculative config "
                    "(K=%d needs 1 prompt token + 1 token + K+1 = %d positions): requests "
                    "under it will be refused; only those sending \"speculative\": false or "
                    "a smaller K fit. Raise --max-model-len or lower K in "
                    "--speculative-config", checked.max_seq_len, k, need)
    return checked


def missing_serve_extra() -> str | None:
    """The first module of the `serve` extra that cannot be imported (or one it needs), or
    None when the HTTP server can run."""
    import importlib

    for module in SERVE_EXTRA:
        try:
            importlib.import_module(module)
        except ImportError as e:
            return e.name or module
    return None


def bind(host: str, port: int):
    """The server's socket, bound (not yet listening) before any model is fetched or loaded:
    a busy port or an unknown host is bad input (ArgumentError) found at once, and until the
    server starts (listen) a client is refused at once instead of hanging through the load.
    Bound as uvicorn binds: IPv6 for a host with ':' (dual-stack where the system is), else
    IPv4, SO_REUSEADDR."""
    import errno
    import socket

    from specrt.errors import ArgumentError

    # bind reads "" as every interface: an unset "$HOST" would open the server to the network
    if not host.strip():
        raise ArgumentError(f"--host {host!r} is empty; give an address or name of this "
                            "machine, e.g. 127.0.0.1 (or 0.0.0.0 for every interface)")
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        return sock
    except socket.gaierror as e:
        sock.close()
        raise ArgumentError(f"--host {host!r}: cannot resolve it ({e.strerror}); give an "
                            "address or name of this machine, e.g. 127.0.0.1 or 0.0.0.0") \
            from None
    except (UnicodeError, ValueError, TypeError) as e:    # an empty label, a NUL byte
        sock.close()
        raise ArgumentError(f"--host {host!r} is not a host name ({e}); give an address "
                            "or name of this machine, e.g. 127.0.0.1 or 0.0.0.0") from None
    except OSError as e:
        sock.close()
        where = f"{host}:{port}"
        if e.errno == errno.EADDRINUSE:
            fix = (f"--port {port}: {where} is already in use (another server?); stop it "
                   "or choose another --port (0: any free one)")
        elif e.errno == errno.EACCES:
            fix = (f"--port {port}: permission denied on {where} (ports below 1024 need "
                   "privileges); choose another --port, e.g. 8000")
        elif e.errno == errno.EADDRNOTAVAIL:
            fix = (f"--host {host!r} is not an address of this machine; use 127.0.0.1, "
                   "0.0.0.0 or one of its own addresses")
        else:
            fix = f"cannot bind {where} ({e.strerror or e}); check --host and --port"
        raise ArgumentError(fix) from None


@interruptible
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.log_level != "debug":     # torch's own info records (e.g. at exit) are not ours
        logging.getLogger("torch").setLevel(logging.WARNING)
    from specrt.commands import run_command

    # Exit status as in every specrt command: 2 bad input, 1 runtime failure, 130 Ctrl-C
    # (while loading; a running server shuts down gracefully and exits 0).
    return run_command(lambda: _serve(args))


def _serve(args) -> int:
    from specrt.checks import check_int, check_number
    from specrt.commands import report_error

    missing = missing_serve_extra()
    if missing is not None:
        return report_error("the HTTP server needs the serve extra: pip install "
                            f"'specrt[serve]' (missing {missing})", status=1)
    import uvicorn

    from specrt.api.async_llm import AsyncLLM
    from specrt.hub.resolve import resolve_pair
    from specrt.serve.app import ServeConfig, build_app

    check_int("--port", args.port, 0, 65535, fix="a TCP port (0: any free one)")
    check_number("--shutdown-timeout", args.shutdown_timeout, 0, 24 * 3600,
                 fix="seconds the running requests may take to end at a shutdown")
    checked = check_flags(args)     # before resolve_pair, which may fetch ~6 GB
    sock = bind(args.host, args.port)
    try:
        model, draft = resolve_pair(args.model, checked.draft, progress=True)
        spec = speculative_from_flag(args.speculative_config, draft is not None)
        if spec is not None:
            spec.pop("model", None)          # loaded as the server's draft (check_flags)
        name = args.served_model_name or default_served_name(args.model, model)
        log.info("loading %s%s (%s, %s)", model, f" with draft {draft}" if draft else "",
                 str(checked.dtype).removeprefix("torch."), checked.device)
        allm = AsyncLLM(model, draft=draft, dtype=checked.dtype, device=checked.device,
                        max_seq_len=args.max_seq_len, max_batch_size=args.max_num_seqs,
                        max_queue=args.max_queue, draft_dtype=args.draft_dtype,
                        draft_vocab=args.draft_vocab, draft_stop=args.draft_stop)
        try:
            app = build_app(allm, ServeConfig(name, spec))
            port = sock.getsockname()[1]             # the real one with --port 0
            host = f"[{args.host}]" if ":" in args.host else args.host
            config = uvicorn.Config(app, host=args.host, port=port,
                                    log_level=args.log_level, log_config=None,
                                    timeout_graceful_shutdown=args.shutdown_timeout
                                    + HANDLERS_END_S)
            sock.listen(config.backlog)    # from here clients queue; uvicorn accepts in ms
            log.info("serving %r on http://%s:%d/v1 (speculative: %s, %d slots)", name, host,
                     port, json.dumps(spec), args.max_num_seqs)
            _run_server(_server(config, allm, args.shutdown_timeout), sock)
        finally:
            allm.close()
    finally:
        sock.close()
    return 0


def default_served_name(model_arg: str | None, model_dir: Path) -> str:
    """The name clients send when --served-model-name is not given: a Hugging Face id as
    given (vLLM's default), without an @revision; otherwise the model directory's name (a
    hub snapshot's directory is a commit hash)."""
    from specrt.hub.resolve import is_hub_id

    if model_arg is not None and is_hub_id(model_arg):
        return model_arg.partition("@")[0]
    return model_dir.name


def _server(config, allm, timeout: float):
    """uvicorn's server, whose shutdown closes the LLM `timeout` seconds in: every request
    still running ends "cancelled", which each handler answers as a finished response
    (finish_reason "abort", then `[DONE]` on a stream). uvicorn's own timeout, HANDLERS_END_S
    later, cancels a handler that still has not ended (its client gets a cut response)."""
    import asyncio

    import uvicorn

    from specrt.serve.app import begin_shutdown

    class Server(uvicorn.Server):
        async def shutdown(self, sockets=None) -> None:
            begin_shutdown(config.app)      # bodies still arriving: 503 now
            loop = asyncio.get_running_loop()
            closing = []
            timer = loop.call_later(timeout, lambda: closing.append(
                loop.create_task(allm.aclose())))
            try:
                await super().shutdown(sockets)
            finally:
                timer.cancel()
                if closing:
                    await closing[0]

    return Server(config)


def _run_server(server, sock) -> None:
    """uvicorn on the bound socket until SIGINT or SIGTERM, then its graceful shutdown. uvicorn
    raises the signal again once it has shut down; a handler of ours takes it then, so the
    command exits 0, as a server stopped on request should."""
    import signal

    def after_shutdown(signum, frame):
        if not server.should_exit:      # before uvicorn took the signals: stop as Ctrl-C does
            raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, after_shutdown) for sig in (signal.SIGINT,
                                                                    signal.SIGTERM)}
    try:
        server.run(sockets=[sock])
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
