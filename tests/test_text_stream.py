"""Streaming detokenization: `TextStream` shows exactly what decoding everything at once would,
held back only where a character or a stop string is unfinished, in time bounded per token.

The spec is `reference_deltas`: decode all ids after every token, search the whole text."""
from __future__ import annotations

import random

import pytest

from specrt.api.text_stream import TextStream, unfinished
from specrt.api.tokenizer import Tokenizer


class CharTok:      # each id is one character
    def decode(self, ids):
        return "".join(chr(i) for i in ids)


class ByteTok:      # each id is one byte
    def decode(self, ids):
        return bytes(ids).decode("utf-8", errors="replace")


class FallbackTok:
    """A byte-fallback decoder as tokenizers' ByteFallback: ids below 256 are byte tokens,
    the others the piece chr(id - 256); a run of byte tokens decodes as a whole, and if it is
    not UTF-8 (a character cut at its end included) every byte of it becomes U+FFFD."""
    def decode(self, ids):
        out, run = [], []
        for t in [*ids, None]:
            if t is not None and t < 256:
                run.append(t)
                continue
            if run:
                try:
                    out.append(bytes(run).decode("utf-8"))
                except UnicodeDecodeError:
                    out.append("\ufffd" * len(run))
                run = []
            if t is not None:
                out.append(chr(t - 256))
        return "".join(out)

    def byte_ids(self):
        return frozenset(range(256))

    @staticmethod
    def encode(text):           # as SentencePiece models with byte fallback: ASCII pieces,
        return [i for c in text for i in ([256 + ord(c)] if c.isascii()    # other characters
                                          else list(c.encode()))]           # as bytes


class StripTok(ByteTok):
    """A decoder that is not local: it drops the text's leading spaces (as Metaspace-style
    decoders drop the first token's), so decoding a window apart differs from together."""
    def decode(self, ids):
        return super().decode(ids).lstrip(" ")


class Counting:
    def __init__(self, tok):
        self.tok, self.decoded = tok, 0

    def decode(self, ids):
        self.decoded += len(ids)
        return self.tok.decode(ids)


def open_chars(tok, ids, text):
    """How many of the text's last characters later tokens may still change."""
    run = 0
    while run < len(ids) and ids[-1 - run] in getattr(tok, "byte_ids", frozenset)():
        run += 1
    ahead = len(text) - len(tok.decode(ids[:len(ids) - run])) if run else 0
    return max(unfinished(text), ahead)


def reference_deltas(tok, stop, pushes):
    """(deltas, stopped, ids kept, final text): the whole text decoded after every token.

    The text's last characters that later tokens may still change (`open_chars`: up to 3
    U+FFFD placeholders of a character whose bytes have not all arrived, or all that a
    byte-fallback decoder's trailing run of byte tokens decodes to) are not shown until
    later tokens leave them in place, nor is the longest suffix of the rest that is a proper
    prefix of a stop string (it may yet grow into one). The first stop string in the text stops
    it, unless it ends in them: then the text stops once later tokens leave it in place (or no
    token follows), and nothing from it on is shown meanwhile. Each stop string's place counts
    its ids up to the token that first completed it there."""
    ids, shown, deltas, seen = [], 0, [], {}
    for chunk, final in pushes:
        text, stopped_at = None, None
        for i, t in enumerate(chunk):
            ids.append(t)
            text = tok.decode(ids)
            hits = [(at, at + len(s), s) for s in stop for at in (text.find(s),) if at >= 0]
            seen = {h: seen.get(h, len(ids)) for h in hits}
            if not hits:
                continue
            first = min(hits)
            if first[1] > len(text) - open_chars(tok, ids, text) and not (final and
                                                                          i == len(chunk) - 1):
                continue
            stopped_at = first
            break
        if text is None:
            text = tok.decode(ids)
        if stopped_at is None and final and seen:
            stopped_at = min(seen)
        if stopped_at is not None:
            deltas.append(text[shown:stopped_at[0]])
            return deltas, True, seen[stopped_at], text[:stopped_at[0]]
        end = len(text)
        if not final:
            end -= open_chars(tok, ids, text)
            end -= max((n for s in stop for n in range(1, min(len(s) - 1, end) + 1)
                        if text[:end].endswith(s[:n])), default=0)
        if seen:
            end = min(end, min(seen)[0])
        end = max(end, shown)
        deltas.append(text[shown:end])
        shown = end
    return deltas, False, len(ids), tok.decode(ids)


