"""Tests of the prompt-lookup n-gram matcher: C++ (specrt._ngram) and pure-Python backends.

The brute-force `reference` below is the specification. Both backends, stateless and
incremental, must agree with it exactly; both must reject bad input with the same ValueError.

The C++ tests call `_cpp()`, which FAILS (never skips) when the extension is not built: the
test command always builds it, so a missing module is a build problem to see, not hide. The
Python-fallback tests do not need the extension.
"""
import importlib.util
import random
import sys

import numpy as np
import pytest
import torch

from specrt.drafters import ngram_index
from specrt.drafters.ngram_index import PyNgramIndex, py_propose


def reference(history, k, min_n, max_n):
    """The semantics, transcribed literally."""
    for n in range(max_n, min_n - 1, -1):
        if len(history) > n:
            for i in range(len(history) - n - 1, -1, -1):
                if history[i:i + n] == history[-n:]:
                    return history[i + n:i + n + k]
    return []


def reference_agreement(history, min_n, max_n, limit):
    """How many tokens (up to limit) the history's suffix shares with the text ending where
    the matched occurrence ends: the longest matching n's most recent earlier occurrence."""
    for n in range(max_n, min_n - 1, -1):
        ends = [e for e in range(len(history) - 2, n - 2, -1)
                if history[e - n + 1:e + 1] == history[len(history) - n:]]
        if ends:
            e, j = ends[0], 0
            while j < limit and j <= e and history[e - j] == history[-1 - j]:
                j += 1
            return j
    return 0


def _cpp():
    try:
        from specrt import _ngram
    except ImportError as e:
        pytest.fail(f"specrt._ngram is not built ({e}); run `python setup.py build_ext --inplace`")
    return _ngram


def _backend(name):
    """(index class, stateless propose) of one backend."""
    if name == "cpp":
        return _cpp().NgramIndex, _cpp().propose
    return PyNgramIndex, py_propose


BACKENDS = ["cpp", "python"]

# Every (k, min_n, max_n) with all three in 1..8 and min_n <= max_n: 288 combinations.
COMBOS = [(k, lo, hi) for k in range(1, 9) for lo in range(1, 9) for hi in range(lo, 9)]
N_CASES = 20_000


@pytest.fixture(scope="module")
def differential_cases():
    """20,000 seeded (history, k, min_n, max_n, expected) cases, expected from `reference`.

    Small alphabets make matches frequent, so every branch (longest n wins, truncated draft,
    no match) is exercised many times.
    """
    rng = np.random.default_rng(20240601)
    cases = []
    for i in range(N_CASES):
        k, min_n, max_n = COMBOS[i % len(COMBOS)]
        alphabet = int(rng.choice([1, 2, 3, 4, 8, 50]))
        history = rng.integers(0, alphabet, size=int(rng.integers(0, 301))).tolist()
        cases.append((history, k, min_n, max_n, reference(history, k, min_n, max_n)))
    return cases


# ---------------------------------------------------------------- hand-written cases

