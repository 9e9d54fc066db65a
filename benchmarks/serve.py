"""Benchmark: the HTTP server under 1, 2, 4 and 8 concurrent clients, with and without
speculation, next to the in-process `LLM.generate` it is built on.

Run: python -m benchmarks.serve [--quick]        (--help for the knobs)

The server runs as a subprocess (`python -m specrt.serve`, the default pair in bf16 unless
--model/--draft/--dtype say otherwise) so its CPU time is not shared with the clients' event
loop under one GIL. One server serves every configuration: each request sends specrt's extra
field "speculative" -- the --spec-config JSON (default: the server's default, auto K=16 with a
draft, ngram K=4 without) or false for plain decoding. Each client (the official `openai`
async client) sends --prompts-per-client chat prompts from benchmarks/prompts.json one after
the other, streaming, greedy, --max-tokens each; the clients of one configuration run at once.

Per configuration: requests/s and output tokens/s (over the configuration's wall time), p50/p99
time to first token and inter-token latency as the clients see them (ITL: the gap between
consecutive streamed chunks; a chunk is one engine round and may hold several tokens), and the
acceptance rate from the server's /metrics. Configurations are interleaved: each client count
runs plain then speculative back to back, and right after each 1-client configuration the same
prompts run through the in-process `LLM.generate` (loaded in this process) with the same
speculative config. Goals, as ratios from this one run: served / in-process tok/s at 1 client
>= 0.95; plain 4-client / 1-client tok/s >= 3; speculative / plain tok/s at 4 clients >= 1.

Prints a table and the goals, writes the section "Serving (HTTP)" of benchmarks/RESULTS.md
(--no-record to skip), benchmarks/results/serve.json and serve.png; JSON on the last line.
--quick: clients 1,2; one prompt per client; 16 new tokens.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from benchmarks import e2e_plan
from benchmarks.harness import cli, machine, plots, report, results
from benchmarks.harness.model_dirs import resolve_models

SECTION = "## Serving (HTTP)"
PROMPTS = Path(__file__).with_name("prompts.json")
RESULTS_DIR = Path(__file__).with_name("results")
GOAL = 0.95                 # served tokens/s at 1 client over in-process
SERVER_START_S = 300


def build_parser() -> argparse.ArgumentParser:
    p = cli.parser("benchmarks.serve", __doc__)
    cli.add_common_args(p, progress=False)        # a line per configuration on stderr
    p.set_defaults(out=str(RESULTS_DIR))
    cli.add_record_args(p)
    p.add_argument("--clients", default="1,2,4,8", help="concurrent clients per configuration")
    p.add_argument("--prompts-per-client", type=cli.count, default=3)
    p.add_argument("--max-tokens", type=cli.count, default=None, help="new tokens per request "
                   "(default 128; --quick: 16)")
    p.add_argument("--spec-config", default=None, help="speculative config JSON for the "
                   "speculative configurations (default: the server's default)")
    p.add_argument("--port", type=int, default=0, help="server port (default: a free one)")
    p.add_argument("--quick", action="store_true", help="clients 1,2; 1 prompt each; 16 tokens")
    return p


def load_prompts() -> list[str]:
    prompts = e2e_plan.load_prompts(str(PROMPTS), tuple(e2e_plan.prompt_tasks(str(PROMPTS))),
                                    per_task=10**9)
    if any(not isinstance(p.text, str) for p in prompts):
        cli.fail(f"{PROMPTS}: the clients send text prompts; give each item a \"prompt\"")
    # round-robin over the kinds of text, so a few prompts already mix them
    columns = [[p.text for p in prompts if p.task == task] for task in dict.fromkeys(
        p.task for p in prompts)]
    return [col[i] for i in range(max(map(len, columns))) for col in columns if i < len(col)]


def client_prompts(prompts: list[str], client: int, per_client: int) -> list[str]:
    return [prompts[(client * per_client + j) % len(prompts)] for j in range(per_client)]


def percentile(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q / 100 * (len(xs) - 1)))]


# --- in process -----------------------------------------------------------------------------
class InProcess:
    """`LLM.generate` in this process, on the same prompts a served client sends."""

    def __init__(self, target, draft, args):
        from specrt import LLM

        self.llm = LLM(target, draft=draft, dtype=args.dtype, device=args.device,
                       max_seq_len=4096)
        self.max_tokens = args.max_tokens

    def measure(self, prompts: list[str], spec) -> dict:
        """tokens/s over `prompts`, one after the other, greedy (as the served clients)."""
        kw = dict(max_new_tokens=self.max_tokens, chat=True, temperature=0.0,
                  speculative=spec or None)
        tokens, t0 = 0, time.perf_counter()
        for p in prompts:
            tokens += len(self.llm.generate(p, **kw).token_ids)
        seconds = time.perf_counter() - t0
        return {"tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds}

    def close(self) -> None:
        self.llm.close()


# --- the server -----------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(target, draft, args, port: int, max_num_seqs: int) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "specrt.serve", "--model", str(target), "--dtype", args.dtype,
           "--device", args.device, "--port", str(port), "--max-num-seqs", str(max_num_seqs),
           "--served-model-name", "bench", "--log-level", "warning"]
    if draft is not None:
        cmd += ["--draft", str(draft)]
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    proc = subprocess.Popen(cmd, env=env)
    deadline = time.monotonic() + SERVER_START_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            cli.fail(f"the server exited with code {proc.returncode} while starting")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return proc
        except OSError:
            time.sleep(0.5)
    proc.terminate()
    cli.fail(f"the server did not listen on port {port} within {SERVER_START_S} s")


def scrape(port: int) -> dict[str, float]:
    import urllib.request

    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30).read()
    out = {}
    for line in text.decode().splitlines():
        if line and not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            out[key.split("{")[0]] = out.get(key.split("{")[0], 0.0) + float(value)
    return out


async def one_request(client, prompt: str, args, spec_field) -> dict:
    t0 = time.perf_counter()
    stream = await client.chat.completions.create(
        model="bench", messages=[{"role": "user", "content": prompt}], stream=True,
        max_tokens=args.max_tokens, temperature=0, stream_options={"include_usage": True},
        extra_body={"speculative": spec_field})
    arrivals, tokens = [], 0
    async for event in stream:
        if event.choices and event.choices[0].delta.content:
            arrivals.append(time.perf_counter())
        if event.usage is not None:
            tokens = event.usage.completion_tokens
    return {"ttft": arrivals[0] - t0 if arrivals else float("nan"), "tokens": tokens,
            "itl": [b - a for a, b in zip(arrivals, arrivals[1:])]}


async def drive(port: int, clients: int, prompts: list[str], args, spec_field) -> tuple:
    import openai

    async with openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x",
                                  timeout=600, max_retries=0) as client:
        async def one_client(i):
            return [await one_request(client, p, args, spec_field)
                    for p in client_prompts(prompts, i, args.prompts_per_client)]

        t0 = time.perf_counter()
        per_client = await asyncio.gather(*(one_client(i) for i in range(clients)))
        return [r for rs in per_client for r in rs], time.perf_counter() - t0


def measure_config(port: int, clients: int, prompts, args, spec_field, label: str) -> dict:
    before = scrape(port)
    results, wall = asyncio.run(drive(port, clients, prompts, args, spec_field))
    after = scrape(port)
    drafted = after.get("vllm:spec_decode_num_draft_tokens_total", 0) - \
        before.get("vllm:spec_decode_num_draft_tokens_total", 0)
    accepted = after.get("vllm:spec_decode_num_accepted_tokens_total", 0) - \
        before.get("vllm:spec_decode_num_accepted_tokens_total", 0)
    ttft = [r["ttft"] for r in results]
    itl = [x for r in results for x in r["itl"]]
    tokens = sum(r["tokens"] for r in results)
    return {"mode": label, "clients": clients, "requests": len(results), "seconds": wall,
            "requests_per_s": len(results) / wall, "output_tokens_per_s": tokens / wall,
            "output_tokens": tokens,
            "ttft_p50": percentile(ttft, 50), "ttft_p99": percentile(ttft, 99),
            "itl_p50": percentile(itl, 50), "itl_p99": percentile(itl, 99),
            "acceptance_rate": accepted / drafted if drafted else None}


# --- report ---------------------------------------------------------------------------------
HEADERS = ["mode", "clients", "requests", "req/s", "out tok/s", "TTFT p50 s", "TTFT p99 s",
           "ITL p50 ms", "ITL p99 ms", "acceptance"]


def rows(runs: list[dict]) -> list[list]:
    return [[r["mode"], r["clients"], r["requests"], r["requests_per_s"],
             r["output_tokens_per_s"], r["ttft_p50"], r["ttft_p99"], r["itl_p50"] * 1e3,
             r["itl_p99"] * 1e3, r["acceptance_rate"]] for r in runs]


def draw(runs: list[dict], path: Path) -> Path:
    plt = plots.pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    for mode in dict.fromkeys(r["mode"] for r in runs):
        rs = [r for r in runs if r["mode"] == mode]
        a.plot([r["clients"] for r in rs], [r["output_tokens_per_s"] for r in rs], "o-",
               label=mode)
        b.plot([r["clients"] for r in rs], [r["ttft_p50"] for r in rs], "o-", label=mode)
    a.set(xlabel="concurrent clients", ylabel="output tokens/s", title="Throughput")
    b.set(xlabel="concurrent clients", ylabel="seconds", title="Time to first token (p50)")
    a.legend()
    b.legend()
    return plots.save_figure(fig, path)


def _run(runs: list[dict], mode: str, clients: int) -> dict | None:
    return next((r for r in runs if r["mode"] == mode and r["clients"] == clients), None)


def evaluate(runs: list[dict], base: dict) -> dict:
    """The issue's three goals, as ratios measured side by side in this run."""
    values, lines = {}, []

    def goal(name: str, value: float | None, target: float, text: str) -> None:
        ok = None if value is None else value >= target
        values[name] = {"value": value, "target": target, "met": ok}
        shown = "n/a" if value is None else f"{value:.2f}"
        lines.append(f"{text}: {shown} (goal >= {target}): {report.pass_fail(ok)}")

    for mode in ("plain", "speculative"):
        one = _run(runs, mode, 1)
        goal(f"served_over_in_process_{mode}",
             one["output_tokens_per_s"] / base[mode]["tokens_per_s"] if one and mode in base
             else None, GOAL, f"1 client, {mode}: served tok/s / in-process LLM.generate tok/s")
    one, four = _run(runs, "plain", 1), _run(runs, "plain", 4)
    goal("plain_4_over_1", four["output_tokens_per_s"] / one["output_tokens_per_s"]
         if one and four else None, 3.0, "plain decoding: 4-client tok/s / 1-client tok/s")
    spec4 = _run(runs, "speculative", 4)
    goal("spec_over_plain_4", spec4["output_tokens_per_s"] / four["output_tokens_per_s"]
         if spec4 and four else None, 1.0, "4 clients: speculative tok/s / plain tok/s")
    return {"values": values, "lines": lines}