def run_stream(tok, stop, pushes):
    ts = TextStream(tok, stop)
    deltas = []
    for chunk, final in pushes:
        deltas.append(ts.push(chunk, final=final))
        if ts.stopped:
            return deltas, True, ts.stop_token_count, ts.text
    return deltas, False, len(ts.ids), ts.text


TEXTS = [
    "def quicksort(xs):\n    if len(xs) <= 1:\n        return xs\n" * 6,
    "Grüße aus Köln — 東京の天気は晴れです。🙂🚀 naïve café " * 8,
    "  leading spaces,\n\n\nblank lines\t\ttabs and END markers; stop STOP ST" * 5,
]


def pushes_of(ids, rng):
    out, i = [], 0
    while i < len(ids):
        n = rng.choice([1, 1, 2, 3, 5, 17])
        out.append((ids[i:i + n], i + n >= len(ids)))
        i += n
    return out


def cases(tok, encode, seed):
    rng = random.Random(seed)
    for text in TEXTS:
        ids = encode(text)
        for stop in ([], ["STOP"], ["\n\n\n"], ["晴れ", "🚀"], [text[150:190]], ["never there"],
                     ["\ufffd", "STOP"]):
            yield ids, stop, pushes_of(ids, rng)


@pytest.mark.parametrize("name", ["chars", "bytes", "strip", "fallback"])
def test_equals_decoding_everything_at_once(name):
    tok = {"chars": CharTok(), "bytes": ByteTok(), "strip": StripTok(),
           "fallback": FallbackTok()}[name]
    encode = {"chars": lambda s: [ord(c) for c in s], "fallback": FallbackTok.encode}.get(
        name, lambda s: list(s.encode()))
    for ids, stop, pushes in cases(tok, encode, seed=len(name)):
        deltas, stopped, kept, text = run_stream(tok, stop, pushes)
        assert (deltas, stopped, kept, text) == reference_deltas(tok, stop, pushes), stop
        # what was shown is the text: no placeholder shown that became another character
        assert "".join(deltas) == text, stop


def test_equals_decoding_everything_at_once_with_a_bpe_tokenizer(tiny_noeos_dir):
    tok = Tokenizer(tiny_noeos_dir)
    for ids, stop, pushes in cases(tok, tok.encode, seed=3):
        assert run_stream(tok, stop, pushes) == reference_deltas(tok, stop, pushes), stop


@pytest.mark.parametrize("stop", [[], ["STOP"]])
@pytest.mark.parametrize("text", ["prose", "invalid bytes"])
def test_work_per_token_does_not_grow_with_the_text(stop, text):
    """Decoding all ids after every token made a 4,000-token answer with a stop string cost
    ~1 ms per token on the real tokenizer (quadratic); ids decoded per token must stay flat,
    also through a run of bytes that are no UTF-8 (the window never settled inside a run of
    U+FFFD: 172 -> 672 ids decoded per token from 1,000 to 4,000 tokens)."""
    ids = list(("ab\u00e9\u6771 " * 1000).encode())[:4000] if text == "prose" else [0xFF] * 4000
    per_token = []
    for n in (1000, 4000):
        tok = Counting(ByteTok())
        ts = TextStream(tok, stop)
        for i in range(0, n, 3):
            ts.push(ids[i:min(i + 3, n)], final=i + 3 >= n)
        assert ts.text == ByteTok().decode(ids[:n])
        per_token.append(tok.decoded / n)
    assert per_token[1] < 1.2 * per_token[0] and per_token[1] < 200, per_token


def test_a_decoder_that_strips_a_leading_space_still_settles():
    """SentencePiece-style decoders drop the text's first space: a split before an id that
    starts with a space changes the text, the others do not; the window must settle at those
    (it used to give up at the first unsafe place and grow without end: quadratic again)."""
    ids = list((" a" * 2000).encode())        # every first split tried is before a space
    tok = Counting(StripTok())
    ts = TextStream(tok, ["mat!"])
    shown = "".join(ts.push(ids[i:i + 2]) for i in range(0, len(ids), 2))
    shown += ts.push([], final=True)
    assert shown == StripTok().decode(ids)
    assert len(ts.ids) - ts._base < 64 and tok.decoded / len(ids) < 200, tok.decoded / len(ids)


