"""The typed records of the end-to-end benchmark (benchmarks/e2e.py): a method, a prompt, a
run's configuration, one measurement, and the summaries per task x method and per task.

Frozen dataclasses, so a record read by the report is the record the measurement made. Each
has a `json()` giving the keys the e2e JSON line has always had (a field that does not apply
is None and left out; a ratio that is undefined is NaN and written as null). This module
holds data only: it does not measure, aggregate or print.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Method:
    engine: str          # "specrt" | "hf" | "llamacpp"
    kind: str            # plain | draft_model | ngram | auto (specrt); assisted | lookup (hf);
                         # draft | ngram-simple | ngram-map-k (llamacpp)
    k: int = 0           # draft tokens per round (0 for plain)

    @property
    def label(self) -> str:
        base = self.kind if self.engine == "specrt" else f"{self.engine}:{self.kind}"
        return base if self.kind == "plain" else f"{base}:{self.k}"

    @property
    def needs_draft(self) -> bool:
        return self.kind in ("draft_model", "auto", "assisted", "draft")

    @property
    def is_reference(self) -> bool:
        """Plain greedy: the baseline of its engine's speedups and exactness."""
        return self.kind == "plain"

    def spec(self) -> dict | None:
        """specrt's `speculative=` argument for this method (None: plain decoding)."""
        if self.kind == "plain":
            return None
        if self.kind == "ngram":
            return {"method": "ngram", "num_speculative_tokens": self.k,
                    "prompt_lookup_min": 1, "prompt_lookup_max": 3}
        return {"method": self.kind, "num_speculative_tokens": self.k}


@dataclass(frozen=True)
class Prompt:
    task: str            # a task of the prompts file
    id: str              # its id in prompts.json
    text: str | tuple    # one user message, or a conversation: ((role, content), ...)


@dataclass(frozen=True)
class RunConfig:
    target: Path
    draft: Path | None
    dtype: str           # torch dtype name
    device: str
    threads: int
    max_new_tokens: int
    max_seq_len: int
    tasks: tuple[str, ...]
    prompts_per_task: int
    repeats: int         # sweeps over the prompts; the median time per prompt x method is used
    methods: tuple[Method, ...]
    quick: bool
    show_progress: bool
    prompts: Path        # the prompts file (--prompts)
    notes: tuple[str, ...] = ()     # what planning added or skipped, said in the report
    llamacpp_dir: Path | None = None    # the `make bench-llamacpp` cache folder (--llamacpp)
    llamacpp_timeout: float = 600.0     # s, per llama.cpp process

    @property
    def has_hf(self) -> bool:
        return any(m.engine == "hf" for m in self.methods)

    @property
    def has_llamacpp(self) -> bool:
        return any(m.engine == "llamacpp" for m in self.methods)

    def json(self) -> dict:
        return {"target": str(self.target), "draft": str(self.draft) if self.draft else None,
                "dtype": self.dtype, "max_new_tokens": self.max_new_tokens,
                "prompts": str(self.prompts), "tasks": list(self.tasks),
                "prompts_per_task": self.prompts_per_task,
                "repeats": self.repeats, "methods": [m.label for m in self.methods],
                "quick": self.quick,
                "llamacpp_dir": str(self.llamacpp_dir) if self.llamacpp_dir else None}