def markdown(info, config, runs, goals, png, note) -> str:
    return (report.results_preamble(info, note) + "\nConfig: " + ", ".join(
        f"{k}={v}" for k, v in config.items()) + "\n\n" + report.markdown_table(HEADERS, rows(runs))
        + "\n\n" + "\n".join(f"- {line}" for line in goals["lines"])
        + "\n\n" + results.image(png, "serving throughput and TTFT") + "\n")


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.quick:
        args.clients, args.prompts_per_client = "1,2", 1
        args.max_tokens = args.max_tokens or 16
    args.max_tokens = args.max_tokens or 128
    clients = cli.positive_ints(args.clients, "--clients", unique_sorted=True)
    if args.prompts_per_client < 1:
        cli.fail("--prompts-per-client must be >= 1")
    from specrt.api.cli import default_speculative
    from specrt.errors import SpecrtError
    from specrt.spec.config import SpecConfig

    if args.spec_config is not None:
        try:
            SpecConfig.parse(args.spec_config)          # JSON text: checked, then sent as is
        except SpecrtError as e:
            cli.fail(f"--spec-config: {e}")
    cli.setup_torch(args.threads, args.device)
    target, draft = resolve_models(args)
    spec = json.loads(args.spec_config) if args.spec_config is not None else \
        default_speculative(draft is not None)
    prompts = load_prompts()
    out = cli.out_dir(args)
    info = machine.machine_info(args.threads, args.device)
    config = {"model": target.name, "draft": draft.name if draft else None, "dtype": args.dtype,
              "clients": clients, "prompts_per_client": args.prompts_per_client,
              "max_tokens": args.max_tokens, "speculative": json.dumps(spec)}
    report.print_header("HTTP serving", info, config)

    local = InProcess(target, draft, args)
    port = args.port or free_port()
    proc = start_server(target, draft, args, port, max(clients))
    modes = (("plain", False), ("speculative", spec))
    runs, base = [], {}
    try:
        for label, field in modes:       # warm-up: kernels, calibration of auto's costs
            asyncio.run(drive(port, 1, prompts[:1], argparse.Namespace(
                max_tokens=4, prompts_per_client=1), field))
            local.measure(prompts[:1], field)
        # Interleaved: each client count runs plain then speculative back to back, and the
        # 1-client runs sit next to the in-process runs they are compared with.
        for c in clients:
            for label, field in modes:
                runs.append(measure_config(port, c, prompts, args, field, label))
                print(f"  {label} x{c}: {runs[-1]['output_tokens_per_s']:.2f} tok/s",
                      file=sys.stderr)
                if c == 1:
                    base[label] = local.measure(client_prompts(prompts, 0,
                                                               args.prompts_per_client), field)
    finally:
        proc.terminate()
        proc.wait(30)
        local.close()
    info["load_average_end"] = list(machine.load_average())
    goals = evaluate(runs, base)
    print(report.table(HEADERS, rows(runs)))
    for line in goals["lines"]:
        print(line)
    png = draw(runs, out / "serve.png")
    if args.record:
        report.record_section(SECTION, markdown(info, config, runs, goals, png, args.note),
                              Path(args.results_md))
    report.emit_json({"benchmark": "serve", "machine": info, "config": config, "runs": runs,
                      "in_process": base, "goals": goals["values"], "png": str(png)},
                     out / "serve.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