def test_a_non_local_decoder_keeps_its_window():
    """Where splitting would change the text, nothing is split (the window grows)."""
    ts = TextStream(StripTok(), None)
    ids = list(("x " + " " * 40 + "y") .encode())
    shown = "".join(ts.push([t]) for t in ids) + ts.push([], final=True)
    assert shown == StripTok().decode(ids)


def test_stop_string_spanning_two_rounds_is_never_shown():
    ts = TextStream(CharTok(), ["STOP"])
    shown = ts.push([ord(c) for c in "hello ST"])   # "ST" may begin the stop string: held back
    assert shown == "hello "
    shown += ts.push([ord(c) for c in "OP and more"])
    assert shown == "hello " and ts.stopped and ts.text == "hello "
    assert ts.stop_token_count == len("hello STOP")
    ts2 = TextStream(CharTok(), ["STOP"])
    out = ts2.push([ord(c) for c in "a ST"]) + ts2.push([ord(c) for c in "ep"], final=True)
    assert out == "a STep" and not ts2.stopped       # a false alarm is released


def test_a_stop_string_far_into_a_long_text_is_found_at_its_first_place():
    body = "".join(f"line {i}\n" for i in range(600))
    ts = TextStream(CharTok(), ["line 517\n", "line 5"])
    shown = ""
    for i in range(0, len(body), 7):
        shown += ts.push([ord(c) for c in body[i:i + 7]])
        if ts.stopped:
            break
    first = body.find("line 5")
    assert ts.stopped and ts.text == body[:first] == shown
    assert ts.stop_token_count == first + len("line 5")


def test_incomplete_utf8_is_held_back():
    ts = TextStream(ByteTok(), None)
    euro = list("€".encode())
    assert ts.push([ord("a")] + euro[:2]) == "a"
    assert ts.push(euro[2:]) == "€"


def test_a_stop_string_over_an_unfinished_character_waits_for_it():
    """U+FFFD at the end of the text may be a character whose bytes have not all arrived: a
    stop string ending in it stops the text only once the placeholder is shown to be real,
    its ids counted to the token that completed it."""
    x, lead, rest = ord("x"), 0xE4, [0xB8, 0xAD]          # "中" is E4 B8 AD
    ts = TextStream(ByteTok(), ["x\ufffd"])
    shown = ts.push([x, lead]) + ts.push(rest)
    assert not ts.stopped and shown == "x中"              # a placeholder, not a stop
    for pushes in ([([x, lead], False), ([ord("y")], True)],   # a later byte: it was real
                   [([x, lead], True)],                    # the end: it was real
                   [([x], False), ([lead], False), ([], True)]):
        ts = TextStream(ByteTok(), ["x\ufffd"])
        shown = "".join(ts.push(ids, final=final) for ids, final in pushes)
        assert ts.stopped and ts.text == shown == "" and ts.stop_token_count == 2, pushes
    ok = list(b"ok")
    for stop, ids, text, count in [
            (["\ufffd", "。"], ok + [0xE3, 0x80, 0x82], "ok", 5),   # the placeholder was "。"
            (["a\ufffd", "a中"], [0x61, 0xE4, 0xB8, 0xAD], "", 4),    # ... the "中" of "a中"
            # an invalid byte's real U+FFFD waits while an earlier match may still be real
            (["a\ufffd\ufffd", "\ufffd"], [0x61, 0xE4, 0xF0, 0x9F, 0x98, 0x80], "a", 2)]:
        ts = TextStream(ByteTok(), stop)
        shown = "".join(ts.push([t]) for t in ids)
        assert ts.stopped and ts.text == shown == text and ts.stop_token_count == count, stop


