"""Measuring the end-to-end benchmark: load both engines once (llama.cpp runs as one process
per generation), run every prompt x method back to back, and return Measurement records.

For each prompt every method runs back to back, in an order that rotates with the repeat and
the prompt and is reversed on every other one (`run_order`), so machine drift, and whatever
the runs before a method leave behind, hits them all alike. A generation's time is the wall
time of the whole call, prefill included. Nothing here prints except the progress bar and a
warning per llama.cpp method that fails (on stderr); the report renders the records.

A llama.cpp speculative method that fails (exits non-zero, times out, prints what the parser
cannot read) is left out of the whole run, with the reason in the run's notes, and the sweep
goes on: one tool's crash on one prompt no longer throws away an hour of measurements. Every
other failure ends the run (exit 2): specrt's own errors, llama.cpp's plain decoding (the
reference of its side of the table) and a prompt llama.cpp tokenizes differently.
"""
from __future__ import annotations

import dataclasses
import gc
import sys
import time
from dataclasses import dataclass

from benchmarks.e2e_records import Measurement, Method, Prompt, RunConfig
from benchmarks.harness import cli, compare, hf, timing
from benchmarks.llamacpp.run import LlamaCppFailed


@dataclass(frozen=True)
class Generation:
    """One call of one method on one prompt."""
    ids: tuple[int, ...]                # the new tokens
    wall: float                         # s
    stats: dict | None                  # specrt's result stats; None for HF
    rounds: tuple[tuple[int, int], ...] = ()    # (drafted, accepted) per round with drafts
    plans: tuple[str, ...] = ()                  # every round's plan ("plain", "ngram:3", ...)
    decode: tuple[int, float] | None = None     # (tokens, s) after the prompt's pass; not HF
    drafted_accepted: tuple[int, int] | None = None     # llama.cpp's totals
    finish_reason: str | None = None    # specrt's ("eos": ids end with the EOS it stopped at)


@dataclass(frozen=True)
class Encoded:
    """A prompt as both systems get it."""
    ids: list[int]      # specrt's token ids (through the chat template)
    text: str           # the same prompt formatted with the chat template, for llama.cpp


