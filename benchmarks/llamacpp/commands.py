"""llama.cpp command lines for one generation, as argv lists (no shell), per method:

  plain         llama-completion          greedy decoding, no speculation
  draft:K       llama-speculative-simple  --spec-type draft-simple, the draft GGUF,
                                          --spec-draft-n-max K (p-min 0: always K drafts)
  ngram-simple:K, ngram-map-k:K
                llama-speculative-simple  --spec-type ngram-simple | ngram-map-k, lookup
                                          n-gram of NGRAM_N tokens, draft m-gram of K tokens

Flags as this llama.cpp version (llama-cpp-python 0.3.36's vendored tree) has them; the old
--draft/--draft-max are removed there. The prompt is passed with -p, already formatted with the
chat template, and --no-escape (by default -p turns a literal backslash-n into a newline; -f
would drop the template's trailing newline). Greedy is --temp 0 --top-k 1. The plain run also
prints the prompt's token ids (--verbose-prompt), so the caller can check both systems see
the same tokens. Pure functions: nothing here runs a process.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

KINDS = ("plain", "draft", "ngram-simple", "ngram-map-k")
# Lookup n-gram length of the n-gram methods: llama.cpp's default (12) almost never matches on
# short prompts; 3 is specrt's prompt_lookup_max.
NGRAM_N = 3


@dataclass(frozen=True)
class Job:
    """One llama.cpp generation."""
    kind: str               # one of KINDS
    k: int                  # draft tokens per round (0 for plain)
    target: Path            # GGUF
    draft: Path | None      # GGUF of the draft model (draft only)
    prompt: str             # formatted with the chat template
    max_new_tokens: int
    threads: int
    ctx: int                # context size (tokens)


def decode_counts_first_token(kind: str) -> bool:
    """Whether llama.cpp's decode-phase token count of `kind` includes the first generated
    token: llama-speculative-simple's (every method but plain) does, its loop making that token;
    llama-completion's prompt pass makes it, outside the count (benchmarks/llamacpp/parse.py)."""
    return kind != "plain"


def _common(job: Job) -> list[str]:
    t = str(job.threads)
    return ["-m", str(job.target), "-p", job.prompt, "-n", str(job.max_new_tokens),
            "-t", t, "-tb", t, "-c", str(job.ctx), "--temp", "0", "--top-k", "1",
            "--seed", "0", "--no-escape"]


def argv(bin_dir: Path, job: Job) -> list[str]:
    """The command line of `job`."""
    if job.kind not in KINDS:
        raise ValueError(f"unknown llama.cpp method {job.kind!r}; one of {', '.join(KINDS)}")
    if job.kind == "plain":
        return [str(bin_dir / "llama-completion"), *_common(job), "-no-cnv",
                "--no-display-prompt", "--verbose-prompt"]
    if job.k < 1:
        raise ValueError(f"{job.kind} needs K >= 1, got {job.k}")
    cmd = [str(bin_dir / "llama-speculative-simple"), *_common(job), "--spec-type", job.kind]
    if job.kind == "draft":
        if job.draft is None:
            raise ValueError("draft needs a draft model GGUF")
        t = str(job.threads)
        cmd[-1] = "draft-simple"
        return cmd + ["-md", str(job.draft), "--spec-draft-n-max", str(job.k),
                      "--spec-draft-n-min", "0", "--spec-draft-p-min", "0",
                      "-td", t, "-tbd", t]
    opt = "--spec-" + job.kind
    return cmd + [f"{opt}-size-n", str(NGRAM_N), f"{opt}-size-m", str(job.k)]