def test_a_run_hands_out_no_ids_past_a_stop_string_that_may_be_real():
    """The ids of a round past a stop string still in doubt wait with its text: handed out
    at once, they could not be taken back once it proves real."""
    from specrt.api.run import TextRun
    from specrt.engine.request import Step

    class Handle:
        request_id, cancelled = "r", False

        def cancel(self):
            self.cancelled = True

    rounds = [[0x78, 0xF0, 0x9F], [0x79, 0x7A]]     # "x" + an unfinished 4-byte character
    for stop, kept, shown in [(["x\ufffd"], [[0x78, 0xF0], []], ""),
                              (["zz"], rounds, "x\ufffdyz")]:
        run = TextRun(Handle(), TextStream(ByteTok(), stop))
        chunks = [run._chunk(Step("r", i + 1, ids, "plain", [], 0)) for i, ids in
                  enumerate(rounds)]
        assert [c.token_ids for c in chunks] == kept, stop
        assert "".join(c.text for c in chunks) + run.stream.push([], final=True) == shown
        assert (chunks[-1].finish_reason == "stop") == (stop == ["x\ufffd"])


def test_a_real_byte_fallback_tokenizer_streams_its_text(tmp_path):
    """tokenizers' ByteFallback decoder, through specrt's Tokenizer: a run of byte tokens
    decodes as a whole, so an emoji already complete turns back into U+FFFD while the next
    one's bytes arrive. Streamed one token at a time the text is the final text, and a U+FFFD
    stop string never fires on those placeholders (before: 'a😀���' shown for 'a😀😀',
    and the stop cut the answer to 'a')."""
    from tokenizers import Tokenizer as RawTokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "a": 1, "b": 2, **{f"<0x{b:02X}>": 3 + b for b in range(256)}}
    raw = RawTokenizer(models.BPE(vocab=vocab, merges=[], byte_fallback=True,
                                  unk_token="<unk>"))
    raw.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                     decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="<unk>").save_pretrained(
        str(tmp_path))
    tok = Tokenizer(tmp_path)
    assert len(tok.byte_ids()) == 256
    for text in ("a😀😀b", "ab中文a🚀", "😀😀"):
        ids = raw.encode(text).ids
        for stop in ([], ["\ufffd"], ["\ufffdb"]):
            ts = TextStream(tok, stop)
            shown = "".join(ts.push([t]) for t in ids) + ts.push([], final=True)
            assert not ts.stopped and shown == ts.text == text, (text, stop)
        cut = ids[:max(i for i, t in enumerate(ids) if t > 2)]    # ends inside a character:
        ts = TextStream(tok, ["\ufffd"])          # all its run is U+FFFD, and the stop is real
        shown = "".join(ts.push([t]) for t in cut) + ts.push([], final=True)
        whole = tok.decode(cut)
        assert ts.stopped and shown == ts.text == whole[:whole.index("\ufffd")], text


class Counted(str):
    """A stop string that counts its characters read (indexing and slicing)."""
    reads = 0

    def __getitem__(self, key):
        Counted.reads += 1
        return str.__getitem__(self, key)


def test_text_that_may_grow_into_a_stop_string_is_found_in_time_per_character():
    """Each push tried every prefix length of every stop string against the text's end: 256
    stop strings of 2,000 characters held a server's event loop for ~30 s of one answer. The
    held text is now followed character by character (a KMP automaton per stop string): its
    reads stay within a few per character of text and of stop string, however long the
    strings, and what is shown still equals the reference, on self-overlapping stop strings
    whose partial matches restart inside themselves."""
    text = ("abab" * 200 + "abac" + "aab" * 50) * 2
    stops = ["ab" * 199 + "ad", "a" * 300 + "b", "aba" + "c" * 397, "ba" * 199 + "d",
             "x" * 400, "q" + "ab" * 200]
    assert not any(s in text for s in stops)      # held and released, never found
    Counted.reads = 0
    ts = TextStream(CharTok(), [Counted(s) for s in stops])
    pushes = [([ord(c) for c in text[i:i + 3]], i + 3 >= len(text))
              for i in range(0, len(text), 3)]
    shown = "".join(ts.push(chunk, final=final) for chunk, final in pushes)
    assert shown == text and not ts.stopped
    assert Counted.reads <= sum(4 * len(text) + 4 * len(s) for s in stops), Counted.reads
    small = ["abab" + "ad", "aaab", "abaa", "babd", "xxxx"]
    short = text[:300]
    pushes = [([ord(c) for c in short[i:i + 2]], i + 2 >= len(short))
              for i in range(0, len(short), 2)]
    assert run_stream(CharTok(), small, pushes) == reference_deltas(CharTok(), small, pushes)