class Runner:
    """Holds the models of both engines and runs one (prompt, method) generation."""

    def __init__(self, config: RunConfig):
        import specrt
        from specrt.errors import SpecrtError

        self.device = config.device
        try:
            self.llm = specrt.LLM(model=config.target, draft=config.draft, dtype=config.dtype,
                                  device=config.device, max_seq_len=config.max_seq_len)
        except SpecrtError as e:
            cli.fail(str(e))
        self.eos = sorted(self.llm.eos_ids)
        self.config = config
        self.hf = self.assistant = None
        if config.has_hf:
            self.hf = hf.load(config.target, config.dtype, config.device)
            if any(m.kind == "assisted" for m in config.methods):
                self.assistant = hf.load(config.draft, config.dtype, config.device)

    def encode(self, prompt: str | tuple) -> Encoded:
        """The prompt as token ids and as text, through the chat template when the tokenizer
        has one (a conversation, ((role, content), ...), always goes through it)."""
        from specrt.errors import SpecrtError

        try:
            tok = self.llm.tokenizer
            if isinstance(prompt, tuple):
                messages = [{"role": r, "content": c} for r, c in prompt]
                return Encoded(tok.encode_messages(messages), tok.chat_text(messages))
            chat = tok is not None and tok.has_chat_template
            text = tok.chat_text([{"role": "user", "content": prompt}]) if chat else prompt
            return Encoded(self.llm.encode(prompt, chat=chat), text)
        except SpecrtError as e:
            cli.fail(str(e))

    def run(self, m: Method, p: Encoded, max_new: int) -> Generation:
        if m.engine == "llamacpp":
            return self._run_llamacpp(m, p, max_new)
        return self._run_specrt(m, p.ids, max_new) if m.engine == "specrt" else \
            self._run_hf(m, p.ids, max_new)

    def _run_specrt(self, m: Method, ids: list[int], max_new: int) -> Generation:
        from specrt.errors import SpecrtError

        rounds, plans = [], []
        t0 = time.perf_counter()
        try:
            # = llm.generate, keeping each round's drafted/accepted counts on the way
            run = self.llm.submit(ids, max_new_tokens=max_new, speculative=m.spec())
            for chunk in run.chunks():
                step = chunk.step
                if step.index > 0:
                    plans.append(step.plan if step.draft_tokens else "plain")
                if step.index > 0 and step.draft_tokens:
                    rounds.append((len(step.draft_tokens), step.num_accepted))
            res = run.result()
        except SpecrtError as e:
            cli.fail(f"{m.label}: {e}")
        wall = time.perf_counter() - t0
        return Generation(tuple(res.token_ids), wall, res.stats, tuple(rounds), tuple(plans),
                          timing.decode_phase(res), finish_reason=res.finish_reason)

    def _run_llamacpp(self, m: Method, p: Encoded, max_new: int) -> Generation:
        """One llama.cpp process, or raise LlamaCppFailed; its prompt must be specrt's tokens
        (else exit 2)."""
        from benchmarks.llamacpp import commands, install, run

        c = self.config
        inst = install.Install.at(c.llamacpp_dir)
        job = commands.Job(kind=m.kind, k=m.k, target=inst.gguf(c.target),
                           draft=inst.gguf(c.draft) if c.draft else None, prompt=p.text,
                           max_new_tokens=max_new, threads=c.threads, ctx=c.max_seq_len)
        t = run.run(inst.bin_dir, job, c.llamacpp_timeout)
        if t.prompt_tokens != len(p.ids) or (t.prompt_ids and list(t.prompt_ids) != p.ids):
            at = compare.first_difference(t.prompt_ids, p.ids) if t.prompt_ids else None
            cli.fail(f"{m.label}: llama.cpp saw {t.prompt_tokens} prompt tokens, specrt "
                     f"{len(p.ids)}" + ("" if at is None else f"; first different id at {at}")
                     + ": the two systems would not run the same prompt")
        # llama.cpp prints text, not ids; speculative-simple may run one token past -n
        ids = tuple(self.llm.tokenizer.encode(t.text)[:max_new])
        return Generation(ids, t.prompt_seconds + t.decode_seconds, None,
                          decode=(t.decode_tokens, t.decode_seconds),
                          drafted_accepted=(None if t.drafted is None
                                            else (t.drafted, t.accepted)))

    def _run_hf(self, m: Method, ids: list[int], max_new: int) -> Generation:
        kw = {}
        if m.kind == "assisted":
            kw = hf.assisted_kwargs(self.assistant, m.k)
        elif m.kind == "lookup":
            kw = hf.lookup_kwargs(m.k)
        box = {}
        wall = timing.time_once(lambda: box.setdefault("ids", hf.generate(
            self.hf, ids, max_new, eos_ids=self.eos, **kw)), self.device)
        return Generation(tuple(box["ids"]), wall, None)


def per_position_acceptance(rounds) -> float:
    """The a of the geometric model (each draft accepted with probability a, independently):
    its estimate is accepted / (accepted + rejections), a rejection being a round that
    stopped before the end of its drafts. Exact for drafts shorter than K (n-gram)."""
    acc = sum(a for _, a in rounds)
    rej = sum(a < d for d, a in rounds)
    return acc / (acc + rej) if acc + rej else float("nan")


