"""Reading llama.cpp's own output: the generated text and the decode-only timing.

Decode-only speed is what llama.cpp itself reports for the phase after the prompt:
  llama-completion (plain)   the context's `eval time = T ms / N runs` line: N single-token
                             decode passes, each adding one token, over T (the prompt's pass
                             is the separate `prompt eval time` line, not counted). The
                             prompt's pass makes the first token, so N = generated - 1.
  llama-speculative-simple   `decoded N tokens in T seconds`: the whole loop after the prompt
                             (drafting, verifying, sampling). Its prompt pass stops one token
                             short and the loop makes the first token, so N = every token
                             generated (its `n_predict`: the first, and each round's accepted
                             drafts + 1, EOS included).
(examples/speculative-simple/speculative-simple.cpp and tools/completion/completion.cpp of the
vendored tree.) Pure functions of the text: no process is run here.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

_PROMPT_EVAL = re.compile(r"prompt eval time =\s*([\d.]+) ms /\s*(\d+) tokens")
_EVAL = re.compile(r"(?<!prompt )eval time =\s*([\d.]+) ms /\s*(\d+) runs")
_SAMPLING = re.compile(r"sampling time =\s*([\d.]+) ms")
_ENCODED = re.compile(r"encoded\s+(\d+) tokens in\s+([\d.]+) seconds")
_DECODED = re.compile(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds")
_DRAFTED = re.compile(r"n_drafted\s*=\s*(\d+)")
_ACCEPT = re.compile(r"n_accept\s*=\s*(\d+)")
_N_PROMPT = re.compile(r"number of tokens in prompt = (\d+)\n")
# "0.03.623.006 I    198 -> '...'" (a log prefix when stderr is not a terminal) or "   198 -> '"
_TOKEN_LINE = re.compile(r"^(?:[\d.]+ [A-Z] )? *(\d+) -> '", re.MULTILINE)
# What the tools print around the generated text on stdout
COMPLETION_TAIL = "\n\n"                  # llama-completion, always
END_OF_TEXT = " [end of text]\n"           # llama-completion, before it, when EOS ended it
SPECULATIVE_HEAD, SPECULATIVE_TAIL = "\n\n", "\n\n\n\n"     # llama-speculative-simple


class ParseError(ValueError):
    """llama.cpp's output lacks a line the benchmark needs (another version's format?)."""


@dataclass(frozen=True)
class Timings:
    """One llama.cpp generation as llama.cpp reported it."""
    text: str                           # the generated text (prompt not included)
    prompt_tokens: int
    prompt_seconds: float
    decode_tokens: int                  # tokens made by the decode phase (see above)
    decode_seconds: float
    drafted: int | None = None          # speculative-simple only
    accepted: int | None = None
    prompt_ids: tuple[int, ...] = ()    # the prompt as llama.cpp tokenized it (plain only)

    @property
    def decode_tok_s(self) -> float:
        return self.decode_tokens / self.decode_seconds if self.decode_seconds > 0 else 0.0


def _need(rx: re.Pattern, text: str, what: str) -> re.Match:
    m = rx.search(text)
    if m is None:
        raise ParseError(f"no {what!r} line in llama.cpp's output")
    return m


def prompt_ids(stderr: str) -> tuple[int, ...]:
    """The prompt's token ids from --verbose-prompt (empty when it was not given)."""
    m = _N_PROMPT.search(stderr)
    if m is None:
        return ()
    n = int(m.group(1))
    ids = [int(x) for x in _TOKEN_LINE.findall(stderr, m.end())[:n]]
    if len(ids) != n:
        raise ParseError(f"--verbose-prompt listed {len(ids)} of {n} prompt tokens")
    return tuple(ids)


def completion(stdout: str, stderr: str) -> Timings:
    """llama-completion -no-cnv --no-display-prompt [--verbose-prompt]."""
    pe = _need(_PROMPT_EVAL, stderr, "prompt eval time")
    ev = _need(_EVAL, stderr, "eval time")
    text = stdout.removesuffix(COMPLETION_TAIL).removesuffix(END_OF_TEXT)
    return Timings(text=text, prompt_tokens=int(pe.group(2)),
                   prompt_seconds=float(pe.group(1)) / 1e3, decode_tokens=int(ev.group(2)),
                   decode_seconds=float(ev.group(1)) / 1e3, prompt_ids=prompt_ids(stderr))


def speculative_simple(stdout: str, stderr: str, prompt: str) -> Timings:
    """llama-speculative-simple: stdout is two newlines, the prompt, the generated text, four
    newlines. It may run a few tokens past -n (it checks the count after each round)."""
    enc = _need(_ENCODED, stderr, "encoded N tokens")
    dec = _need(_DECODED, stderr, "decoded N tokens")
    text = stdout.removeprefix(SPECULATIVE_HEAD).removesuffix(SPECULATIVE_TAIL)
    if not text.startswith(prompt):
        raise ParseError("llama-speculative-simple did not echo the prompt first")
    text = text[len(prompt):]
    drafted, accepted = _DRAFTED.search(stderr), _ACCEPT.search(stderr)
    return Timings(text=text, prompt_tokens=int(enc.group(1)),
                   prompt_seconds=float(enc.group(2)), decode_tokens=int(dec.group(1)),
                   decode_seconds=float(dec.group(2)),
                   drafted=int(drafted.group(1)) if drafted else None,
                   accepted=int(accepted.group(1)) if accepted else None)