@dataclass(frozen=True)
class Measurement:
    """One prompt x method."""
    task: str
    prompt: str                   # Prompt.id
    method: Method
    prompt_tokens: int
    ids: tuple[int, ...]          # the new tokens of the last repeat (llama.cpp: its text,
                                  # re-encoded by specrt's tokenizer, at most max_new_tokens)
    wall: float                   # s, median over the repeats, prefill included (llama.cpp:
                                  # its prompt + decode time, loading excluded)
    walls: tuple[float, ...]      # s, every repeat
    first_diff: int | None        # vs plain greedy of the same engine, the first difference
                                  # in any repeat; None: the same in every repeat (or plain)
    a: float                      # per-position acceptance; NaN without drafted rounds
    drafted_rounds: int
    rejections: int               # drafted rounds that stopped before the end of their drafts
    stats: dict | None            # specrt's result stats; None for HF and llama.cpp
    plans: tuple[str, ...] = ()   # every round's plan (auto's choices over the generation)
    # Decode-only (after the prompt's pass; specrt and llama.cpp, None for HF): tokens the
    # decode phase made and its seconds, the median over the repeats
    decode_tokens: int | None = None
    decode_seconds: float | None = None
    drafted_accepted: tuple[int, int] | None = None     # llama.cpp's n_drafted, n_accept
    finish_reason: str | None = None    # specrt's, last repeat ("eos": ids end with that EOS)

    @property
    def new_tokens(self) -> int:
        return len(self.ids)

    def json(self) -> dict:
        m = self.method
        out = {"task": self.task, "prompt": self.prompt, "method": m.label, "engine": m.engine,
               "kind": m.kind, "k": m.k, "prompt_tokens": self.prompt_tokens,
               "new_tokens": self.new_tokens, "wall": self.wall, "walls": list(self.walls),
               "first_diff": self.first_diff, "a": self.a,
               "drafted_rounds": self.drafted_rounds, "rejections": self.rejections}
        if self.stats:
            out["stats"] = dict(self.stats)
        if self.decode_seconds is not None:
            out.update(decode_tokens=self.decode_tokens, decode_seconds=self.decode_seconds)
        if self.drafted_accepted is not None:
            out["drafted"], out["accepted"] = self.drafted_accepted
        return out


@dataclass(frozen=True)
class MethodSummary:
    """One task x method over the task's prompts: speed is total tokens / total time."""
    method: Method
    prompts: int
    new_tokens: int
    seconds: float
    tok_s: float
    mismatches: int                       # prompts whose output differs from plain greedy
    first_diffs: tuple[int | None, ...]   # per prompt
    speedup: float = float("nan")         # vs specrt plain of the task
    speedup_vs_hf_plain: float | None = None          # HF rows only
    # specrt rows only (None for HF):
    acceptance_rate: float | None = None  # accepted / drafted tokens (vLLM's)
    a: float | None = None                # per-position acceptance
    mean_acceptance_length: float | None = None       # tokens per drafted round
    tokens_per_target_pass: float | None = None
    draft_share: float | None = None      # drafting time / total time
    plans: dict | None = None             # auto's plan histogram, most used first
    repeat_tok_s: tuple[float, ...] = ()  # tokens / time of each repeat over the prompts

    def json(self) -> dict:
        m = self.method
        out = {"method": m.label, "engine": m.engine, "kind": m.kind, "k": m.k}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.name != "method" and v is not None:
                out[f.name] = list(v) if isinstance(v, tuple) else v
        return out


@dataclass(frozen=True)
class TaskSummary:
    """One task: specrt's best (and best fixed-K) method, HF's best, and auto."""
    plain_tok_s: float
    best: str                         # method label
    best_tok_s: float
    best_speedup: float
    best_fixed: str                   # best method other than auto
    best_fixed_tok_s: float
    hf_plain_tok_s: float | None = None
    hf_best: str | None = None
    hf_best_tok_s: float | None = None
    ratio_vs_hf_best: float | None = None     # specrt best tok/s / HF best tok/s
    auto: str | None = None
    auto_tok_s: float | None = None
    auto_vs_plain: float | None = None
    auto_vs_best_fixed: float | None = None
    # ... against the fixed setting a user would have picked from the other repeats (the
    # geometric mean over the repeats; None with one repeat): see e2e_summary.out_of_sample
    auto_vs_chosen_fixed: float | None = None

    def json(self) -> dict:
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}


@dataclass(frozen=True)
class E2EResult:
    """Everything a run measured and derived; the report renders it, nothing more."""
    config: RunConfig
    machine: dict                                   # harness.machine.machine_info()
    measurements: tuple[Measurement, ...]
    per_task: dict[str, dict[str, MethodSummary]]   # task -> method label -> summary
    summaries: dict[str, TaskSummary]               # task -> summary
    goals: dict[str, bool]                          # goal text -> met
    hf_vs_specrt: dict[str, int | None]             # "task/prompt" -> first diff of plains
    elapsed: float                                  # s, model loading included

    @property
    def speculative(self) -> list[Measurement]:
        """specrt's speculative measurements (the ones checked against plain greedy)."""
        return [r for r in self.measurements
                if r.method.engine == "specrt" and not r.method.is_reference]
