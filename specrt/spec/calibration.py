"""Measuring what a forward costs on this machine, and remembering it.

`forward_seconds(model, max_t)` times one forward of T = 1..max_t new tokens after a short
prefix, on a small private cache (the serving caches are untouched); `timed_together(models,
max_t)` does the same for a draft model and its target, interleaved forward by forward (each
repeat runs every T of both models in turn), so all are timed on the same machine: memory
bandwidth here swings by 1.6x within minutes, and what `auto` plans from is the draft's cost
relative to the target's and a wide verify pass's relative to a step. An engine with graphs
(`static=True`) is timed on the path its rounds take: each forward a static runner
(`specrt.model.graphs.StaticForward`), captured as a CUDA graph before it is timed on CUDA, so
the costs `auto` weighs are the graphed ones, not the eager path's launch overheads. Results
are keyed by (model, dtype, device, threads, CPU, backend build, and the models timed beside
it) and kept in memory and on disk (`$SPECRT_CACHE/calibration.json`, or `$SPECRT_CALIBRATION`,
written atomically), so a calibration runs once per machine and kernel build.
A calibration some of whose forwards another process slowed several times (`busy_sign`) is
timed again, and if that one was slowed too it serves the process that timed it but is not
saved; one that other processes' CPU time competed with throughout (`competing_sign`: it slows
every forward alike) serves its process unsaved at once, without a second try.
`specrt.spec.costs` turns them into a cost model.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import platform
import re
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable

import torch

from specrt.hub.paths import state_file
from specrt.model.files import is_regular, umask
from specrt.model.graphs import StaticForward
from specrt.model.transformer import Transformer

_PREFIX = 32          # calibration context length
_REPEATS = 3          # timed repeats of a wide forward (T > _DENSE_T)
_DENSE_REPEATS = 9    # ... of the narrow ones auto chooses between (cheap, and the noisier)
_DENSE_T = 9          # every forward size up to this is timed (K + 1 for K <= 8; auto may go
                      # to 16, a long prompt-lookup match: 10-15 are interpolated, 16 timed)
_SCHEME = "cal8"      # how a calibration times and is keyed (in its key: another scheme's entries
                      # are redone, and dropped from the file at its next save; cal4 entries may
                      # have been timed off the rounds' thread by a benchmark, cal5 keys lack
                      # the model's shape, cal6 timed one point between _DENSE_T and max_t, cal7
                      # were saved without `competing_sign`: some were timed beside a test suite)
_MAX_T = 1024         # forward sizes kept per entry (K + 1 or the backend's batch-invariant
                      # pass size, whichever is larger: a few dozen)
_MAX_SECONDS = 3600.0  # a forward time above this is a corrupt entry, not a slow machine
_MIN_SECONDS = 1e-7    # ... and below this (a CUDA graph of a one-layer toy replays in ~1e-5 s);
                       # a 5e-324 read as free made `1 / step` infinite and auto never drafted
_BUSY_SLOWER = 2.0    # a forward this many times its size's median was slowed by a process ...
_BUSY_SHARE = 0.05    # ... and more than this share of such forwards: the machine was busy
# Other processes' CPU time beyond the cores the timed threads leave free, over this share of
# the timed threads' wall time: they competed for its cores. Then every forward waits for
# descheduled threads alike, which `busy_sign` cannot see: beside one spinning process the
# 1.5B's steps read 229 ms (quiet: 116), their slowest 1.01x their median (benchmarks/RESULTS.md,
# "A calibration beside a test suite").
_COMPETING_SHARE = 0.1
_COMPETING = "other work took"   # how competing_sign's verdicts begin
try:
    _TICK = 1.0 / os.sysconf("SC_CLK_TCK")   # seconds of one /proc/stat count
except (AttributeError, ValueError, OSError):
    _TICK = 0.01
# In a key, between a model's own key and that of each model timed beside it (`timed_together`)
BESIDE = " | beside "
_TRIES = 2            # calibrations tried before one from a busy machine is used unsaved
check_busy = True     # off in the test suite, whose tests count forwards and saved entries
_cache: dict[str, list[float]] = {}
_untrusted: set[str] = set()   # in _cache, timed on a busy machine: never saved
log = logging.getLogger("specrt.spec.calibration")
_lock = threading.Lock()
# One calibration at a time in a process: two engines timing at once would slow each other, and
# their threads are this process's own time, which `CpuWatch` does not count against it.
_measuring = threading.Lock()


def calibration_key(model: Transformer, max_t: int) -> str:
    """What a forward's cost depends on: the weights (where they came from and the model's
    shape: a folder replaced by another model is timed again) and how they are stored (dtype,
    int8, the output head's shortlist), the device, threads, CPU and the build of the kernels."""
    head = None if model.head_rows is None else len(model.head_rows)
    c = model.cfg
    shape = (f"{c.num_layers}x{c.hidden_size}/{c.intermediate_size} heads {c.num_heads}/"
             f"{c.num_kv_heads}x{c.head_dim} vocab {c.vocab_size}"
             + (" tied" if c.tie_word_embeddings else ""))
    return "|".join(map(str, (model.source, shape, model.dtype, model.quant, head,
                              device_name(model.device), torch.get_num_threads(), max_t,
                              cpu_name(), model.backend.build_id, _SCHEME)))


def device_name(device: torch.device) -> str:
    """The device as the key needs it: `cpu` (the CPU's name is its own field), or a CUDA
    device with its model and compute capability (`cuda:0` alone is any GPU)."""
    if device.type != "cuda":
        return str(device)
    major, minor = torch.cuda.get_device_capability(device)
    return f"{device}:{torch.cuda.get_device_name(device)}:sm{major}{minor}"


def _key(model: Transformer, max_t: int, graphed: bool) -> str:
    return calibration_key(model, max_t) + ("|graphed" if graphed else "")


def forward_seconds(model: Transformer, max_t: int) -> list[float]:
    """Seconds of one forward of T new tokens after a _PREFIX-token prefix, T = 1..max_t
    (element 0 is T = 1). The T of `timed_points` are timed (_DENSE_REPEATS times, past
    _DENSE_T _REPEATS times, after a warm-up; each priced against T = 1 of the same repeat:
    `paired`) and the rest interpolated."""
    return timed_together([model], max_t)[0]


def timed_together(models: list[Transformer], max_t: int,
                   graphed: bool = False) -> list[list[float]]:
    """`forward_seconds` of each model, timed interleaved (each T and repeat runs every model
    in turn), so a change in the machine's speed during the calibration hits all alike and
    their ratios hold. graphed: time the static runners an engine with graphs replays."""
    keys = [_key(m, max_t, graphed) + "".join(f"{BESIDE}{_key(o, max_t, graphed)}"
                                              for o in models if o is not m)
            for m in models]
    with _lock:
        if any(k not in _cache for k in keys):
            entries, healed, _ = _load_disk()
            _cache.update(entries)
            _untrusted.difference_update(entries)    # another process's, timed quiet
            if healed:                       # rewrite a damaged file now, with the good entries
                _save_trusted()
        if (cached := _cached(keys, max_t)) is not None:
            return cached
    with _measuring:
        with _lock:                   # another thread may have timed them while this one waited
            if (cached := _cached(keys, max_t)) is not None:
                return cached
        log.info("timing the models' forwards for `auto` (once for this machine and build: "
                 "seconds to a minute; %s)", _kept_where())
        out, trusted = _measure(models, max_t, graphed)
    log.info("forward times for `auto`%s: %s", "" if trusted else " (this process only)",
             "; ".join(f"{Path(str(m.source)).name or m.source}: 1 token {c[0] * 1e3:.1f} ms, "
                       f"{max_t} tokens {c[-1] * 1e3:.1f} ms" for m, c in zip(models, out)))
    with _lock:
        _cache.update(zip(keys, out))
        if trusted:
            _untrusted.difference_update(keys)
        else:
            _untrusted.update(keys)
        _save_trusted()
    return out


def _cached(keys: list[str], max_t: int) -> list[list[float]] | None:
    """The curves of `keys` in memory, each max_t long, or None (call with _lock)."""
    if all(k in _cache and len(_cache[k]) == max_t for k in keys):
        return [_cache[k] for k in keys]
    return None


def _save_trusted() -> None:
    """Save the calibrations in memory, less those timed on a busy machine, into what is on
    disk now: another process may have saved its own since this one read the file (while this
    one measured, seconds), and a lock file keeps two writers from dropping each other's
    (call with _lock). A path that is not a regular file (`SPECRT_CALIBRATION=/dev/null`, a
    FIFO) is neither replaced nor given a lock file beside it."""
    ours = {k: v for k, v in _cache.items() if k not in _untrusted}
    if is_regular(disk_path()) is False:     # a FIFO, /dev/null: no lock file beside it
        return
    with _file_lock():
        on_disk, _, foreign = _load_disk(quiet=True)
        if foreign:                             # someone else's file: never written over
            return
        merged = {**on_disk, **ours}
        _save_disk({k: v for k, v in merged.items() if not _stale(k)})


def _kept_where() -> str:
    """Where new timings will be kept, for the log: the calibration file, or memory only where
    its path is not a regular file or holds someone else's file (`_load_disk` warned why)."""
    path = disk_path()
    if is_regular(path) is False or _load_disk(quiet=True)[2]:
        return "kept in memory only"
    return f"cached in {path}"


def _stale(key: str) -> bool:
    """A key of another calibration scheme (a `calN` field other than _SCHEME): never looked
    up again, so not kept (the file grew by every scheme's entries)."""
    return any(re.fullmatch(r"cal\d+", field) and field != _SCHEME for field in key.split("|"))


@contextlib.contextmanager
def _file_lock():
    """An exclusive lock on `<calibration file>.lock` for a read-merge-write; best effort (no
    lock where the folder cannot hold one or the platform has no flock)."""
    try:
        import fcntl
        path = disk_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(f"{path}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    except (ImportError, OSError):
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)                     # releases the lock


def _measure(models: list[Transformer], max_t: int,
             graphed: bool) -> tuple[list[list[float]], bool]:
    """(each model's curve, whether to keep it on disk). A calibration slowed by another
    process is measured once more; if that one is slowed too, its curves serve this process
    (better than none) but are not saved, so the next process measures again. One that other
    work competed with throughout (`competing_sign`) is not measured again: work that held the
    CPUs for a whole calibration is likely to hold them for the next (beside one spinning
    process, two tries took 123 s where a quiet one takes 17)."""
    for attempt in range(_TRIES):
        curves, busy = _measure_once(models, max_t, graphed)
        if busy is None:
            return curves, True
        again = attempt + 1 < _TRIES and not busy.startswith(_COMPETING)
        log.warning("the machine was busy while timing the models' forwards for `auto` (%s)%s",
                    busy, "; timing again" if again else
                    "; using these costs in this process only, and timing again next time")
        if not again:
            break
    return curves, False


def busy_sign(times: dict[int, list[list[float]]]) -> str | None:
    """Why `times` (times[T][model][repeat]) look slowed by another process, or None. Memory
    speed moves a forward's time by tens of percent over minutes; a process competing for
    the cores makes single forwards several times slower (a parallel region waits for a
    descheduled thread): on the 2-core machine with two other busy processes, 34 of 168
    forwards ran over 2x their size's median (up to 56x); with nothing else running none did
    (at most 1.25x) (benchmarks/RESULTS.md, "Serving and input hardening, and a calibration
    on a busy machine")."""
    counted = slow = 0
    for per_model in times.values():
        for reps in per_model:
            if len(reps) < 3:
                continue
            median = statistics.median(reps)
            counted += len(reps)
            slow += sum(x > _BUSY_SLOWER * median for x in reps)
    if counted and slow > _BUSY_SHARE * counted:
        return f"{slow} of {counted} timed forwards took over {_BUSY_SLOWER:g}x their median"
    return None


def competing_sign(others: float, wall: float, threads: int, cpus: int) -> str | None:
    """Why other work's CPU time (`others` CPU-seconds over `wall` seconds of timing, on the
    `cpus` CPUs this process may run on, where the timed forwards ran `threads` threads) means
    it competed for the forwards' cores, or None: what it used beyond the CPUs left free is
    over _COMPETING_SHARE of the threads' time (and over what the counters' 10 ms ticks can
    misread). A CPU left free may be a hyperthread sibling of a timed core, and a `nice`
    background job counts in full: both slow the forwards less than they weigh here."""
    threads = max(1, min(threads, cpus))
    taken = others - (cpus - threads) * wall
    if wall > 0 and taken > max(_COMPETING_SHARE * threads * wall, (cpus + 2) * _TICK):
        return (f"{_COMPETING} {others:.1f} CPU-seconds of the {cpus} CPUs this process runs "
                f"on in {wall:.1f} s (other processes, or the hypervisor's other guests), while "
                f"the forwards ran {threads} thread{'s' if threads > 1 else ''}")
    return None


class CpuWatch:
    """Other work's CPU time on the CPUs this process may run on (`usable_cpus`) between
    `start()` and `stop()`: their busy time in `/proc/stat` (user, nice, system, irq, softirq,
    and steal: a hypervisor running another guest) less this process's own (`os.times`, all
    its threads); None where the machine does not tell (not Linux)."""

    def __init__(self):
        self.cpus = usable_cpus()

    def start(self) -> "CpuWatch":
        self._t0, self._own0 = time.monotonic(), _own_cpu()
        self._busy0 = _busy_seconds(self.cpus)
        return self

    def stop(self) -> tuple[float, float] | None:
        """(others' CPU-seconds, wall seconds) since `start`, or None."""
        busy = _busy_seconds(self.cpus)
        if busy is None or self._busy0 is None:
            return None
        return busy - self._busy0 - (_own_cpu() - self._own0), time.monotonic() - self._t0


def usable_cpus() -> set[int]:
    """The CPUs this process may run on (its affinity: a pinned container or `taskset` gets
    fewer than the machine has)."""
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return set(range(os.cpu_count() or 1))


def _busy_seconds(cpus: set[int]) -> float | None:
    """CPU-seconds the given CPUs have spent running anything since boot (`/proc/stat`'s
    `cpuN` lines), or None."""
    try:
        total, seen = 0, 0
        with open("/proc/stat") as f:
            for line in f:
                fields = line.split()
                if not fields or not fields[0].startswith("cpu") or fields[0] == "cpu":
                    continue
                if int(fields[0][3:]) in cpus:
                    user, nice, system, _idle, _iowait, irq, softirq = map(int, fields[1:8])
                    steal = int(fields[8]) if len(fields) > 8 else 0
                    total += user + nice + system + irq + softirq + steal
                    seen += 1
        return total * _TICK if seen else None
    except (OSError, ValueError, AttributeError):
        return None


def _own_cpu() -> float:
    t = os.times()
    return t.user + t.system


def _measure_once(models: list[Transformer], max_t: int,
                  graphed: bool) -> tuple[list[list[float]], str | None]:
    caches, inputs = [], []
    for model in models:
        cache = model.new_cache(1, _PREFIX + max_t)
        ids = torch.randint(0, min(model.cfg.vocab_size, 1000), (1, _PREFIX + max_t),
                            generator=torch.Generator().manual_seed(0)).to(model.device)
        model.forward(ids[:, :_PREFIX], cache)
        caches.append(cache)
        inputs.append(ids)
    points = timed_points(max_t)
    passes = {t: [_pass(model, cache, ids[:, _PREFIX:_PREFIX + t], graphed)
                  for model, cache, ids in zip(models, caches, inputs)] for t in points}
    times = {t: [[] for _ in models] for t in points}
    watch = CpuWatch().start()
    # Each repeat times every T of every model in turn: what auto weighs is verify(T) against
    # verify(1) (and the draft's against the target's), so a change in the machine's speed
    # during the calibration must hit all of them alike, not whichever T was timed then.
    for rep in range(_DENSE_REPEATS + 1):
        for t in points:
            if t > _DENSE_T and rep > _REPEATS:
                continue
            for i, (model, cache, run) in enumerate(zip(models, caches, passes[t])):
                cache.truncate([_PREFIX])
                _sync(model.device)
                t0 = time.perf_counter()
                run()
                _sync(model.device)
                if rep:                               # the first is a warm-up
                    times[t][i].append(time.perf_counter() - t0)
    curves = [_curve(paired(times, i), max_t) for i in range(len(models))]
    if not check_busy:
        return curves, None
    cpu = watch.stop()           # (others' CPU-seconds, wall seconds) or None
    # The cores the timed forwards ran on: torch's threads on the CPU; on a GPU the one thread
    # that launches its kernels.
    threads = torch.get_num_threads() if all(m.device.type == "cpu" for m in models) else 1
    competing = (competing_sign(*cpu, threads, len(watch.cpus))
                 if cpu is not None else None)
    return curves, competing or busy_sign(times)


def paired(times: dict[int, list[list[float]]], i: int) -> dict[int, float]:
    """Model i's seconds per T from times[T][model][repeat]: the median over repeats of each
    repeat's own ratio to the first model's T = 1, times that forward's median. A repeat's
    forwards run within a second or two, so the ratio auto plans from (a verify pass against a
    step, the draft's against the target's) is taken while the machine ran at one speed; medians
    of each T apart mixed repeats run at different speeds: on the 2-core Zen 5 machine six
    calibrations read a 4-token pass at 1.00-1.17 steps that way, 1.06-1.14 paired over 9
    repeats, and one e2e run's calibration at 1.54 (benchmarks/RESULTS.md, "Zen 5: where a wide
    pass's time goes")."""
    ref = times[1][0]                      # the first model's T = 1, per repeat
    return {t: statistics.median(ref) * statistics.median(a / b for a, b in zip(times[t][i], ref))
            for t in times}


def timed_points(max_t: int) -> list[int]:
    """The forward sizes a calibration times: every T up to _DENSE_T (the verify passes auto
    chooses between most, and where a CPU's cost is not linear in T: its matmul kernels work
    on tiles of rows, so e.g. 5 rows can cost a tile more than 4), then 16, 32, 64, ... below
    max_t, and max_t, the rest interpolated (a wide forward grows close to linearly in T, but
    not at one slope from 16 tokens to a prompt's hundreds: its kernels change on the way)."""
    doubling = {1 << e for e in range(max_t.bit_length()) if _DENSE_T < 1 << e < max_t}
    return sorted(set(range(1, min(_DENSE_T, max_t) + 1)) | doubling | {max_t})


def _pass(model: Transformer, cache, ids: torch.Tensor, graphed: bool) -> Callable[[], None]:
    """One forward of ids [1, T] on cache, run as generation would run it: eagerly, or through
    a static runner (captured now, on CUDA, so no capture lands inside a timing)."""
    if not graphed:
        return lambda: model.forward(ids, cache)
    runner = StaticForward(model, cache, 1, ids.shape[1], use_graph=True)
    runner.ids.copy_(ids)
    runner.capture()

    def run() -> None:
        runner.replay()
        cache.note_advanced(1, ids.shape[1])
    return run


def _curve(measured: dict[int, float], max_t: int) -> list[float]:
    """Seconds for T = 1..max_t from the timed points, interpolated between them and kept
    monotone (latency cannot fall as T grows; timing noise can make it look so)."""
    points = sorted(measured)
    out = []
    for t in range(1, max_t + 1):
        lo = max(p for p in points if p <= t)
        hi = min(p for p in points if p >= t)
        w = 0.0 if hi == lo else (t - lo) / (hi - lo)
        out.append((1 - w) * measured[lo] + w * measured[hi])
    for i in range(1, len(out)):
        out[i] = max(out[i], out[i - 1])
    return out


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def cpu_name(cpuinfo: str = "/proc/cpuinfo") -> str:
    """The CPU's model name: timings from one CPU are not reused on another. Arm's cpuinfo
    names no model: its implementer and part numbers stand for it (Neoverse N1 and V1 differ)."""
    fields: dict[str, str] = {}
    try:
        with open(cpuinfo) as f:
            for line in f:
                name, sep, value = line.partition(":")
                if sep and name.strip() not in fields:
                    fields[name.strip()] = value.strip()
    except OSError:
        pass
    if fields.get("model name"):
        return fields["model name"]
    if fields.get("CPU implementer") and fields.get("CPU part"):
        return f"arm implementer {fields['CPU implementer']} part {fields['CPU part']}"
    return platform.processor() or "unknown"


def disk_path() -> Path:
    """Where calibrations are kept: $SPECRT_CALIBRATION, else $SPECRT_CACHE/calibration.json
    (both resolved by specrt.hub.paths, `~` expanded, empty meaning the default)."""
    return state_file("SPECRT_CALIBRATION", "calibration.json")


def valid_entry(key, value) -> bool:
    """A calibration is a non-empty list of forward times in seconds, T = 1, 2, ...: plausible
    (between _MIN_SECONDS and _MAX_SECONDS) and never falling as T grows (`_curve` writes no
    other; a falling one extended past its end priced long passes below nothing)."""
    return isinstance(key, str) and isinstance(value, list) and 0 < len(value) <= _MAX_T \
        and all(isinstance(x, (int, float)) and not isinstance(x, bool)
                and _MIN_SECONDS <= x < _MAX_SECONDS for x in value) \
        and all(a <= b for a, b in zip(value, value[1:]))


def foreign_text(text: str) -> bool:
    """Text no calibration file holds, even damaged: not empty, and neither a JSON object's
    start nor an object with a calibration's key (one naming a scheme, `|calN`) or none."""
    return _foreign(text, _parsed(text)[0])


def _parsed(text: str):
    """(the JSON value of `text`, None) or (None, the error that parsing it raised)."""
    try:
        return json.loads(text), None
    except (ValueError, RecursionError) as e:
        return None, e


def _foreign(text: str, raw) -> bool:
    """foreign_text, given `raw`, the text's JSON value (None where it has none: a damaged
    object is ours, and rewritten)."""
    if not text.strip():
        return False
    if not text.lstrip().startswith("{"):
        return True
    return bool(raw) and not any(isinstance(k, str) and re.search(r"\|cal\d+", k)
                                 for k in raw)


def _load_disk(quiet: bool = False) -> tuple[dict, bool, bool]:
    """(the file's valid entries, whether anything was dropped, whether the file is someone
    else's). A damaged file never breaks an `auto` request: what is bad is ignored with a
    warning (not when `quiet`: the save's re-read) and the file is rewritten; a path that is
    not a regular file, or a file that never held calibrations (not a JSON object's text:
    SPECRT_CALIBRATION pointed at the wrong file: `foreign_text`), is left alone."""
    path = disk_path()
    warn = (lambda *a: None) if quiet else log.warning
    if is_regular(path) is False:        # a FIFO would block the read for good
        warn("ignoring calibration path %s: not a regular file; calibrations are kept in "
             "memory only (set SPECRT_CALIBRATION to a file path)", path)
        return {}, False, False
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {}, False, False
    except OSError as e:                      # unreadable: permissions, I/O
        warn("ignoring calibration file %s (%s)", path, str(e)[:100])
        return {}, False, False
    except ValueError:                        # not UTF-8: not a file this module wrote
        text = "\0"
    raw, error = _parsed(text)
    if _foreign(text, raw):
        warn("calibration path %s holds a file that is not a calibration file (no JSON "
             "object of calibrations); it is left alone and calibrations are kept in memory "
             "only: set SPECRT_CALIBRATION to a new file's path", path)
        return {}, False, True
    if error is not None:                     # a damaged JSON object
        warn("ignoring calibration file %s (%s); it is rewritten after the next "
             "calibration", path, str(error)[:100])
        return {}, True, False
    good = {k: [float(x) for x in v] for k, v in raw.items() if valid_entry(k, v)}
    if len(good) < len(raw):
        warn("ignoring %d bad entr%s in calibration file %s (each must be a list of "
             "plausible seconds, never falling); the file is rewritten now", len(raw) - len(good),
             "y" if len(raw) - len(good) == 1 else "ies", path)
    return good, len(good) < len(raw), False


def _save_disk(entries: dict) -> None:
    """Best effort, atomic: a calibration that cannot be saved is simply redone next time.
    The file gets the permissions a plain open() would give it (mkstemp's are 0600: a shared
    cache's other users could not read it and timed again in every process)."""
    path = disk_path()
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-calibration-")
        with os.fdopen(fd, "w") as f:
            os.fchmod(f.fileno(), 0o666 & ~umask())
            json.dump(entries, f)
        os.replace(tmp, path)
        tmp = None
    except OSError as e:
        log.warning("could not save calibrations to %s (%s); they are redone next time", path, e)
    finally:                   # also on Ctrl-C mid-write: no stray temporary file is left
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
