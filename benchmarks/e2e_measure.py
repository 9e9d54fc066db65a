"""Measuring the end-to-end benchmark: load both engines once, run every prompt x method back
to back, and return Measurement records.

For each prompt every method runs back to back, the order reversed on every other prompt (and
repeat), so machine drift hits them all alike. A generation's time is the wall time of the
whole call, prefill included. Nothing here prints except the progress bar on stderr; the
report renders the records.
"""
from __future__ import annotations

import gc
import time
from dataclasses import dataclass

from benchmarks.e2e_records import Measurement, Method, Prompt, RunConfig
from benchmarks.harness import cli, compare, hf, timing


@dataclass(frozen=True)
class Generation:
    """One call of one method on one prompt."""
    ids: tuple[int, ...]                # the new tokens
    wall: float                         # s
    stats: dict | None                  # specrt's result stats; None for HF
    rounds: tuple[tuple[int, int], ...] = ()    # (drafted, accepted) per round with drafts
    plans: tuple[str, ...] = ()                  # every round's plan ("plain", "ngram:3", ...)


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
        self.hf = self.assistant = None
        if config.has_hf:
            self.hf = hf.load(config.target, config.dtype, config.device)
            if any(m.kind == "assisted" for m in config.methods):
                self.assistant = hf.load(config.draft, config.dtype, config.device)

    def encode(self, prompt: str) -> list[int]:
        """The prompt as token ids, through the chat template when the tokenizer has one."""
        from specrt.errors import SpecrtError

        try:
            tok = self.llm.tokenizer
            return self.llm.encode(prompt, chat=tok is not None and tok.has_chat_template)
        except SpecrtError as e:
            cli.fail(str(e))

    def run(self, m: Method, ids: list[int], max_new: int) -> Generation:
        return self._run_specrt(m, ids, max_new) if m.engine == "specrt" else \
            self._run_hf(m, ids, max_new)

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
        return Generation(tuple(res.token_ids), wall, res.stats, tuple(rounds), tuple(plans))

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


def _sweep(runner: Runner, config: RunConfig, prompts: list[Prompt], encoded: dict):
    """Every repeat x prompt x method -> ({(task, id, method): [walls]}, {...: last run})."""
    methods = list(config.methods)
    walls: dict[tuple, list[float]] = {}
    last: dict[tuple, Generation] = {}
    bar = cli.progress(total=len(prompts) * len(methods) * config.repeats, desc="e2e",
                       disable=not config.show_progress)
    for rep in range(config.repeats):
        for i, p in enumerate(prompts):
            for m in (methods if (i + rep) % 2 == 0 else methods[::-1]):
                bar.set_postfix_str(f"{p.task} / {p.id} / {m.label}")
                g = runner.run(m, encoded[(p.task, p.id)], config.max_new_tokens)
                walls.setdefault((p.task, p.id, m), []).append(g.wall)
                last[(p.task, p.id, m)] = g
                bar.update(1)
    bar.close()
    return walls, last


def measure(config: RunConfig, prompts: list[Prompt]) -> tuple[list[Measurement], float]:
    """(one Measurement per prompt x method, seconds in all with model loading)."""
    t_start = time.perf_counter()
    runner = Runner(config)
    encoded = {(p.task, p.id): runner.encode(p.text) for p in prompts}
    # Warm-up: every method once, briefly, so no first call pays for lazy initialisation.
    first = encoded[(prompts[0].task, prompts[0].id)]
    for m in cli.progress(config.methods, desc="warm-up", disable=not config.show_progress):
        runner.run(m, first, 4)
    walls, last = _sweep(runner, config, prompts, encoded)
    elapsed = time.perf_counter() - t_start
    out = []
    for (task, pid, m), g in last.items():
        ref = last[(task, pid, Method(m.engine, "plain"))].ids
        diff = None if m.is_reference else compare.first_difference(g.ids, ref)
        out.append(Measurement(
            task=task, prompt=pid, method=m, prompt_tokens=len(encoded[(task, pid)]),
            ids=g.ids, wall=timing.median(walls[(task, pid, m)]),
            walls=tuple(walls[(task, pid, m)]), first_diff=diff,
            a=per_position_acceptance(g.rounds), drafted_rounds=len(g.rounds),
            rejections=sum(a < d for d, a in g.rounds), stats=g.stats, plans=g.plans))
    del runner
    gc.collect()
    return out, elapsed
