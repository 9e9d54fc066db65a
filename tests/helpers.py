"""Small helpers shared by several test files: copying and editing a model directory, running
a call under a hang bound, draining submitted runs, pinning `auto`'s costs, and whether a
source imports benchmarks/."""
from __future__ import annotations

import ast
import atexit
import contextlib
import json
import shutil
import tempfile
import threading
from pathlib import Path

from specrt.errors import SpecrtError
from specrt.spec.config import SpecConfig
from specrt.spec.costs import CostModel

# The test session's scratch folder (the calibration of its tiny models, copies of model
# folders made outside a fixture's tmp_path), removed when the session ends: a copy that a
# failed check left behind, or one a hypothesis example made, must not pile up in /tmp run
# after run.
SCRATCH = Path(tempfile.mkdtemp(prefix="specrt-test-"))
atexit.register(shutil.rmtree, SCRATCH, ignore_errors=True)

# Fixed costs where drafting pays: a memory-bound verify pass (T tokens cost a little more than
# one) and a draft 20x cheaper than its target. The tiny draft is as big as its target, so on
# the real clock's calibration auto may (rightly) never draft and a test of its output would
# pass on plain rounds alone.
PAYING = CostModel(verify=[1.0 + 0.03 * t for t in range(1, 33)],
                   draft=[0.05 + 0.01 * t for t in range(1, 33)])


def drafted_k_a_round(stats: dict, k: int) -> bool:
    """Whether a request's rounds all drafted k guesses, but those its budget had no room for
    k in (`DraftContext.room`: with k or fewer tokens left, at most k - 1 rounds, each of at
    least one guess): the stats of a draft model that never stops early."""
    n, d = stats["num_draft_tokens"], stats["num_drafts"]
    return d > 0 and k * d - (k - 1) ** 2 <= n <= k * d


@contextlib.contextmanager
def slots_held_at_reserve(engine):
    """Record, for each request the engine gives a slot inside the block, how many slots were
    already held: the proof that requests shared (or did not share) a batch."""
    held = []
    reserve = engine.reserve

    def spy(request, *args, **kwargs):       # called on the scheduler's thread
        held.append(sum(row is not None for row in engine.slots))
        return reserve(request, *args, **kwargs)

    engine.reserve = spy
    try:
        yield held
    finally:
        del engine.reserve


def pin_costs(llm, spec: dict, monkeypatch) -> None:
    """Make `llm`'s auto planner for `spec` plan with PAYING costs (without a draft model: its
    verify curve alone), and time nothing."""
    def fixed(cls, target, draft, *args, **kwargs):
        return PAYING if draft is not None else CostModel(verify=PAYING.verify, draft=[])
    monkeypatch.setattr(CostModel, "calibrate", classmethod(fixed))
    planner = llm.engine.planner_for(SpecConfig(**spec))
    # if it was built before (restored after the test, as the patch above)
    monkeypatch.setattr(planner, "costs", fixed(CostModel, llm.engine.target, llm.engine.draft))


def copy_model(src: Path, dst: Path | None = None) -> Path:
    """A copy of the model directory `src` at `dst` (default: `m` in a new folder under
    SCRATCH, which the caller may remove with its parent)."""
    dst = Path(tempfile.mkdtemp(dir=SCRATCH)) / "m" if dst is None else Path(dst)
    shutil.copytree(src, dst)
    return dst


def edit_json(path: Path, mutate) -> None:
    """Rewrite the JSON file `path` as mutate(its parsed content)."""
    path = Path(path)
    path.write_text(json.dumps(mutate(json.loads(path.read_text()))))


def run_bounded(fn, seconds: float):
    """Run fn() in a daemon thread for at most `seconds`: (kind, value), kind "ok" (value: what
    it returned), "error" (a SpecrtError), "traceback" (any other exception) or "hang" (still
    running at the bound; value None)."""
    box = {}

    def target():
        try:
            box["out"] = ("ok", fn())
        except SpecrtError as e:
            box["out"] = ("error", e)
        except BaseException as e:            # noqa: BLE001 - the caller judges it
            box["out"] = ("traceback", e)

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(seconds)
    return box.get("out", ("hang", None))


def drain(runs) -> list:
    """The results of runs submitted together (`LLM.submit`), each read to its end. For
    requests that `LLM.generate` cannot batch: each with its own seed."""
    for run in runs:
        for _ in run.chunks():
            pass
    return [run.result() for run in runs]


def imports_benchmarks(source: str) -> bool:
    """Whether Python `source` imports benchmarks/ (anywhere in it, comments and strings
    aside)."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import) and any(
                a.name.split(".")[0] == "benchmarks" for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "benchmarks":
            return True
    return False