HAND_WRITTEN = [
    # (history, k, min_n, max_n, expected, why)
    ([1, 2, 7, 1, 2, 9, 1, 2], 3, 1, 2, [9, 1, 2], "most recent earlier occurrence wins"),
    ([5, 1, 2, 3, 2, 3, 1, 2, 3], 2, 1, 3, [2, 3], "longest n wins over a more recent shorter"),
    ([4, 4], 5, 1, 1, [4], "draft truncated at the end of the history"),
    ([1, 2, 3], 2, 1, 3, [], "the suffix occurrence itself does not count"),
    ([], 2, 1, 3, [], "empty history"),
    ([7], 2, 1, 1, [], "len(history) must exceed n"),
    ([3, 3], 4, 1, 2, [3], "no earlier 2-gram, but a 1-gram match"),
    ([1, 2, 9, 2], 4, 2, 3, [], "only a 1-gram matches and min_n is 2"),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("history,k,min_n,max_n,expected,why", HAND_WRITTEN)
def test_hand_written(backend, history, k, min_n, max_n, expected, why):
    index_cls, propose = _backend(backend)
    assert reference(history, k, min_n, max_n) == expected, why
    assert propose(history, k, min_n, max_n) == expected, why
    index = index_cls(min_n, max_n)
    index.extend(history)
    assert index.propose(k) == expected, why


# ---------------------------------------------------------------- differential

def test_differential_cpp(differential_cases):
    ngram = _cpp()
    for history, k, min_n, max_n, expected in differential_cases:
        assert ngram.propose(history, k, min_n, max_n) == expected, (history, k, min_n, max_n)
        index = ngram.NgramIndex(min_n, max_n)
        index.extend(history)
        assert index.propose(k) == expected, (history, k, min_n, max_n)


def test_differential_python(differential_cases):
    for history, k, min_n, max_n, expected in differential_cases:
        assert py_propose(history, k, min_n, max_n) == expected, (history, k, min_n, max_n)
        index = PyNgramIndex(min_n, max_n)
        index.extend(history)
        assert index.propose(k) == expected, (history, k, min_n, max_n)


# ---------------------------------------------------------------- incremental index

@pytest.mark.parametrize("backend", BACKENDS)
def test_incremental_matches_stateless(backend):
    """After every extend (random chunk sizes, empty ones, array chunks, a reset midway)
    the index proposes exactly what the reference does on the whole history."""
    index_cls, propose = _backend(backend)
    rng = random.Random(7)
    for stream in range(150):
        min_n = rng.randint(1, 5)
        max_n = rng.randint(min_n, 6)
        alphabet = rng.choice([1, 2, 3, 5, 20])
        index = index_cls(min_n, max_n)
        history = []
        for step in range(rng.randint(1, 60)):
            if rng.random() < 0.03:
                index.reset()
                history = []
            chunk = [rng.randrange(alphabet) for _ in range(rng.choice([0, 0, 1, 1, 2, 3, 7]))]
            index.extend(np.array(chunk, dtype=np.int32) if step % 3 == 0 else chunk)
            history += chunk
            assert len(index) == len(history)
            for k in (1, 2, 5):
                expected = reference(history, k, min_n, max_n)
                assert index.propose(k) == expected, (stream, step, history, k, min_n, max_n)
                assert propose(history, k, min_n, max_n) == expected
            # the n propose matched on: the longest n that matches by itself
            want_n = next((n for n in range(max_n, min_n - 1, -1)
                           if reference(history, 1, n, n)), 0)
            assert index.match_length() == want_n, (stream, step, history, min_n, max_n)
            for limit in (0, 1, want_n, 4, 9):
                assert index.agreement(limit) == reference_agreement(
                    history, min_n, max_n, limit), (stream, step, history, limit)


@pytest.mark.parametrize("backend", BACKENDS)
def test_reset_forgets_history(backend):
    index_cls, _ = _backend(backend)
    index = index_cls(1, 2)
    index.extend([1, 2, 3, 1, 2])
    assert index.propose(2) == [3, 1]
    index.reset()
    assert len(index) == 0 and index.propose(2) == []
    index.extend([1, 2])  # [1, 2] occurred before the reset only
    assert index.propose(2) == []


@pytest.mark.parametrize("backend", BACKENDS)
def test_agreement_reaches_past_max_n(backend):
    """A copied passage agrees with its source for as long as it has been copied, however
    short the matched n-gram; the agreement is measured against the occurrence propose copies."""
    index_cls, _ = _backend(backend)
    index = index_cls(1, 2)
    source = [5, 6, 7, 8, 9, 10]
    index.extend([1, 2] + source + [3] + source[:5])
    assert index.match_length() == 2 and index.propose(1) == [10]
    assert index.agreement(100) == 5 and index.agreement(3) == 3
    index.extend([4])        # the copy broke off: no earlier 4, no match
    assert index.match_length() == 0 and index.agreement(100) == 0


# ---------------------------------------------------------------- input types

def _inputs(tokens):
    """The same token ids in every accepted container."""
    wide = np.array(tokens, dtype=np.int64)
    strided = np.repeat(wide, 2)[::2]  # non-contiguous view
    assert not strided.flags.c_contiguous
    return {
        "list": list(tokens),
        "tuple": tuple(tokens),
        "list of numpy ints": [np.int64(t) for t in tokens],
        "int32 numpy": wide.astype(np.int32),
        "int64 numpy": wide,
        "uint16 numpy": wide.astype(np.uint16),
        "uint64 numpy": wide.astype(np.uint64),
        "strided int64 numpy": strided,
        "int32 torch": torch.tensor(tokens, dtype=torch.int32),
        "int64 torch": torch.tensor(tokens, dtype=torch.int64),
    }


@pytest.mark.parametrize("backend", BACKENDS)
def test_input_types_agree(backend):
    index_cls, propose = _backend(backend)
    rng = random.Random(3)
    history = [rng.randrange(6) for _ in range(200)]
    expected = reference(history, 4, 1, 3)
    assert expected  # a 6-letter alphabet over 200 tokens always repeats a 3-gram
    for name, tokens in _inputs(history).items():
        assert propose(tokens, 4, 1, 3) == expected, name
        index = index_cls(1, 3)
        index.extend(tokens)
        assert index.propose(4) == expected, name
        assert all(type(t) is int for t in index.propose(4)), name


# ---------------------------------------------------------------- bad input

RANGE = "token ids must be integers in [0, 2147483647], got "

SHAPE = "tokens must be a list, tuple or 1-D array of token ids, got "

BAD_TOKENS = {
    # id: (tokens, exact message, the same for both backends)
    "negative": ([1, -1, 2], RANGE + "-1 at index 1"),
    "above-int32": ([1, 2**31], RANGE + "2147483648 at index 1"),
    "above-int64": ([2**80], RANGE + f"{2**80} at index 0"),
    "float": ([1, 2.0], RANGE + "2.0 of type float at index 1"),
    "bool": ([True, 1], RANGE + "True of type bool at index 0"),
    "str": ([1, "2"], RANGE + "'2' of type str at index 1"),
    "None": ([1, None], RANGE + "None of type NoneType at index 1"),
    "negative-array": (np.array([3, -4]), RANGE + "-4 at index 1"),
    "above-int32-array": (np.array([5, 2**40]), RANGE + "1099511627776 at index 1"),
    "float-array": (np.array([1.0, 2.0]), RANGE + "an array of dtype float64"),
    "bool-array": (np.array([True]), RANGE + "an array of dtype bool"),
    "float-tensor": (torch.tensor([1.5]), RANGE + "an array of dtype float32"),
    "2-D-array": (np.zeros((2, 2), dtype=np.int64), SHAPE + "a 2-D ndarray"),
    "scalar": (7, SHAPE + "a 0-D int"),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("tokens,message", BAD_TOKENS.values(), ids=BAD_TOKENS.keys())
def test_bad_tokens(backend, tokens, message):
    index_cls, propose = _backend(backend)
    index = index_cls(1, 2)
    index.extend([1, 2, 1])
    with pytest.raises(ValueError) as e:
        index.extend(tokens)
    assert str(e.value) == message
    assert len(index) == 3 and index.propose(3) == [2, 1]  # nothing was appended
    with pytest.raises(ValueError) as e:
        propose(tokens, 2, 1, 2)
    assert str(e.value) == message


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_token_list_emptied_while_it_is_read_is_no_crash(backend):
    """An id whose __index__ empties the list it sits in: C++ read the freed item array
    (SIGSEGV); now it raises, or reads what the list holds, and the index is unchanged."""
    index_cls, propose = _backend(backend)

    class Shrinks:
        def __init__(self, lst):
            self.lst = lst

        def __index__(self):
            del self.lst[:]
            [bytearray(64) for _ in range(20_000)]      # reuse the freed memory
            return 5

    for call in ("propose", "extend"):
        lst = [1, 1, None] + [7] * 10_000
        lst[2] = Shrinks(lst)
        index = index_cls(1, 3)
        run = (lambda: propose(lst, 4, 1, 3)) if call == "propose" else (lambda: index.extend(lst))
        if backend == "cpp":          # C++ sees the list shrink under it and says so
            with pytest.raises(ValueError, match="changed size while it was read"):
                run()
            assert len(index) == 0
        else:                         # Python reads whatever the list holds: no error is owed
            run()


@pytest.mark.parametrize("backend", BACKENDS)
def test_bad_sizes(backend):
    index_cls, propose = _backend(backend)
    index = index_cls(1, 2)
    for k in (0, -3):
        with pytest.raises(ValueError, match=rf"^k must be >= 1, got {k}$"):
            index.propose(k)
        with pytest.raises(ValueError, match=rf"^k must be >= 1, got {k}$"):
            propose([1, 2], k, 1, 2)
    cases = [((0, 2), "min_n must be >= 1, got 0"),
             ((-1, -2), "min_n must be >= 1, got -1"),
             ((3, 2), "min_n must be <= max_n, got min_n=3, max_n=2"),
             # one table per length, made up front: 2**31 - 1 tried to reserve ~64 GB
             ((1, 1025), "max_n must be <= 1024, got 1025"),
             ((1, 2**31 - 1), f"max_n must be <= 1024, got {2**31 - 1}"),
             ((1, 2**40), f"max_n must be <= 1024, got {2**40}")]
    for (min_n, max_n), message in cases:
        with pytest.raises(ValueError) as e:
            index_cls(min_n, max_n)
        assert str(e.value) == message
        with pytest.raises(ValueError) as e:
            propose([1, 2], 2, min_n, max_n)
        assert str(e.value) == message
    index_cls(1, ngram_index.MAX_NGRAM)                   # the longest allowed
    # Past int32 (the C++ binding took C ints: a TypeError "incompatible function arguments"
    # where the fallback answered): k and limit mean "all there is".
    full = index_cls(1, 2)
    full.extend([1, 2, 3, 1, 2])
    assert full.propose(2**31) == full.propose(2**40) == [3, 1, 2]
    assert full.agreement(2**31) == full.agreement(2**40) == 2
    assert propose([1, 2, 3, 1, 2], 2**40, 1, 2) == [3, 1, 2]
    with pytest.raises(ValueError, match=rf"^k must be >= 1, got {-2**31 - 1}$"):
        full.propose(-2**31 - 1)
    # Sizes are checked before tokens, in both backends.
    with pytest.raises(ValueError, match="^k must be"):
        propose([-1], 0, 1, 2)
    # Past int64 (the C++ binding's int64_t: pybind11's TypeError where the fallback
    # answered or raised its ValueError): the same answer, or the same check's ValueError.
    assert full.propose(2**63) == full.propose(2**70) == [3, 1, 2]
    assert full.agreement(2**63) == full.agreement(2**70) == 2
    assert propose([1, 2, 3, 1, 2], 2**70, 1, 2) == [3, 1, 2]
    with pytest.raises(ValueError, match="^k must be >= 1, got -"):
        full.propose(-2**70)
    with pytest.raises(ValueError, match="^k must be >= 1, got -"):
        propose([1, 2], -2**70, 1, 2)
    for sizes, check in [((1, 2**63), "^max_n must be <= 1024, got "),
                         ((-2**70, 2), "^min_n must be >= 1, got -"),
                         ((2**70, 2), "^min_n must be <= max_n, got ")]:
        with pytest.raises(ValueError, match=check):
            index_cls(*sizes)
        with pytest.raises(ValueError, match=check):
            propose([1, 2], 2, *sizes)
    # Not an integer at all: TypeError, as for any Python integer argument.
    with pytest.raises(TypeError):
        index.propose(2.5)
    with pytest.raises(TypeError):
        index_cls(1.0, 2)
    with pytest.raises(TypeError):         # the fallback compared 1.5 <= 0 and answered
        full.agreement(1.5)


# ---------------------------------------------------------------- backend selection

def test_backend_is_cpp_when_built():
    _cpp()
    assert ngram_index.BACKEND == "cpp"
    assert ngram_index.NgramIndex is _cpp().NgramIndex
    assert ngram_index.propose is _cpp().propose


def test_fallback_when_extension_missing(monkeypatch, caplog):
    """Without specrt._ngram the module still imports, says so once (a `specrt` log record,
    not a warning), and picks Python."""
    import warnings

    import specrt
    from specrt import logs

    monkeypatch.setitem(sys.modules, "specrt._ngram", None)  # makes the import fail
    monkeypatch.delattr(specrt, "_ngram", raising=False)
    monkeypatch.setattr(logs, "_reported", set())
    spec = importlib.util.spec_from_file_location("ngram_index_no_cpp", ngram_index.__file__)
    module = importlib.util.module_from_spec(spec)
    with caplog.at_level("INFO", logger="specrt"), warnings.catch_warnings():
        warnings.simplefilter("error")
        spec.loader.exec_module(module)
        spec.loader.exec_module(module)     # a second import says nothing more
    notes = [r for r in caplog.records if "specrt._ngram" in r.getMessage()]
    assert len(notes) == 1 and notes[0].name == "specrt"
    assert "pure-Python fallback" in notes[0].getMessage()
    assert module.BACKEND == "python"
    assert module.NgramIndex is module.PyNgramIndex
    assert module.propose is module.py_propose