def run_order(methods: list, prompt_index: int, repeat: int, repeats: int) -> list:
    """The methods in the order one prompt's sweep runs them: rotated by a share of the list
    per repeat (and one place per prompt), reversed on every other (prompt + repeat). Reversing
    alone left a method at the ends of the sweep in every repeat: `auto`, listed last, read
    77-86% of the best fixed setting on two prompts there and 94-104% listed second, the same
    plans (benchmarks/RESULTS.md, "The draft model stops when unsure")."""
    n = len(methods)
    shift = (repeat * n // max(repeats, 1) + prompt_index) % n if n else 0
    order = methods[shift:] + methods[:shift]
    return order if (prompt_index + repeat) % 2 == 0 else order[::-1]


def _run_or_fail(runner: Runner, m: Method, p: Encoded, max_new: int) -> Generation:
    """runner.run, ending the run (exit 2) on llama.cpp's failure."""
    try:
        return runner.run(m, p, max_new)
    except LlamaCppFailed as e:
        cli.fail(str(e))


def _sweep(runner: Runner, config: RunConfig, prompts: list[Prompt], encoded: dict):
    """Every repeat x prompt x method -> ({(task, id, method): [walls]}, {...: [every run]},
    {...: [decode seconds]}, {method: why it failed}); a failed llama.cpp speculative method
    is not run again."""
    methods = list(config.methods)
    walls: dict[tuple, list[float]] = {}
    decodes: dict[tuple, list[float]] = {}
    runs: dict[tuple, list[Generation]] = {}
    failed: dict[Method, str] = {}
    bar = cli.progress(total=len(prompts) * len(methods) * config.repeats, desc="e2e",
                       disable=not config.show_progress)
    for rep in range(config.repeats):
        for i, p in enumerate(prompts):
            for m in run_order(methods, i, rep, config.repeats):
                bar.update(1)
                if m in failed:
                    continue
                bar.set_postfix_str(f"{p.task} / {p.id} / {m.label}")
                try:
                    g = runner.run(m, encoded[(p.task, p.id)], config.max_new_tokens)
                except LlamaCppFailed as e:          # only llama.cpp's methods raise it
                    if m.is_reference:
                        cli.fail(str(e))
                    failed[m] = f"{p.task}/{p.id}, repeat {rep + 1}: {e}"
                    print(f"warning: {m.label} failed on {failed[m]}\n"
                          f"{m.label} is left out of the rest of the run",
                          file=sys.stderr, flush=True)
                    continue
                walls.setdefault((p.task, p.id, m), []).append(g.wall)
                if g.decode:
                    decodes.setdefault((p.task, p.id, m), []).append(g.decode[1])
                runs.setdefault((p.task, p.id, m), []).append(g)
    bar.close()
    return walls, runs, decodes, failed


def first_mismatch(runs: list[Generation], refs: list[Generation]) -> int | None:
    """The first token at which any repeat's output differs from the reference's output of
    the same repeat (None: every repeat agrees)."""
    for g, ref in zip(runs, refs, strict=True):
        diff = compare.first_difference(g.ids, ref.ids)
        if diff is not None:
            return diff
    return None


def measure(config: RunConfig, prompts: list[Prompt]
            ) -> tuple[list[Measurement], float, RunConfig]:
    """(one Measurement per prompt x method, seconds in all with model loading, `config` less
    the llama.cpp methods that failed, a note per failure saying where and why)."""
    t_start = time.perf_counter()
    runner = Runner(config)
    encoded = {(p.task, p.id): runner.encode(p.text) for p in prompts}
    if config.has_llamacpp:
        # Before the sweep, not in it: llama.cpp must see specrt's prompt tokens (checked
        # on every llamacpp:plain run); this also brings the GGUFs into the page cache.
        for p in cli.progress(prompts, desc="llama.cpp prompt ids",
                              disable=not config.show_progress):
            _run_or_fail(runner, Method("llamacpp", "plain"), encoded[(p.task, p.id)], 1)
    # Warm-up: every method once, briefly, so no first call pays for lazy initialisation
    # (llama.cpp starts afresh every time and warms itself up before it times anything).
    first = encoded[(prompts[0].task, prompts[0].id)]
    warm = [m for m in config.methods if m.engine != "llamacpp"]
    for m in cli.progress(warm, desc="warm-up", disable=not config.show_progress):
        runner.run(m, first, 4)
    walls, runs, decodes, failed = _sweep(runner, config, prompts, encoded)
    elapsed = time.perf_counter() - t_start
    config = dataclasses.replace(
        config, methods=tuple(m for m in config.methods if m not in failed),
        notes=config.notes + tuple(
            f"{m.label} left out: it failed on {why.splitlines()[0].rstrip(':. ')}"
            for m, why in failed.items()))
    out = []
    for (task, pid, m), every in runs.items():
        if m in failed:
            continue
        g = every[-1]
        refs = runs[(task, pid, Method(m.engine, "plain"))]
        diff = None if m.is_reference else first_mismatch(every, refs)
        dec = decodes.get((task, pid, m))
        out.append(Measurement(
            task=task, prompt=pid, method=m, prompt_tokens=len(encoded[(task, pid)].ids),
            ids=g.ids, wall=timing.median(walls[(task, pid, m)]),
            walls=tuple(walls[(task, pid, m)]), first_diff=diff,
            a=per_position_acceptance(g.rounds), drafted_rounds=len(g.rounds),
            rejections=sum(a < d for d, a in g.rounds), stats=g.stats, plans=g.plans,
            decode_tokens=g.decode[0] if g.decode else None,
            decode_seconds=timing.median(dec) if dec else None,
            drafted_accepted=g.drafted_accepted, finish_reason=g.finish_reason))
    del runner
    gc.collect()
    return out, elapsed, config
