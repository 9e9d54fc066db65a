"""Adaptive speculation ("auto"): K follows acceptance, and output stays exact."""
import dataclasses
import json
import time
from types import SimpleNamespace

import pytest
import torch

import specrt
from specrt.spec.planners.adaptive import (GOES, LUMP_PREMIUM, MIN_HORIZON, PRIOR_COUNT,
                                          PRIORS, PROBE_BASE, UNSURE, WEIGHT,
                                          AdaptivePlanner, _learn,
                                          expected_tokens, pooled)
from specrt.engine.request import Request
from specrt.spec.config import SpecConfig
from specrt.spec.sampling import SamplingParams
from specrt.spec.calibration import forward_seconds
from specrt.spec.costs import PROMPT_ROWS, CostModel
from tests.helpers import PAYING, pin_costs, slots_held_at_reserve
from specrt.spec.drafters.base import NO_DRAFT, Proposal

PROMPTS = [[5, 6, 7, 8], list(range(40, 70)), [250, 3]]


class OracleDrafter:
    """Knows the plain greedy answer: proposes it (always right) or a shifted copy (always
    wrong). Costs nothing, so only acceptance drives the planner."""

    name = "draft_model"
    cut_short = True

    def __init__(self, prompts, answers, vocab, right=True):
        self.full = [p + a for p, a in zip(prompts, answers)]
        self.vocab, self.right = vocab, right
        self.calls = 0

    def reset(self, rows):
        self.calls = 0

    def propose(self, ctx, k):
        self.calls += 1
        tokens = torch.full((len(ctx.histories), k), NO_DRAFT)
        for b, h in enumerate(ctx.histories):
            nxt = self.full[b][len(h):len(h) + k]
            if not self.right:
                nxt = [(t + 1) % self.vocab for t in nxt]
            tokens[b, : len(nxt)] = torch.tensor(nxt, dtype=torch.int64)
        return Proposal(tokens=tokens, probs=None, counts=[int((r >= 0).sum()) for r in tokens])

    def rollback(self, num_accepted):
        pass

    def lags(self, ctx):
        return [1 if a else 0 for a in ctx.active]


@pytest.fixture(scope="module")
def llm(tiny_noeos_dir, tiny_draft_dir):
    return specrt.LLM(tiny_noeos_dir, draft=tiny_draft_dir, max_seq_len=256, max_batch_size=3,
                      dtype="float32")


def _run_with(llm, drafter, n_new, max_k=8):
    answers = [llm.generate(p, max_new_tokens=n_new).token_ids for p in PROMPTS[:1]]
    oracle = drafter(PROMPTS[:1], answers)
    # A memory-bound cost curve (verifying T tokens costs a little more than 1): fixed numbers
    # keep the test independent of how busy the machine is; the planner only rescales them.
    costs = CostModel(verify=[1.0 + 0.03 * t for t in range(max_k + 1)],
                      draft=[0.2 + 0.01 * t for t in range(max_k + 1)])
    planner = AdaptivePlanner(max_k, costs, draft_model=oracle, ngram=None)
    request = Request(tuple(PROMPTS[0]), n_new, SamplingParams(),
                      SpecConfig(method="draft_model", num_speculative_tokens=max_k))
    steps = [s for batch in llm.engine.run([request], planner=planner) for s in batch]
    plans = [s.plan for s in steps]
    assert [t for s in steps for t in s.new_tokens] == answers[0]
    return plans, oracle


def _heard(llm, prompt, n_new, params):
    """(plan label, whether it asked, what observe heard) of each round of a request whose
    draft model is too dear to ever pay (every round a plain step), and its tokens."""
    heard = []
    planner = AdaptivePlanner(4, CostModel(verify=[1.0] * 5, draft=[50.0] * 5),
                              draft_model=llm.engine.draft_drafter)
    observe = planner.observe

    def spy(plan, *args, target_sure=None, **kwargs):
        heard.append((plan.label, plan.wants_sure, target_sure))
        return observe(plan, *args, target_sure=target_sure, **kwargs)

    planner.observe = spy
    request = Request(tuple(prompt), n_new, params,
                      SpecConfig(method="draft_model", num_speculative_tokens=4))
    out = [t for batch in llm.engine.run([request], planner=planner) for s in batch
           for t in s.new_tokens]
    return heard, out


def test_a_plain_step_reports_how_sure_the_target_was_of_its_token(llm):
    """Every round a plain step: each asks how sure the target was, and hears the softmax's
    top-1 probability of the logits that chose the token the step committed, as a
    teacher-forced pass over the answer computes it."""
    from specrt.spec.sampling import confidence

    prompt, n_new = PROMPTS[1], 12
    heard, out = _heard(llm, prompt, n_new, SamplingParams())
    assert out == llm.generate(prompt, max_new_tokens=n_new).token_ids
    target = llm.target
    with torch.inference_mode():
        logits = target.forward(torch.tensor([prompt + out]),
                                target.new_cache(1, len(prompt) + n_new))[0]     # [T, V]
    # the prefill chose out[0]; round j's plain step chose out[j + 1]
    want = confidence(logits[len(prompt):len(prompt) + n_new - 1]).tolist()
    assert [(label, asked) for label, asked, _ in heard] == [("plain", True)] * (n_new - 1)
    assert [s[0] for _, _, s in heard] == pytest.approx(want, rel=1e-4)


def test_an_engine_with_graphs_hears_nothing(tiny_noeos_dir, tiny_draft_dir):
    """Static rounds (CUDA graphs; run eagerly on the CPU) read nothing back for `auto`: it
    plans from the prior there, as the replay of such an engine does."""
    graphs = specrt.LLM(tiny_noeos_dir, draft=tiny_draft_dir, max_seq_len=256,
                        dtype="float32", cuda_graphs=True)
    try:
        heard, out = _heard(graphs, PROMPTS[1], 8, SamplingParams())
        assert out == graphs.generate(PROMPTS[1], max_new_tokens=8).token_ids
    finally:
        graphs.close()
    assert heard and all(s is None for _, _, s in heard)


def test_a_sampled_plain_step_is_not_heard(llm):
    """The draft's agreement the target's confidence stands for was measured on greedy
    answers: a sampled request's plain steps report nothing (its rounds still ask)."""
    heard, out = _heard(llm, PROMPTS[1], 8, SamplingParams(temperature=0.8, seed=3))
    assert len(out) == 8 and heard and all(asked for _, asked, _ in heard)
    assert all(s is None for _, _, s in heard)


def test_always_right_draft_grows_k_to_max(llm):
    vocab = llm.target.cfg.vocab_size
    plans, _ = _run_with(llm, lambda p, a: OracleDrafter(p, a, vocab, right=True), 120)
    assert plans[-3:-1] == ["draft_model:8", "draft_model:8"]


def test_always_wrong_draft_drops_to_plain_and_is_not_called(llm):
    vocab = llm.target.cfg.vocab_size
    plans, oracle = _run_with(llm, lambda p, a: OracleDrafter(p, a, vocab, right=False), 100)
    rounds = plans[1:]
    assert rounds.count("plain") >= 0.85 * len(rounds)
    # after the first rejections it only probes, with a growing gap
    assert oracle.calls <= 3 + len(rounds) // PROBE_BASE
    assert all(p == "plain" for p in rounds[-PROBE_BASE + 1:]) or rounds[-1] == "draft_model:1"


def test_expected_tokens_formula():
    assert expected_tokens([0.5] * 4, 4) == pytest.approx((1 - 0.5 ** 5) / (1 - 0.5))
    assert expected_tokens([1.0] * 8, 8) == 9
    assert expected_tokens([0.9, 0.0, 0.9], 3) == pytest.approx(1.9)


@pytest.mark.parametrize("batch", [1, 3])
def test_auto_greedy_equals_plain(llm, batch, monkeypatch):
    spec = {"method": "auto", "num_speculative_tokens": 6}
    pin_costs(llm, spec, monkeypatch)
    prompts = PROMPTS[:batch]
    plain = [llm.generate(p, max_new_tokens=48).token_ids for p in prompts]
    res = llm.generate(prompts, max_new_tokens=48, speculative=spec)
    assert [r.token_ids for r in res] == plain
    for r in res:
        hist = r.stats["plan_histogram"]
        assert sum(hist.values()) == r.stats["target_passes"] - 1   # every round planned
        assert any(k.startswith("draft_model:") for k in hist), hist   # and it did draft


def test_auto_without_draft_model_tunes_ngram(tiny_noeos_dir, monkeypatch):
    llm = specrt.LLM(tiny_noeos_dir, max_seq_len=256, dtype="float32")
    spec = {"method": "auto", "num_speculative_tokens": 4}
    pin_costs(llm, spec, monkeypatch)
    prompt = [7, 8, 9, 10, 11, 12] * 6
    plain = llm.generate(prompt, max_new_tokens=40).token_ids
    res = llm.generate(prompt, max_new_tokens=40, speculative=spec)
    assert res.token_ids == plain
    hist = res.stats["plan_histogram"]
    assert all(k == "plain" or k.startswith("ngram:") for k in hist), hist
    assert any(k.startswith("ngram:") for k in hist), hist               # it did draft
    llm.close()


def test_a_draft_and_its_target_are_calibrated_interleaved(llm, tmp_path, monkeypatch):
    """The cost model times the draft and the target forward by forward in turn, so a change
    in the machine's speed hits both alike; the pair is cached under keys naming both."""
    from specrt.spec import calibration

    monkeypatch.setenv("SPECRT_CALIBRATION", str(tmp_path / "calibration.json"))
    monkeypatch.setattr(calibration, "_cache", {})
    target, draft = llm.engine.target, llm.engine.draft
    order = []
    for name, model in (("target", target), ("draft", draft)):
        def timed(*args, _forward=model.forward, _name=name, **kw):
            order.append(_name)
            return _forward(*args, **kw)
        monkeypatch.setattr(model, "forward", timed)
    costs = CostModel.calibrate(target, draft, 3)
    timed_calls = order[2:]                                 # after one prefix forward each
    # every timed T, in every repeat (a warm-up and _REPEATS; the narrow ones _DENSE_REPEATS)
    points = calibration.timed_points(len(costs.verify))
    dense = [t for t in points if t <= calibration._DENSE_T]
    per_model = len(points) * (calibration._REPEATS + 1) \
        + len(dense) * (calibration._DENSE_REPEATS - calibration._REPEATS)
    assert timed_calls == ["target", "draft"] * per_model
    assert len(costs.verify) == len(costs.draft) >= 4
    saved = json.loads((tmp_path / "calibration.json").read_text())
    assert sum(" | beside " in k for k in saved) == 2


def test_llm_cost_model_is_timed_on_the_thread_that_runs_the_rounds(llm, tmp_path,
                                                                    monkeypatch):
    """A forward timed from the caller's thread reads slower than the rounds run (two OpenMP
    teams on few cores), so LLM.cost_model times it on the scheduler's thread, as the planners
    do, and hands back the costs auto plans with."""
    import threading

    from specrt.spec import calibration

    monkeypatch.setenv("SPECRT_CALIBRATION", str(tmp_path / "calibration.json"))
    monkeypatch.setattr(calibration, "_cache", {})
    threads = []
    real = calibration._measure
    monkeypatch.setattr(calibration, "_measure",
                        lambda *a: (threads.append(threading.current_thread()), real(*a))[1])
    costs = llm.cost_model(3)
    assert threads == [llm.scheduler._thread] and threads[0] is not threading.current_thread()
    assert len(costs.verify) == len(costs.draft) >= 4
    res = llm.generate(PROMPTS[0], max_new_tokens=4,
                       speculative={"method": "auto", "num_speculative_tokens": 3})
    assert res.token_ids == llm.generate(PROMPTS[0], max_new_tokens=4).token_ids
    assert len(threads) == 1                      # the planner reused the same calibration
    with pytest.raises(specrt.SpecrtError, match="max_k"):
        llm.cost_model(0)


def test_scheduler_call_runs_on_its_thread_and_raises_what_fn_raises(llm):
    import threading

    assert llm.scheduler.call(threading.current_thread) is llm.scheduler._thread
    with pytest.raises(ZeroDivisionError):
        llm.scheduler.call(lambda: 1 / 0)
    assert llm.scheduler.call(lambda: 7) == 7         # the thread lives on


def test_cost_model_of_a_closed_llm_is_a_clear_error(tiny_noeos_dir):
    closed = specrt.LLM(tiny_noeos_dir, max_seq_len=64, dtype="float32")
    closed.close()
    with pytest.raises(specrt.SpecrtError, match="closed"):
        closed.cost_model(4)


def test_an_engine_with_graphs_calibrates_its_static_passes(tiny_noeos_dir, tiny_draft_dir,
                                                            tmp_path, monkeypatch):
    """An engine with graphs (static=True) times auto's costs on the static runners its rounds
    replay (captured graphs on CUDA; eagerly here), not on the eager forward, and keeps them
    under keys of their own."""
    from specrt.model.graphs import StaticForward
    from specrt.spec import calibration

    monkeypatch.setenv("SPECRT_CALIBRATION", str(tmp_path / "calibration.json"))
    monkeypatch.setattr(calibration, "_cache", {})
    static = specrt.LLM(tiny_noeos_dir, draft=tiny_draft_dir, max_seq_len=256,
                        dtype="float32", cuda_graphs=True)
    replays = []
    real_replay = StaticForward.replay
    monkeypatch.setattr(StaticForward, "replay",
                        lambda self: (replays.append(self.model), real_replay(self))[1])
    static.generate(PROMPTS[0], max_new_tokens=4,
                    speculative={"method": "auto", "num_speculative_tokens": 3})
    target, draft = static.engine.target, static.engine.draft
    assert replays and set(replays) == {target, draft}
    saved = json.loads((tmp_path / "calibration.json").read_text())
    assert len(saved) == 2 and all("|graphed" in k for k in saved)
    eager = CostModel.calibrate(target, draft, 3)          # the same models, the eager path
    assert len(json.loads((tmp_path / "calibration.json").read_text())) == 4
    assert len(eager.verify) == len(static.engine.planner_for(
        SpecConfig(method="auto", num_speculative_tokens=3)).costs.verify)


def test_calibration_times_every_forward_size_in_each_repeat(llm, tmp_path, monkeypatch):
    """Each repeat runs every timed T (of both models) in turn, so verify(T) / verify(1), the
    ratio auto plans from, is not skewed by the machine's speed changing between the time T = 1
    was timed and the time T = 16 was; every T up to _DENSE_T is timed, not interpolated."""
    from specrt.spec import calibration

    monkeypatch.setenv("SPECRT_CALIBRATION", str(tmp_path / "calibration.json"))
    monkeypatch.setattr(calibration, "_cache", {})
    target, draft = llm.engine.target, llm.engine.draft
    sizes = []
    real = target.forward
    monkeypatch.setattr(target, "forward",
                        lambda ids, *a, **kw: (sizes.append(ids.shape[1]), real(ids, *a, **kw))[1])
    costs = CostModel.calibrate(target, draft, 15)   # max_t = max(16, chunk rows, PROMPT_ROWS)
    assert len(costs.verify) == max(16, target.backend.batch_invariant_tokens, PROMPT_ROWS)
    points = calibration.timed_points(len(costs.verify))
    assert points[:calibration._DENSE_T] == list(range(1, calibration._DENSE_T + 1))
    timed = sizes[1:]                                      # after the prefix forward
    dense = [t for t in points if t <= calibration._DENSE_T]
    repeats = calibration._REPEATS + 1
    assert timed == points * repeats + dense * (calibration._DENSE_REPEATS + 1 - repeats)


def test_calibration_prices_each_t_against_t1_of_the_same_repeat():
    """The machine's speed changes between repeats (here 1x, 1.6x, 1x, 1.6x, 1.3x, with T = 1
    timed fast where T = 4 was slow): each repeat's own ratio keeps verify(4) / verify(1) at 1.1,
    and the draft's step at 0.2 of the target's, where medians of each T apart would not."""
    from specrt.spec.calibration import paired

    speed = [1.0, 1.6, 1.0, 1.6, 1.3]
    t1 = [0.05 * s for s in speed]
    t4 = [0.055 * s for s in speed]
    t1[4], t4[4] = 0.05 * 1.0, 0.055 * 1.6        # the machine sped up within the last repeat
    times = {1: [t1, [x * 0.2 for x in t1]], 4: [t4, [x * 0.2 for x in t4]]}
    target, draft = paired(times, 0), paired(times, 1)
    assert target[4] / target[1] == pytest.approx(1.1)
    assert draft[1] / target[1] == pytest.approx(0.2) and draft[4] / target[4] == pytest.approx(0.2)
    assert target[1] == pytest.approx(0.05)        # the median T = 1 forward sets the scale
    import statistics                               # medians of each T apart: 1.76, not 1.1
    assert statistics.median(t4) / statistics.median(t1) > 1.7


def test_calibration_measures_a_cost_per_t(llm):
    costs = forward_seconds(llm.target, 5)
    assert len(costs) == 5 and all(c > 0 for c in costs)
    assert forward_seconds(llm.target, 5) is costs  # cached per model/dtype/device
    import json
    from specrt.spec.calibration import disk_path as _disk_path
    assert costs in json.loads(_disk_path().read_text()).values()


def test_busy_sign_tells_a_competing_process_from_memory_speed():
    """Memory speed drifting 1.6x across a calibration, with +-15% jitter, is a quiet machine;
    a tenth of the forwards slowed 3-8x (parallel regions waiting for a descheduled thread)
    is a busy one."""
    import random

    from specrt.spec.calibration import busy_sign

    rng = random.Random(0)

    def times(slowed: float) -> dict:
        out = {}
        for t in (1, 2, 3, 4, 9, 17):
            reps = 9 if t <= 9 else 3
            out[t] = [[base * t ** 0.3 * (1 + 0.6 * r / reps) * rng.uniform(0.85, 1.15)
                       * (rng.uniform(3, 8) if rng.random() < slowed else 1.0)
                       for r in range(reps)] for base in (0.05, 0.01)]
        return out

    assert busy_sign(times(0.0)) is None
    assert "timed forwards took over 2x their median" in busy_sign(times(0.12))


def test_a_calibration_reports_busy_signs_unless_the_check_is_off(llm, monkeypatch):
    from specrt.spec import calibration

    class QuietWatch(calibration.CpuWatch):       # a /proc/stat that reads quiet, on any OS
        def stop(self):
            return 0.0, 1.0

    monkeypatch.setattr(calibration, "CpuWatch", QuietWatch)
    monkeypatch.setattr(calibration, "busy_sign", lambda times: "slowed")
    monkeypatch.setattr(calibration, "check_busy", True)
    assert calibration._measure_once([llm.target], 2, False)[1] == "slowed"
    monkeypatch.setattr(calibration, "busy_sign", lambda times: None)
    assert calibration._measure_once([llm.target], 2, False)[1] is None
    monkeypatch.setattr(calibration, "competing_sign", lambda *cpu: "competing")
    assert calibration._measure_once([llm.target], 2, False)[1] == "competing"
    monkeypatch.setattr(calibration, "check_busy", False)       # as in this test session
    assert calibration._measure_once([llm.target], 2, False)[1] is None


def test_competing_sign_counts_only_what_other_work_took_from_the_forwards_cores():
    """Every forward slowed alike (no outlier for busy_sign) is told by other work's CPU
    time: on 2 CPUs timing 2 threads, another process's 1 CPU-second in 2 s competed; on 64
    CPUs the same second ran on a free CPU."""
    from specrt.spec.calibration import competing_sign

    assert "other work took 1.0 CPU-seconds of the 2 CPUs" in competing_sign(1.0, 2.0, 2, 2)
    assert competing_sign(0.1, 2.0, 2, 2) is None            # a daemon's tick or two
    assert competing_sign(1.0, 2.0, 2, 64) is None
    assert competing_sign(62 * 2.0 + 1.0, 2.0, 2, 64) is not None   # every free CPU, and more
    assert competing_sign(0.0, 0.0, 2, 2) is None
    assert competing_sign(0.5, 2.0, 8, 2) is not None         # more threads than CPUs
    assert competing_sign(0.03, 0.1, 2, 2) is None            # within the counters' ticks


def test_cpu_watch_subtracts_this_process_and_counts_the_cpus_it_may_run_on(monkeypatch):
    """Others' time is the busy time of this process's CPUs less its own (/proc/stat and
    os.times read at start and stop), per `cpuN` line of the CPUs in its affinity, steal
    included."""
    from specrt.spec import calibration

    stat = [
        "cpu  900 0 0 0 0 0 0 0 0 0\ncpu0 100 10 20 500 5 1 2 3 0 0\n"
        "cpu1 100 0 0 500 0 0 0 0 0 0\ncpu2 700 0 0 0 0 0 0 0 0 0\nintr 1\n",
        "cpu  999 0 0 0 0 0 0 0 0 0\ncpu0 300 10 20 500 5 1 2 53 0 0\n"
        "cpu1 150 0 30 600 0 0 0 0 0 0\ncpu2 9999 0 0 0 0 0 0 0 0 0\nintr 1\n"]
    reads = iter(stat)

    class Stat:
        def __init__(self, *a):
            self.text = next(reads)

        def __enter__(self):
            return self.text.splitlines(keepends=True)

        def __exit__(self, *a):
            return False

    own = iter([1.0, 3.0])
    clock = iter([10.0, 12.0])
    monkeypatch.setattr(calibration, "open", Stat, raising=False)
    monkeypatch.setattr(calibration, "_own_cpu", lambda: next(own))
    monkeypatch.setattr(calibration.time, "monotonic", lambda: next(clock))
    monkeypatch.setattr(calibration, "usable_cpus", lambda: {0, 1})
    monkeypatch.setattr(calibration, "_TICK", 0.01)
    others, wall = calibration.CpuWatch().start().stop()
    # cpu0 +200 user +50 steal, cpu1 +50 user +30 system (cpu2, not ours, ignored): 3.3 s busy
    assert wall == 2.0 and others == pytest.approx(3.3 - 2.0)


def test_cpu_watch_counts_other_processes_on_a_live_machine():
    import subprocess
    import sys

    from specrt.spec.calibration import CpuWatch, competing_sign

    watch = CpuWatch()
    if watch.start().stop() is None:
        pytest.skip("this machine has no /proc/stat")
    n = min(len(watch.cpus), 4)

    def spin(seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            pass

    def others_per_second(work) -> float:
        w = CpuWatch().start()
        work(1.0)
        others, wall = w.stop()
        return others / wall

    # This process spinning a CPU-second is its own time, not another's: what others used moved
    # by less than half of it against a second of sleep (whatever else the machine runs; best
    # of three, as the machine's other load may change between two readings).
    assert any(others_per_second(spin) < others_per_second(time.sleep) + 0.5 for _ in range(3))
    burners = []
    try:
        for _ in range(n):
            burners.append(subprocess.Popen(
                [sys.executable, "-c", "import time\nend = time.monotonic() + 30\n"
                 "while time.monotonic() < end: pass"]))
        time.sleep(0.3)                             # started and spinning
        watch = CpuWatch().start()
        time.sleep(1.0)
        others, wall = watch.stop()
    finally:
        for p in burners:
            p.kill()
            p.wait()
    assert others > 0.5 * n * wall
    assert "other work took" in competing_sign(others, wall, n, n)


def test_a_calibration_from_a_busy_machine_is_timed_again_and_else_not_saved(
        llm, tmp_path, monkeypatch, caplog):
    from specrt.spec import calibration

    monkeypatch.setenv("SPECRT_CALIBRATION", str(tmp_path / "calibration.json"))
    monkeypatch.setattr(calibration, "_cache", {})
    monkeypatch.setattr(calibration, "_untrusted", set())
    verdicts = ["busy", "busy", "busy", None]
    timed = []

    def measure_once(models, max_t, graphed):
        timed.append(max_t)
        return [[0.01 * len(timed)] * max_t for _ in models], verdicts[len(timed) - 1]

    monkeypatch.setattr(calibration, "_measure_once", measure_once)
    with caplog.at_level("INFO", logger="specrt.spec.calibration"):
        costs = forward_seconds(llm.target, 4)
    assert timed == [4, 4] and costs == [0.02] * 4      # timed again, then used as it was
    assert "busy" in caplog.text and "this process only" in caplog.text
    # what auto will plan with is logged, so a user can see a calibration that looks wrong
    assert "forward times for `auto` (this process only): " in caplog.text
    assert "1 token 20.0 ms, 4 tokens 20.0 ms" in caplog.text
    assert not (tmp_path / "calibration.json").exists() or \
        costs not in json.loads((tmp_path / "calibration.json").read_text()).values()
    assert forward_seconds(llm.target, 4) is costs      # this process does not time again
    monkeypatch.setattr(calibration, "_cache", {})       # a new process: timed again
    costs = forward_seconds(llm.target, 4)
    assert timed == [4, 4, 4, 4] and costs == [0.04] * 4    # the second try was quiet
    assert costs in json.loads((tmp_path / "calibration.json").read_text()).values()


def test_a_calibration_competed_with_throughout_is_not_timed_again(llm, tmp_path, monkeypatch,
                                                                    caplog):
    """Work that held the CPUs for a whole calibration likely holds them for the next: one
    try, used in this process only; outliers (busy_sign) still earn a second try."""
    from specrt.spec import calibration

    monkeypatch.setenv("SPECRT_CALIBRATION", str(tmp_path / "calibration.json"))
    monkeypatch.setattr(calibration, "_cache", {})
    monkeypatch.setattr(calibration, "_untrusted", set())
    timed = []
    verdict = calibration.competing_sign(2.0, 2.0, 2, 2)

    def measure_once(models, max_t, graphed):
        timed.append(max_t)
        return [[0.01] * max_t for _ in models], verdict

    monkeypatch.setattr(calibration, "_measure_once", measure_once)
    with caplog.at_level("WARNING", logger="specrt.spec.calibration"):
        costs = forward_seconds(llm.target, 3)
    assert timed == [3] and "timing again" not in caplog.text.replace("timing again next", "")
    assert "this process only" in caplog.text
    saved = tmp_path / "calibration.json"
    assert not saved.exists() or costs not in json.loads(saved.read_text()).values()


def test_two_threads_calibrate_one_at_a_time_and_the_second_reuses_the_first(
        llm, tmp_path, monkeypatch):
    """Two engines timing at once would slow each other, unseen by CpuWatch (their threads are
    this process's own time): calibrations run one at a time, and one that waited for another
    of the same models takes its result."""
    import threading

    from specrt.spec import calibration

    monkeypatch.setenv("SPECRT_CALIBRATION", str(tmp_path / "calibration.json"))
    monkeypatch.setattr(calibration, "_cache", {})
    monkeypatch.setattr(calibration, "_untrusted", set())
    running, overlap, timed = [0], [0], []

    def measure_once(models, max_t, graphed):
        running[0] += 1
        overlap[0] = max(overlap[0], running[0])
        time.sleep(0.2)
        timed.append(len(models))
        running[0] -= 1
        return [[0.01] * max_t for _ in models], None

    monkeypatch.setattr(calibration, "_measure_once", measure_once)
    jobs = [lambda: forward_seconds(llm.target, 3), lambda: forward_seconds(llm.target, 3),
            lambda: calibration.timed_together([llm.target, llm.engine.draft], 3)]
    threads = [threading.Thread(target=job) for job in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert overlap[0] == 1 and sorted(timed) == [1, 2]


def test_costs_timed_on_a_busy_machine_reach_no_disk_by_any_path(llm, tmp_path, monkeypatch):
    """Repairing a damaged file saves only trusted entries; an entry another process saved
    (timed quiet) replaces a busy one in memory and is kept at the next save."""
    from specrt.spec import calibration

    path = tmp_path / "calibration.json"
    monkeypatch.setenv("SPECRT_CALIBRATION", str(path))
    monkeypatch.setattr(calibration, "_cache", {})
    monkeypatch.setattr(calibration, "_untrusted", set())
    verdict = ["busy"]
    monkeypatch.setattr(calibration, "_measure_once", lambda models, max_t, graphed: (
        [[0.5] * max_t for _ in models], verdict[0]))
    busy = forward_seconds(llm.target, 3)            # timed busy twice: kept in memory only
    key = next(k for k, v in calibration._cache.items() if v is busy)
    path.write_text("{damaged")
    verdict[0] = None
    forward_seconds(llm.target, 4)                    # another size: reads, heals, saves
    assert key not in json.loads(path.read_text())
    saved = json.loads(path.read_text())
    saved[key] = [0.25] * 3                           # another process timed it quiet
    path.write_text(json.dumps(saved))
    forward_seconds(llm.target, 5)                    # reads the file again, then saves
    assert json.loads(path.read_text())[key] == [0.25] * 3
    assert calibration._cache[key] == [0.25] * 3


def test_a_save_keeps_what_another_process_saved_while_this_one_measured(llm, tmp_path,
                                                                          monkeypatch):
    """Two processes calibrating at once: the one that saves last used to write only the file
    it had read before measuring, dropping the other's entry (its next run timed again)."""
    from specrt.spec import calibration

    path = tmp_path / "calibration.json"
    monkeypatch.setenv("SPECRT_CALIBRATION", str(path))
    monkeypatch.setattr(calibration, "_cache", {})
    monkeypatch.setattr(calibration, "_untrusted", set())

    other = f"another process's model|{calibration._SCHEME}"

    def measure_while_another_saves(models, max_t, graphed):
        path.write_text(json.dumps({other: [0.125] * 3}))
        return [[0.5] * max_t for _ in models], None

    monkeypatch.setattr(calibration, "_measure_once", measure_while_another_saves)
    forward_seconds(llm.target, 3)
    saved = json.loads(path.read_text())
    assert saved[other] == [0.125] * 3
    assert [0.5] * 3 in saved.values() and len(saved) == 2


def test_a_save_interrupted_mid_write_leaves_no_temporary_file(tmp_path, monkeypatch):
    from specrt.spec import calibration

    path = tmp_path / "calibration.json"
    monkeypatch.setenv("SPECRT_CALIBRATION", str(path))

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(calibration.json, "dump", interrupted)
    with pytest.raises(KeyboardInterrupt):
        calibration._save_disk({"a model": [0.5, 0.6]})
    assert list(tmp_path.iterdir()) == []


def _fixed_costs(monkeypatch, timed: list):
    """Calibrations that time nothing: every forward 0.5 s, each call noted in `timed`."""
    from specrt.spec import calibration

    monkeypatch.setattr(calibration, "_cache", {})
    monkeypatch.setattr(calibration, "_untrusted", set())

    def measure_once(models, max_t, graphed):
        timed.append(max_t)
        return [[0.5] * max_t for _ in models], None
    monkeypatch.setattr(calibration, "_measure_once", measure_once)


def test_a_calibration_path_that_is_not_a_file_is_neither_read_nor_replaced(
        llm, tmp_path, monkeypatch, caplog):
    """SPECRT_CALIBRATION naming a FIFO blocked the read forever: the scheduler thread hung
    in the first `auto` request's calibration, and every request after it. A FIFO (or a
    device) is now left alone: not read, not replaced, no lock file beside it; the costs serve
    this process, as the log says (not "cached in" it)."""
    import os
    import threading

    from specrt.spec import calibration

    fifo = tmp_path / "calibration.fifo"
    os.mkfifo(fifo)
    monkeypatch.setenv("SPECRT_CALIBRATION", str(fifo))
    timed = []
    _fixed_costs(monkeypatch, timed)
    # a thread stuck on the FIFO holds this test's lock, not the one later tests take
    monkeypatch.setattr(calibration, "_lock", threading.Lock())
    out = []
    with caplog.at_level("INFO", logger="specrt.spec.calibration"):
        worker = threading.Thread(target=lambda: out.append(forward_seconds(llm.target, 3)),
                                  daemon=True)
        worker.start()
        worker.join(timeout=30)
    if worker.is_alive():
        pytest.fail("reading a FIFO as the calibration file blocked")
    assert out == [[0.5] * 3] and timed == [3]
    assert "not a regular file" in caplog.text
    timing = [r.getMessage() for r in caplog.records if "timing the models" in r.getMessage()]
    assert len(timing) == 1 and "kept in memory only" in timing[0], timing
    assert "cached in" not in caplog.text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["calibration.fifo"]
    assert os.path.exists(fifo) and not os.path.isfile(fifo)


def test_a_model_folder_replaced_by_another_model_is_timed_again(tmp_path, monkeypatch):
    """The key named the model's folder but not the model: a bigger model saved where a small
    one was calibrated was planned with the small one's costs (0.18 ms a step for a 13.7 ms
    one). The model's shape is in the key now."""
    from specrt.model.transformer import Transformer
    from specrt.spec import calibration
    from tests.tiny import make_model

    monkeypatch.setenv("SPECRT_CALIBRATION", str(tmp_path / "calibration.json"))
    timed = []
    _fixed_costs(monkeypatch, timed)
    folder = tmp_path / "model"

    def load():
        return Transformer.from_dir(folder, torch.float32, torch.device("cpu"), 64)

    make_model(folder, hidden=32, layers=1, eos=False)
    small = load()
    forward_seconds(small, 3)
    forward_seconds(load(), 3)                      # the same model again: not timed again
    assert timed == [3]
    make_model(folder, hidden=64, layers=2, eos=False)      # another model, the same folder
    big = load()
    assert big.source == small.source
    forward_seconds(big, 3)
    assert timed == [3, 3]
    assert calibration.calibration_key(big, 3) != calibration.calibration_key(small, 3)


@pytest.mark.parametrize("entry", [[5e-324, 1e-3], [1e-3, 1e-6], [2e-3, 1e-3, 3e-3], [0.0],
                                   [1e-3, float("inf")], [], [True]])
def test_implausible_calibration_entries_are_dropped(entry, tmp_path, monkeypatch, caplog):
    """Entries `_curve` never writes steered `auto`: a 5e-324 s step made 1 / step infinite
    (39 of 39 rounds plain), and a curve falling with T, extended past its end, priced long
    passes below nothing. Such an entry is dropped with a warning and the file rewritten."""
    from specrt.spec import calibration

    path = tmp_path / "calibration.json"
    monkeypatch.setenv("SPECRT_CALIBRATION", str(path))
    good = [1e-3, 1e-3, 2e-3]
    ok, bad = (f"{name}|{calibration._SCHEME}" for name in ("good", "bad"))
    path.write_text(json.dumps({ok: good, bad: entry}))
    with caplog.at_level("WARNING", logger="specrt.spec.calibration"):
        entries, damaged, foreign = calibration._load_disk()
    assert entries == {ok: good} and damaged and not foreign
    assert "1 bad entry" in caplog.text


@pytest.mark.parametrize("text", ["my notes\n", "[1, 2]", "\x00\xff binary",
                                  '{"model_type": "qwen2", "hidden_size": 896}'])
def test_a_file_that_never_held_calibrations_is_left_alone(text, llm, tmp_path, monkeypatch,
                                                           caplog):
    """SPECRT_CALIBRATION pointed at someone else's file (not a JSON object's text, or an
    object without a calibration's key) had it replaced by calibrations at the first `auto`
    run; now it is left as it was, with a warning, and the calibration is kept in memory. A
    damaged JSON object is still ours, and rewritten."""
    from specrt.spec import calibration

    path = tmp_path / "notes.txt"
    path.write_bytes(text.encode("latin-1"))
    monkeypatch.setenv("SPECRT_CALIBRATION", str(path))
    monkeypatch.setattr(calibration, "_cache", {})
    monkeypatch.setattr(calibration, "_untrusted", set())
    monkeypatch.setattr(calibration, "_measure_once", lambda models, max_t, graphed: (
        [[0.5] * max_t for _ in models], None))
    with caplog.at_level("WARNING", logger="specrt.spec.calibration"):
        assert forward_seconds(llm.target, 3) == [0.5] * 3
    assert path.read_bytes() == text.encode("latin-1")
    assert "not a calibration file" in caplog.text
    path.write_text('{"damaged')
    forward_seconds(llm.target, 4)
    assert [0.5] * 4 in json.loads(path.read_text()).values()


def test_a_calibration_path_that_is_a_folder_is_refused_before_any_load(tmp_path,
                                                                        monkeypatch):
    """SPECRT_CALIBRATION naming a folder failed every `auto` request, once the model had
    loaded (a server answered each with an error); LLM's arguments refuse it now."""
    from specrt.api.args import LLMArgs
    from specrt.errors import CachePathError

    monkeypatch.setenv("SPECRT_CALIBRATION", str(tmp_path))
    with pytest.raises(CachePathError, match="SPECRT_CALIBRATION=.* is a directory"):
        LLMArgs(model=str(tmp_path / "model"))
    monkeypatch.setenv("SPECRT_CALIBRATION", str(tmp_path / "calibration.json"))
    LLMArgs(model=str(tmp_path / "model"))


def test_entries_of_another_calibration_scheme_are_dropped_at_the_next_save(
        llm, tmp_path, monkeypatch):
    """Keys of an older scheme (cal5 had no model shape) are never looked up again; each save
    kept them, so the file grew by every scheme's entries."""
    from specrt.spec import calibration

    path = tmp_path / "calibration.json"
    monkeypatch.setenv("SPECRT_CALIBRATION", str(path))
    timed = []
    _fixed_costs(monkeypatch, timed)
    old = "/models/x|bfloat16|None|None|cpu|2|9|AMD EPYC|gemv-1|cal5"
    current = f"/models/x|shape|bfloat16|cpu|2|9|AMD EPYC|gemv-1|{calibration._SCHEME}"
    path.write_text(json.dumps({old: [0.1, 0.2], current: [0.1, 0.3], "foreign": [0.2]}))
    forward_seconds(llm.target, 3)
    saved = json.loads(path.read_text())
    assert old not in saved and saved[current] == [0.1, 0.3] and saved["foreign"] == [0.2]
    assert [0.5] * 3 in saved.values() and timed == [3]


def test_a_cost_curve_extended_past_its_end_never_falls():
    from specrt.spec.costs import _at

    assert _at([1.0, 2.0, 3.0], 5) == 5.0
    assert _at([2.0, 2.0], 9) == 2.0
    assert _at([3.0, 1.0], 4) == 1.0           # never below the curve's last point
    # at the slope of its last token, not from its first: narrow passes' tokens are cheaper
    assert _at([1.0, 1.1, 1.2, 1.5, 2.0], 7) == pytest.approx(3.0)


def test_calibration_times_powers_of_two_up_to_a_prompt_with_a_draft():
    """Past the dense points, 16, 32, 64 ...: the draft's prompt pass (up to PROMPT_ROWS tokens)
    is timed, not extended from 32 tokens at the slope of a decode step's."""
    from specrt.spec import calibration

    assert calibration.timed_points(32) == [*range(1, 10), 16, 32]
    assert calibration.timed_points(128) == [*range(1, 10), 16, 32, 64, 128]
    assert calibration.timed_points(17) == [*range(1, 10), 16, 17]
    assert calibration.timed_points(5) == [1, 2, 3, 4, 5]


@pytest.mark.parametrize("umask", [0o022, 0o002])
def test_a_saved_calibration_file_gets_the_umasks_permissions(umask, tmp_path, monkeypatch):
    """mkstemp makes a 0600 file: in a shared SPECRT_CACHE the other users could not read the
    calibration and timed again in every process."""
    import os
    import stat

    from specrt.spec import calibration

    path = tmp_path / "calibration.json"
    monkeypatch.setenv("SPECRT_CALIBRATION", str(path))
    old = os.umask(umask)
    try:
        calibration._save_disk({"a model": [0.5, 0.6]})
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask
    assert json.loads(path.read_text()) == {"a model": [0.5, 0.6]}


def test_a_cost_curve_is_interpolated_between_timed_points_and_never_falls():
    """Latency cannot fall as T grows: a timed point that reads faster than a narrower one
    (timing noise) is raised to it, and so is what is interpolated after it."""
    from specrt.spec.calibration import _curve

    assert _curve({1: 1.0, 3: 2.0, 5: 1.5}, 5) == pytest.approx([1.0, 1.5, 2.0, 2.0, 2.0])
    assert _curve({1: 2.0, 4: 1.0}, 4) == [2.0] * 4
    assert _curve({1: 1.0, 2: 1.5, 4: 2.5}, 4) == pytest.approx([1.0, 1.5, 2.0, 2.5])


class TwoKindsOfMatch:
    """An n-gram drafter stand-in whose matches alternate: a 1-token suffix match (always a
    wrong guess) and a 3-token suffix match (always right)."""

    name = "ngram"
    min_n, max_n = 1, 3

    def __init__(self):
        self.round = 0

    def reset(self, rows):
        self.round = 0

    def matches(self, ctx, k):
        self.round += 1
        n = 1 if self.round % 2 else 3
        return [([11, 12, 13, 14][:k], n)]


def _two_kinds_rounds(rounds: int, right) -> list[tuple[int, int, str]]:
    """(round, matched length, plan) of `rounds` rounds of one request over TwoKindsOfMatch,
    whose guesses are all accepted where right(round, length), else all rejected."""
    drafter = TwoKindsOfMatch()
    costs = CostModel(verify=[1.0 + 0.03 * t for t in range(9)], draft=[1.0] * 9)
    planner = AdaptivePlanner(8, costs, draft_model=None, ngram=drafter)
    planner.reset([0])
    ctx = SimpleNamespace(histories=[[1, 2, 3]], active=[True], params=[SamplingParams()],
                          generators=[None])
    out = []
    for i in range(rounds):
        plan = planner.choose(ctx)
        n = 1 if drafter.round % 2 else 3
        out.append((i, n, plan.label))
        planner.observe(plan, [plan.k if right(i, n) else 0], [plan.k], 0.0, 0.0)
    return out


def test_ngram_acceptance_is_kept_per_match_length():
    """1-token matches that always miss must not drag down 3-token matches that always hit:
    the planner learns to skip the first and draft the whole match on the second."""
    plans = _two_kinds_rounds(80, lambda i, n: n == 3)
    late_short = [label for _, n, label in plans if n == 1][-20:]
    late_long = [label for _, n, label in plans if n == 3][-20:]
    assert late_long == ["ngram:4"] * 20
    assert sum(p == "plain" for p in late_short) >= 18       # at most a probe or two


def test_a_match_length_that_turns_good_is_probed_while_other_lengths_win():
    """Each matched length keeps its own probe gap: 1-token matches wrong for their first 60
    rounds and right after, beside 3-token matches right all along, are probed again and
    drafted on merit once right, though prompt lookup never stopped winning its 3-token
    rounds (with one probe gap for the drafter, each of those rounds put the 1-token
    matches' probe off again: they ran as plain steps to the end)."""
    short = [(i, label) for i, n, label in _two_kinds_rounds(400, lambda i, n: n == 3 or i >= 60)
             if n == 1]
    # lost on merit: plain steps but for probes (K = 1); found again: drafted whole
    assert {label for i, label in short if 12 <= i < 60} == {"plain", "ngram:1"}
    assert {label for i, label in short if i >= 200} == {"ngram:4"}


class AlternatingMatches:
    """Two rows: row 0 matches 1 token every round, row 1 matches 3 tokens every other
    round and nothing in between."""

    name = "ngram"
    min_n, max_n = 1, 3

    def __init__(self):
        self.round = 0

    def reset(self, rows):
        pass

    def matches(self, ctx, k):
        self.round += 1
        other = ([20, 21, 22][:k], 3) if self.round % 2 else ([], 0)
        return [([10, 11, 12, 13][:k], 1), other]


def test_a_probe_in_a_batch_wins_no_other_state_a_round_on_merit():
    """Every guess is wrong. A round that probes row 1's 3-token match also drafts row 0's
    1-token match, which won nothing on merit: its probe gap keeps doubling, so in 1000
    rounds the 1-token matches are probed once per doubling from PROBE_BASE to PROBE_MAX (6
    times at most), not every PROBE_BASE rounds after each probe of the other length (15)."""
    from specrt.spec.planners.adaptive import PROBE_MAX

    drafter = AlternatingMatches()
    planner = AdaptivePlanner(8, _ngram_costs(), draft_model=None, ngram=drafter)
    planner.reset([0, 1])
    ctx = SimpleNamespace(histories=[[1, 2, 3]] * 2, active=[True] * 2,
                          params=[SamplingParams()] * 2, generators=[None] * 2,
                          remaining=None, generated=None)
    probes = {"ngram/1": 0, "ngram/3": 0}
    for _ in range(1000):
        plan = planner.choose(ctx)
        if plan.notes.probe:
            probes[plan.notes.probe] += 1
        planner.observe(plan, [0, 0], [plan.k] * 2, 0.0, 0.0)
    doublings = (PROBE_MAX // PROBE_BASE).bit_length()
    assert probes["ngram/3"] >= 3 and 3 <= probes["ngram/1"] <= doublings


class FixedMatch:
    """An n-gram drafter stand-in with one match of a given length for every row."""

    name = "ngram"
    min_n, max_n = 1, 3

    def __init__(self, length):
        self.length = length

    def reset(self, rows):
        pass

    def matches(self, ctx, k):
        return [(list(range(10, 10 + k)), self.length)] * len(ctx.histories)


def test_a_copy_in_progress_drafts_long_from_its_first_round():
    """A match whose text has agreed with its source for COPYING tokens is a copy in progress:
    it learns in its own state, whose prior drafts long at once, while a fresh 3-token match
    drafts short; one token short of a copy, a match's second guess already follows a copy.
    What the copy learns leaves the shorter matches' states alone."""
    from specrt.spec.drafters.ngram import COPYING

    costs = _ngram_costs()
    first = {}
    for length in (3, COPYING - 1, COPYING, COPYING + 5):
        planner = AdaptivePlanner(16, costs, draft_model=None, ngram=FixedMatch(length))
        planner.reset([0])
        first[length] = planner.choose(_ctx(1, remaining=500)).k
    assert first[3] <= 5 < first[COPYING - 1]
    assert first[COPYING] == first[COPYING + 5] >= 8        # a copy: long from the start
    planner = AdaptivePlanner(16, costs, draft_model=None, ngram=FixedMatch(COPYING))
    planner.reset([0])
    ks = _all_right(planner, 6)                             # the copy keeps being right
    assert ks[-1] == 16
    assert all(planner.states[f"ngram/{n}"].alphas[0] == [planner.priors.get(
        f"ngram/{n}", planner.priors["ngram"])] for n in range(1, COPYING))


def test_a_guess_learns_and_is_weighed_as_the_first_guess_of_the_match_it_extends():
    """Guess i of an n-token match is reached only if the i - 1 before it were right, so it
    follows a match of n + i - 1 tokens: it learns in that length's state and is weighed at
    it. In a passage being rewritten, 1-token matches whose guesses keep being right lift the
    longer matches' states, and a fresh 3-token match is then drafted long; and a 3-token
    match that is always wrong cuts a 1-token match's K before its third guess."""
    from specrt.spec.drafters.ngram import COPYING

    costs = _ngram_costs()
    match = FixedMatch(1)
    planner = AdaptivePlanner(16, costs, draft_model=None, ngram=match)
    planner.reset([0])
    plan = planner.choose(_ctx(1, remaining=500))
    assert plan.k >= 3
    planner.observe(plan, [2], [plan.k], 0.0, 0.0)          # guesses 1-2 right, 3 wrong
    states, priors = planner.states, planner.priors
    assert {name: s.seen[0][0] for name, s in states.items() if s.seen[0][0]} == {
        "ngram/1": 1, "ngram/2": 1, "ngram/3": 1}
    assert states["ngram/1"].alphas[0][0] > priors["ngram/1"]
    assert states["ngram/2"].alphas[0][0] > priors["ngram/2"]
    assert states["ngram/3"].alphas[0][0] < priors["ngram"]
    state = [states[f"ngram/{n}"].alphas[0][0] for n in range(1, COPYING)]
    copy = states["ngram/copy"].alphas[0][0]
    assert planner._ngram_weighed(([5] * 6, 2), 0) == state[1:7]
    assert planner._ngram_weighed(([5] * 3, COPYING - 1), 0) == [state[-1], copy, copy]

    planner.reset([0])
    _all_right(planner, 6)                                  # 1-token matches, always right
    fresh = AdaptivePlanner(16, costs, draft_model=None, ngram=FixedMatch(3))
    fresh.reset([0])
    match.length = 3
    assert fresh.choose(_ctx(1, remaining=500)).k < planner.choose(_ctx(1, remaining=500)).k
    planner.states["ngram/3"].alphas[0][:] = [0.05] * 16    # 3-token matches: always wrong
    match.length = 1
    assert planner.choose(_ctx(1, remaining=500)).k == 2


@pytest.mark.parametrize("sampled", [False, True])
def test_identical_requests_get_identical_plans_however_long_rounds_take(llm, monkeypatch,
                                                                        sampled):
    """auto's plans are a function of the request and the calibrated costs: with every round's
    measured time scrambled (a machine 5x slower, then faster, as the engine's clock sees it),
    the same request gives the same plan in every round and the same tokens, greedy or
    seeded sampling."""
    import random

    import specrt.engine.round as round_module

    spec = {"method": "auto", "num_speculative_tokens": 5}    # a planner of its own
    kw = dict(temperature=1.0, seed=7) if sampled else {}
    # Fixed costs with a cheap draft, so that auto does speculate; only the rounds' clock is
    # scrambled below.
    monkeypatch.setattr(CostModel, "calibrate", classmethod(lambda cls, *a, **kw: PAYING))
    llm.generate(PROMPTS[0], max_new_tokens=2, speculative=spec)
    runs = set()
    for trial in range(4):
        rng = random.Random(trial)
        clock = [0.0]

        def scrambled():
            clock[0] += rng.choice([0.001, 0.005, 0.05, 0.25])
            return clock[0]

        monkeypatch.setattr(round_module.time, "perf_counter", scrambled)
        run = llm.submit(PROMPTS[1], max_new_tokens=40, speculative=spec, **kw)
        plans = tuple(chunk.step.plan for chunk in run.chunks())
        runs.add((plans, tuple(run.result().token_ids)))
    monkeypatch.undo()
    assert len(runs) == 1
    plans = next(iter(runs))[0]
    assert any(p != "plain" for p in plans[1:])          # it did speculate


class LaggingDraft:
    """A draft model the planner only prices: each active row is `lag` tokens behind."""

    name = "draft_model"
    cut_short = True

    def __init__(self, lag):
        self.lag = lag

    def lags(self, ctx):
        return [self.lag if a else 0 for a in ctx.active]


def _ctx(batch, remaining, history=4, generated=None):
    from specrt.spec.drafters.base import DraftContext
    return DraftContext(histories=[[1] * history] * batch, active=[True] * batch,
                        params=[SamplingParams()] * batch, generators=[None] * batch,
                        remaining=[remaining] * batch,
                        generated=None if generated is None else [generated] * batch)


def _lost_on_merit(planner, row):
    """Row `row`'s draft model as after a request's worth of rejections: its estimates low,
    and its mean acceptance lower still, so sitting out does not relax them (`_relax`)."""
    state = planner.states["draft_model"]
    state.alphas[row][:] = [0.05] * planner.max_k
    state.tally[row][:] = [0, 40]


def _plans(planner, ctx, rounds):
    plans = []
    for _ in range(rounds):
        plan = planner.choose(ctx)
        plans.append(plan.label)
        B = len(ctx.active)
        planner.observe(plan, [0] * B, [plan.k] * B, 0.0, 1.0)
    return plans


def _all_right(planner, rounds) -> list[int]:
    """The K of each of `rounds` rounds of one request whose drafts are all accepted."""
    ks = []
    for _ in range(rounds):
        plan = planner.choose(_ctx(1, remaining=500))
        planner.observe(plan, [plan.k], [plan.k], 0.0, 0.0)
        ks.append(plan.k)
    return ks


def _ngram_costs() -> CostModel:
    """Prompt lookup alone (no draft model) on a memory-bound verify pass."""
    return CostModel(verify=[1.0 + 0.03 * t for t in range(18)], draft=[])


@pytest.mark.parametrize("batch", [1, 4])
def test_probes_run_only_where_the_draft_could_win(batch):
    """Verifying up to 4 tokens costs what 1 does, more costs in proportion (a memory-bound
    pass that turns compute-bound): one request can gain from drafting, a batch of 4 cannot
    whatever the acceptance, so its rows are never probed (each probe would be paid for
    nothing); the single request is probed every PROBE_BASE+ rounds."""
    curve = [max(1.0, 0.25 * t) for t in range(1, 40)]
    costs = CostModel(verify=curve, draft=[0.05] * 39)
    planner = AdaptivePlanner(8, costs, draft_model=LaggingDraft(1), ngram=None)
    planner.reset(list(range(batch)))
    for row in range(batch):
        _lost_on_merit(planner, row)         # only probes can bring it back
    plans = _plans(planner, _ctx(batch, remaining=500), 3 * PROBE_BASE)
    probes = [p for p in plans if p != "plain"]
    if batch == 1:
        assert probes and plans.index(probes[0]) == PROBE_BASE - 1
    else:
        assert probes == []


@pytest.mark.parametrize("remaining,expected", [(4, "plain"), (200, "draft_model:")])
def test_long_catch_up_is_spread_over_what_the_request_has_left(remaining, expected):
    """A request 300 tokens ahead of its draft model (plain rounds, or its prompt) drafts only
    if enough answer remains to repay the catch-up; near its end it stays plain."""
    costs = CostModel(verify=[1.0 + 0.03 * t for t in range(1, 10)],
                      draft=[0.2 + 0.01 * t for t in range(1, 10)])
    planner = AdaptivePlanner(8, costs, draft_model=LaggingDraft(300), ngram=None)
    planner.reset([0])
    plan = planner.choose(_ctx(1, remaining, history=300))
    assert plan.label.startswith(expected)


@pytest.mark.parametrize("generated,expected", [(1, "plain"), (10, "plain"),
                                                (150, "draft_model:")])
def test_a_long_catch_up_waits_until_the_answer_has_run_long_enough(generated, expected):
    """Rent or buy: 1000 tokens of prompt to catch up (10 target steps' worth), 500 tokens of
    budget. An answer that has just started (it may well stop after 25 tokens) does not pay
    for it; one that has already run 150 tokens is expected to run about that much more, and
    does."""
    costs = CostModel(verify=[1.0 + 0.03 * t for t in range(1, 10)],
                      draft=[0.2 + 0.01 * t for t in range(1, 10)])
    planner = AdaptivePlanner(8, costs, draft_model=LaggingDraft(1000), ngram=None)
    planner.reset([0])
    plan = planner.choose(_ctx(1, 500, history=1000, generated=generated))
    assert plan.label.startswith(expected)


@pytest.mark.parametrize("lag, edge, premium, expected", [
    (300, 1.01, LUMP_PREMIUM, "plain"), (300, 1.01, 0.0, "draft_model:1"),
    (300, 1.05, LUMP_PREMIUM, "draft_model:1"), (1, 1.01, LUMP_PREMIUM, "draft_model:1")])
def test_a_catch_up_is_priced_above_its_time(monkeypatch, lag, edge, premium, expected):
    """A draft model `lag` tokens behind, priced so that drafting one token, its catch-up spread
    over the MIN_HORIZON tokens the answer is expected to run, commits `edge` times the tokens
    per second of a plain step. With its catch-up priced LUMP_PREMIUM above its time, 1% ahead
    is not enough to buy it (it would be at its time), 5% is; a draft model that keeps up has
    nothing to buy and drafts 1% ahead."""
    from specrt.spec.planners import adaptive
    monkeypatch.setattr(adaptive, "LUMP_PREMIUM", premium)
    e = 1 + PRIORS["draft_model"]                  # tokens a 1-guess round commits
    step, verify = 0.1, 1.0                        # a draft step; every target pass
    # e / (step + verify + lump * e / MIN_HORIZON) = edge / verify, the lump at its time
    lump = (e * verify / edge - step - verify) * MIN_HORIZON / e
    if lag == 1:                                   # no lump: its first forward costs that much
        costs = CostModel(verify=[verify] * 4, draft=[e * verify / edge - verify] * 4)
    else:
        costs = CostModel(verify=[verify] * 4, draft=[step] + [lump] * 400)
    planner = AdaptivePlanner(1, costs, draft_model=LaggingDraft(lag), ngram=None)
    planner.reset([0])
    plan = planner.choose(_ctx(1, 500, history=300, generated=1))
    assert plan.label == expected


class CopiesFromThePrompt:
    """An n-gram stand-in for a rewrite: a 3-token match that is always right, or (matching
    False) nothing to look up."""

    name = "ngram"
    min_n, max_n = 1, 3

    def __init__(self):
        self.matching = True

    def reset(self, rows):
        pass

    def matches(self, ctx, k):
        return [([7] * k, 3) if self.matching else ([], 0)] * len(ctx.histories)


def _lump_costs() -> CostModel:
    """Target passes of 1.03-1.51 s for 1-17 tokens and draft forwards a fifth of that: a
    draft model 300 tokens behind beats a plain step caught up, but its catch-up costs ~3 plain
    steps."""
    return CostModel(verify=[1.0 + 0.03 * t for t in range(1, 18)],
                     draft=[0.2 + 0.01 * t for t in range(1, 18)])


def test_a_catch_up_is_not_bought_for_the_rounds_prompt_lookup_finds_no_match_in():
    """A rewrite that prompt lookup copies wins every round, then one round finds no match.
    Against a plain step, the draft model (300 tokens behind: the prompt) looks worth buying
    there, and is, for a request with no rounds yet; but it would have won none of this
    request's rounds, so its catch-up is spread over the few it is expected to draft in, and
    the round stays plain."""
    costs = _lump_costs()
    plans = {}
    for copied in (0, 12):
        lookup = CopiesFromThePrompt()
        planner = AdaptivePlanner(16, costs, draft_model=LaggingDraft(300), ngram=lookup)
        planner.reset([0])
        for _ in range(copied):
            plan = planner.choose(_ctx(1, 500, history=300, generated=40))
            assert plan.label.startswith("ngram:")
            planner.observe(plan, [plan.k], [plan.k], 0.0, 0.0)
        lookup.matching = False
        plans[copied] = planner.choose(_ctx(1, 500, history=300, generated=40)).label
    assert plans[0].startswith("draft_model:") and plans[12] == "plain"
    assert planner.rounds == [12] and planner.draft_wins == [0]
    planner.reset([0])                                      # a new request starts afresh
    assert planner.choose(_ctx(1, 500, history=300, generated=40)).label.startswith(
        "draft_model:")


def test_a_round_prompt_lookup_copied_is_not_one_the_draft_model_would_win():
    """A rewrite's first round: prompt lookup drafts a 1-token match, and the draft model,
    300 tokens behind, is not worth its catch-up yet but would have won the round caught up.
    If the match's guesses were right (the answer copies its prompt), the round does not count
    towards the share of rounds the draft model is expected to draft in (`_draft_share`),
    which spreads its catch-up; if they were wrong, it does."""
    costs = _lump_costs()
    wins = {}
    for accepted in (0, 3):
        planner = AdaptivePlanner(16, costs, draft_model=LaggingDraft(300), ngram=FixedMatch(1))
        planner.reset([0])
        plan = planner.choose(_ctx(1, 500, history=300, generated=1))
        assert plan.label.startswith("ngram:") and plan.notes.draft_won == (True,)
        planner.observe(plan, [min(accepted, plan.k)], [plan.k], 0.0, 0.0)
        wins[accepted] = (planner.rounds[0], planner.draft_wins[0], planner._draft_share([0]))
    assert wins[0] == (1, 1, 1.0)
    assert wins[3] == (1, 0, pytest.approx(2 / 3))


def test_in_a_batch_only_the_rows_whose_lookup_guesses_were_right_copied():
    """Per row: of two rows whose prompt-lookup round the draft model would have won, the one
    whose guesses were accepted copied (not won), the other not; a draft-model round whose
    guesses were accepted is won as before."""
    costs = _lump_costs()
    planner = AdaptivePlanner(16, costs, draft_model=LaggingDraft(300), ngram=FixedMatch(1))
    planner.reset([0, 1])
    plan = planner.choose(_ctx(2, 500, history=300, generated=1))
    assert plan.label.startswith("ngram:") and plan.notes.draft_won == (True, True)
    planner.observe(plan, [2, 0], [plan.k, plan.k], 0.0, 0.0)
    assert planner.rounds == [1, 1] and planner.draft_wins == [0, 1]
    caught_up = AdaptivePlanner(16, costs, draft_model=LaggingDraft(1))
    caught_up.reset([0])
    plan = caught_up.choose(_ctx(1, 500, history=300, generated=1))
    assert plan.label.startswith("draft_model:") and plan.notes.draft_won == (True,)
    caught_up.observe(plan, [plan.k], [plan.k], 0.0, 0.0)
    assert caught_up.rounds == [1] and caught_up.draft_wins == [1]


def _fast_memory_costs() -> CostModel:
    """A calibration timed while memory ran fast (a 57 ms target step; its curves' first 17
    pass sizes, in ms): a verify pass costs more steps than in slow memory."""
    verify = [57.2, 76.6, 85.9, 91.4, 94.5, 99.4, 104.0, 110.1, 116.7, 126.6, 136.6, 146.6,
              156.6, 166.6, 176.6, 186.6, 197.7]
    draft = [9.1, 12.2, 13.3, 13.3, 13.3, 13.3, 19.4, 19.4, 20.5, 21.6, 22.6, 23.7, 24.7, 25.7,
             26.8, 27.8, 29.8]
    return CostModel(verify=[v / 1e3 for v in verify], draft=[d / 1e3 for d in draft])


def test_a_calibration_timed_in_fast_memory_still_buys_the_draft_for_a_code_prompt():
    """On `_fast_memory_costs`, buying the draft model's read of an 80-token prompt, spread
    over the 16 tokens a new answer is expected to run, needs an acceptance of ~0.72. At the
    draft model's prior a request's first round buys it (at 0.65 and 0.7 it decoded such a
    request plain throughout, where drafting was ~2x plain)."""
    costs = _fast_memory_costs()
    planner = AdaptivePlanner(16, costs, draft_model=LaggingDraft(80))
    planner.reset([0])
    assert planner.choose(_ctx(1, 500, history=80, generated=1)).label.startswith(
        "draft_model:")


def _first_draft_round(sure, lag=150, rounds=60):
    """(round, plan) of the first draft-model round of a request whose draft model is `lag`
    tokens behind, on `_fast_memory_costs`, each plain step before it reporting the target's
    confidence `sure` in its token (None: not reported)."""
    planner = AdaptivePlanner(16, _fast_memory_costs(), draft_model=LaggingDraft(lag))
    planner.reset([0])
    for i in range(rounds):
        plan = planner.choose(_ctx(1, 500, history=lag, generated=1 + i))
        if plan.k:
            return i, plan.label
        assert plan.wants_sure           # the draft model has not drafted yet: it asks
        planner.observe(plan, [0], [0], 0.0, 1.0, None if sure is None else [sure])
    return None


def test_a_target_sure_of_its_plain_steps_buys_the_draft_model_sooner():
    """A 150-token prompt the draft has not read: at the prior its catch-up is bought once the
    answer has run long enough to spread it over (rent or buy). Plain steps the target was
    sure of read as a draft that would be accepted as often: bought within a few rounds, and
    drafting longer. Unsure ones never delay it: the prior stands."""
    late = _first_draft_round(None)
    assert late is not None and late[0] >= 15
    assert _first_draft_round(0.3) == _first_draft_round(0.75) == late
    sure = _first_draft_round(0.99)
    assert sure[0] <= 3 and int(sure[1].split(":")[1]) > int(late[1].split(":")[1])


def test_the_target_is_heard_only_until_the_draft_model_drafts():
    """Once a row's draft model has drafted, its own outcomes are its estimates: a plain step
    no longer asks how sure the target was, and a confidence reported anyway moves nothing; a
    new request on the row is asked again, from the prior."""
    planner = AdaptivePlanner(16, _fast_memory_costs(), draft_model=LaggingDraft(150))
    planner.reset([0])
    ctx = _ctx(1, 500, history=150, generated=1)
    for _ in range(10):
        plan = planner.choose(ctx)
        if plan.k:
            break
        planner.observe(plan, [0], [0], 0.0, 1.0, [0.99])
    assert plan.label.startswith("draft_model:")
    planner.observe(plan, [0], [plan.k], 0.0, 1.0)                # drafted: all rejected
    _lost_on_merit(planner, 0)
    plan = planner.choose(ctx)
    assert plan.label == "plain" and not plan.wants_sure
    planner.observe(plan, [0], [0], 0.0, 1.0, [0.99])
    assert planner.states["draft_model"].alphas[0] == [0.05] * 16
    planner.reset([0])
    plan = planner.choose(ctx)
    assert plan.label == "plain" and plan.wants_sure
    assert planner.states["draft_model"].alphas[0] == [PRIORS["draft_model"]] * 16
    # the new request's mean starts from the prior, not from what the last one heard
    planner.observe(plan, [0], [0], 0.0, 1.0, [0.99])
    first = PRIORS["draft_model"] + (0.99 - PRIORS["draft_model"]) / (PRIOR_COUNT + 1)
    assert planner.states["draft_model"].alphas[0] == pytest.approx([first] * 16)


def test_a_row_the_planner_has_not_met_is_not_heard():
    """The engine's batch may hold rows the planner never planned for (requests admitted
    before `auto` ran, decoding plain beside it): their confidences are left alone."""
    planner = AdaptivePlanner(16, _fast_memory_costs(), draft_model=LaggingDraft(150))
    planner.reset([0])
    plan = planner.choose(_ctx(1, 500, history=150, generated=1))
    assert plan.wants_sure
    planner.observe(plan, [0, 0], [0, 0], 0.0, 1.0, [0.99, 0.99])
    assert len(planner.target_sure) == 1 and planner.sure_seen == [1]


def test_a_pass_is_priced_by_the_tokens_each_row_computes():
    """Rows are packed: a row without drafts adds one token, not K + 1; past the backend's
    pass size the rows run in chunks of whole rows, each streaming the weights again."""
    curve = [float(t) for t in range(1, 65)]          # a pass of r tokens costs r
    costs = CostModel(verify=curve, draft=[], chunk_rows=32)
    assert costs.verify_pass([1, 9, 1, 1]) == 12.0
    assert costs.verify_pass([0, 1, 0]) == 1.0        # rows that sit out cost nothing
    assert costs.verify_pass([17] * 4) == 4 * 17.0   # 17 + 17 > 32: one chunk per row
    assert costs.verify_pass([16] * 4) == 2 * 32.0
    assert costs.verify_seconds(9, 4) == costs.verify_pass([9] * 4)


class OneRowMatches:
    """An n-gram stand-in: row 0 copies (a 3-token match, always right), the others have
    nothing to look up."""

    name = "ngram"
    min_n, max_n = 1, 3

    def reset(self, rows):
        pass

    def matches(self, ctx, k):
        return [([7] * k, 3)] + [([], 0)] * (len(ctx.histories) - 1)


def test_a_match_of_one_row_in_a_busy_batch_is_drafted_when_it_pays():
    """Four rows, one of which copies: verifying its drafts costs only its own tokens (the
    others score one each), so on a pass that is memory-bound up to 12 tokens the planner
    drafts the copying row as far as that stays cheap."""
    curve = [max(1.0, t / 12) for t in range(1, 65)]
    costs = CostModel(verify=curve, draft=[], chunk_rows=32)
    planner = AdaptivePlanner(16, costs, draft_model=None, ngram=OneRowMatches())
    planner.reset([0, 1, 2, 3])
    for state in planner.states.values():                  # row 0 copies
        if state.drafter == "ngram":
            state.alphas[0] = [0.95] * 16
    plan = planner.choose(_ctx(4, remaining=500))
    assert plan.label == "ngram:8"       # 4 + 8 = 12 tokens: one memory-bound pass


def test_a_probe_never_pays_a_long_catch_up():
    """A draft model 300 tokens behind (a prompt it has not read) that lost on merit: at
    OPTIMISTIC acceptance it could win, spreading the catch-up over the answer, but a probe
    would pay all 300 tokens to learn one round's outcome, so it is not probed; the same
    draft 1 token behind is."""
    curve = [max(1.0, 0.25 * t) for t in range(1, 40)]
    costs = CostModel(verify=curve, draft=[0.05 * t for t in range(1, 40)])
    probed = {}
    for lag in (1, 300):
        planner = AdaptivePlanner(8, costs, draft_model=LaggingDraft(lag), ngram=None)
        planner.reset([0])
        _lost_on_merit(planner, 0)
        plans = _plans(planner, _ctx(1, remaining=500, history=lag), 3 * PROBE_BASE)
        probed[lag] = [p for p in plans if p != "plain"]
    assert probed[1] and not probed[300]


@pytest.mark.parametrize("wrong_all_along", [False, True])
def test_a_bad_stretch_is_not_held_against_the_draft_model(wrong_all_along):
    """A draft model right in a request's first rounds, then wrong until it sits out: each
    round sat out moves its estimates back up toward the request's mean acceptance, so it
    drafts again on merit well before its first probe (PROBE_BASE rounds). The same estimates
    with a mean as low as they are (a draft wrong all along) stay out until the probe."""
    costs = CostModel(verify=[1.0 + 0.03 * t for t in range(9)],
                      draft=[0.2 + 0.01 * t for t in range(9)])
    planner = AdaptivePlanner(8, costs, draft_model=LaggingDraft(1), ngram=None)
    planner.reset([0])
    ctx = _ctx(1, remaining=500)
    for right in [True] * 6 + [False] * 20:
        plan = planner.choose(ctx)
        if plan.k == 0:
            break
        planner.observe(plan, [plan.k if right else 0], [plan.k], 0.0, 0.0)
    assert plan.k == 0, "the bad stretch should have sidelined the draft model"
    state = planner.states["draft_model"]
    if wrong_all_along:
        state.tally[0][:] = [0, 40]
    low = list(state.alphas[0])
    sat_out = 0
    while plan.k == 0 and sat_out < 2 * PROBE_BASE:
        planner.observe(plan, [0], [0], 0.0, 0.0)
        sat_out += 1
        plan = planner.choose(ctx)
    if wrong_all_along:
        assert state.alphas[0] == low
        assert plan.notes.probe == "draft_model" and sat_out == PROBE_BASE - 1
    else:
        assert plan.label.startswith("draft_model:") and plan.notes.probe is None
        assert sat_out < PROBE_BASE // 2


def test_pooled_weighs_later_positions_by_the_earlier_ones():
    """The planner weighs a_1 as learnt and a_i as the mean of a_2 .. a_i."""
    assert pooled([0.5, 0.9, 0.6, 0.9]) == pytest.approx([0.5, 0.9, 0.75, 0.8])
    assert pooled([0.7]) == [0.7] and pooled([]) == []


def test_one_rejection_at_the_last_position_does_not_cut_k():
    """Drafts right 80% of the time at costs where K = 3 pays best: one round whose third
    guess is wrong drops that position's own estimate by WEIGHT, which alone would make K = 2
    look best until rounds at K = 2 (which never see position 3) let it recover; weighed with
    the positions before it, K stays 3."""
    costs = CostModel(verify=[1.0 + 0.2 * t for t in range(1, 40)], draft=[0.2] * 39)
    planner = AdaptivePlanner(8, costs, draft_model=LaggingDraft(1), ngram=None)
    planner.reset([0])
    planner.states["draft_model"].alphas[0][:] = [0.8] * 8
    planner.states["draft_model"].seen[0][:] = [50] * 8        # learnt over many rounds
    before = planner.choose(_ctx(1, remaining=500))
    planner.observe(before, [2], [before.k], 0.0, 1.0)         # positions 1, 2 right; 3 wrong
    after = planner.choose(_ctx(1, remaining=500))
    assert (before.k, after.k) == (3, 3)


def test_a_states_first_outcomes_weigh_as_a_mean_with_the_prior():
    """Until a position has been seen about 1 / WEIGHT times, the prior counts as PRIOR_COUNT
    observations and each outcome as one (a running mean), so a request's first rounds move
    its estimates quickly; after that each outcome weighs WEIGHT."""
    prior = PRIORS["draft_model"]
    alphas, seen = [prior] * 4, [0] * 4
    _learn(alphas, seen, 1, 3)                       # position 1 right, 2 wrong, 3 unseen
    assert alphas[:3] == pytest.approx([(PRIOR_COUNT * prior + 1) / (PRIOR_COUNT + 1),
                                        PRIOR_COUNT * prior / (PRIOR_COUNT + 1), prior])
    assert seen == [1, 1, 0, 0]
    for _ in range(40):
        _learn(alphas, seen, 0, 1)
    before = alphas[0]
    _learn(alphas, seen, 1, 1)
    assert alphas[0] == pytest.approx(before + WEIGHT * (1 - before))


def test_a_draft_accepted_every_time_reaches_a_long_k_within_a_few_rounds():
    """A request whose drafts are all accepted, at costs where K = 8 pays best once drafts
    are right 90% of the time: K climbs from the prior's choice to >= 6 within 4 rounds."""
    costs = CostModel(verify=[1.0 + 0.05 * t for t in range(1, 40)], draft=[0.08] * 39)
    planner = AdaptivePlanner(8, costs, draft_model=LaggingDraft(1), ngram=None)
    planner.reset([0])
    ks = _all_right(planner, 5)
    assert ks[0] < 6 <= ks[4], ks


def test_calibrations_are_keyed_by_the_cpu_arm_ones_too(tmp_path):
    """Arm's /proc/cpuinfo names no model: implementer and part stand for it, so a Neoverse N1
    and a V1 never share a calibration (both were 'unknown'); a CPU device keys as `cpu`."""
    from specrt.spec.calibration import cpu_name, device_name

    def info(part):
        path = tmp_path / f"cpuinfo-{part}"
        path.write_text("processor\t: 0\nBogoMIPS\t: 243.75\nCPU implementer\t: 0x41\n"
                        f"CPU architecture: 8\nCPU part\t: {part}\n\nprocessor\t: 1\n")
        return str(path)

    assert cpu_name(info("0xd0c")) == "arm implementer 0x41 part 0xd0c"
    assert cpu_name(info("0xd40")) != cpu_name(info("0xd0c"))
    x86 = tmp_path / "x86"
    x86.write_text("processor\t: 0\nmodel name\t: AMD EPYC 9R45\nflags\t: avx512f\n")
    assert cpu_name(str(x86)) == "AMD EPYC 9R45"
    assert device_name(torch.device("cpu")) == "cpu"


@pytest.mark.parametrize("first", ["companion", "seeded"])
def test_a_seeded_sampled_auto_request_gives_its_solo_tokens_beside_others(llm, monkeypatch,
                                                                          first):
    """auto plans each round for the whole batch, so beside a companion a seeded sampled
    request's rounds (and the random draws they consume) differed from its run alone, and so
    did its tokens. It now has the batch to itself: it waits for the running requests, and
    requests that come while it runs wait for it."""
    spec = {"method": "auto", "num_speculative_tokens": 5}
    pin_costs(llm, spec, monkeypatch)
    seeded = dict(max_new_tokens=40, speculative=spec, temperature=1.0, seed=7)
    companion = dict(max_new_tokens=60, speculative=spec)       # greedy: joins any batch
    repetitive = [9, 10, 11] * 5                                 # prompt lookup drafts here
    solo = llm.generate(PROMPTS[1], **seeded)
    solo_companion = llm.generate(repetitive, **companion).token_ids
    assert any(p != "plain" for p in solo.stats["plan_histogram"])    # it did speculate

    with slots_held_at_reserve(llm.engine) as busy_at_reserve:
        if first == "companion":
            stream = llm.stream(repetitive, **companion)
            got_companion = list(next(stream).token_ids)
            got = llm.generate(PROMPTS[1], **seeded)
            got_companion += [t for chunk in stream for t in chunk.token_ids]
        else:
            stream = llm.stream(PROMPTS[1], **seeded)
            got_ids = list(next(stream).token_ids)
            got_companion = llm.generate(repetitive, **companion).token_ids
            got_ids += [t for chunk in stream for t in chunk.token_ids]
            got = SimpleNamespace(token_ids=got_ids)
    assert got.token_ids == solo.token_ids          # differed at token 2-4 before
    assert got_companion == solo_companion
    assert busy_at_reserve == [0, 0], "a request shared the seeded request's batch"


# --- a draft that stops after a guess it is unsure of ----------------------------------------
class StoppingDraft(LaggingDraft):
    """The eager draft model as the planner sees it: it stops a row's round after a guess it
    is unsure of (`draft_stop`), so its rounds are priced and learnt as two kinds of guess."""

    stop_below = 0.5


def _stopping(max_k=16, costs=PAYING, batch=1, lag=1):
    planner = AdaptivePlanner(max_k, costs, draft_model=StoppingDraft(lag))
    planner.reset(list(range(batch)))
    return planner


def _simulated_round(rng, goes, alphas, unsure, k):
    """(tokens committed, guesses drafted) of one row's round of a draft that drafts on after
    a guess it was sure of (share `goes`) and stops after one it was not; a sure guess i is
    accepted at alphas[i], an unsure one at `unsure`."""
    committed, right, drafted = 1, True, 0
    for i in range(k):
        sure = rng.random() < goes
        right = right and rng.random() < (alphas[i] if sure else unsure)
        committed += right
        drafted += 1
        if not sure:
            break
    return committed, drafted


@pytest.mark.parametrize("goes, room", [([0.7], [6]), ([0.7, 0.7], [6, 6]),
                                        ([0.95, 0.3], [6, 6]), ([0.84, 0.84], [6, 2]),
                                        ([0.84, 0.84], [6, 0])])
def test_a_stopping_drafts_round_is_priced_as_it_runs(goes, room):
    """`_draft_round`'s tokens, draft steps and verify seconds are what rounds of such a draft
    average (simulated, 40,000 rounds, on a verify pass linear in its tokens): rows with
    different shares of sure guesses, and rows with room for fewer guesses (none: a row that
    sits the round out), each drafting as far as it would."""
    import random

    batch = len(goes)
    costs = CostModel(verify=[1.0 + 0.04 * t for t in range(1, 40)],
                      draft=[0.1 + 0.01 * t for t in range(1, 40)])
    planner = _stopping(costs=costs, batch=batch)
    alphas = [[0.9, 0.85, 0.8, 0.8, 0.7, 0.7], [0.6, 0.95, 0.9, 0.5, 0.9, 0.9]][:batch]
    planner.goes[:batch] = goes
    planner.unsure[:batch] = [0.3, 0.5][:batch]
    rows, k = [b for b in range(batch) if room[b]], 6
    cv = [costs.verify_pass([1 + min(j, r) for r in room]) for j in range(k + 1)]

    def verify(extra):
        return costs.verify_pass([1 + x for x in extra])

    e, steps, verified = planner._draft_round(rows, k, room, dict(enumerate(alphas)), cv,
                                              verify)
    rng, n = random.Random(0), 40_000
    tokens = drafted_steps = seconds = 0.0
    for _ in range(n):
        outcomes = [_simulated_round(rng, goes[b], alphas[b], planner.unsure[b],
                                     min(k, room[b])) if room[b] else (1, 0)
                    for b in range(batch)]
        tokens += sum(outcomes[b][0] for b in rows) / len(rows)
        drafted_steps += max(d for _, d in outcomes) - 1
        seconds += costs.verify_pass([1 + d for _, d in outcomes])
    assert e == pytest.approx(tokens / n, rel=0.01)
    assert steps == pytest.approx(drafted_steps / n, rel=0.02)
    assert verified == pytest.approx(seconds / n, rel=0.005)


def test_a_k_past_the_drafts_sure_stretches_costs_little():
    """A draft unsure of half its guesses stops about every second guess: drafting up to 16
    is worth about what the best K is. Priced as if it drafted all 16 (a draft that does not
    stop), K = 16 would be worth far less than the best."""
    def values(draft):
        planner = AdaptivePlanner(16, PAYING, draft_model=draft)
        planner.reset([0])
        planner.states["draft_model"].alphas[0][:] = [0.8] * 16
        planner.goes[0], planner.unsure[0] = 0.5, 0.4
        cv = [PAYING.verify_pass([1 + j]) for j in range(17)]
        costs = planner._catch_up(_ctx(1, 500), [0])
        out = []
        for k in range(1, 17):
            e, steps, verified = planner._draft_round([0], k, [16], {0: [0.8] * 16}, cv,
                                                      None)
            out.append(e / costs.cost(e, steps, verified))
        return out

    stopping, drafting_all = values(StoppingDraft(1)), values(LaggingDraft(1))
    assert stopping[-1] > 0.97 * max(stopping)
    assert drafting_all[-1] < 0.8 * max(drafting_all)


def test_a_stopping_draft_learns_how_often_it_is_sure_and_its_unsure_guesses():
    """A round that drafted fewer guesses than it could stopped after an unsure last guess:
    its guesses before went on (sure), the last did not, and it was seen only if every sure
    one was right. The sure guesses alone feed the per-position estimates. A round cut by
    the row's room, or one that drafted its K, did not stop."""
    planner = _stopping(max_k=8)
    state = planner.states["draft_model"]
    plan = planner.choose(_ctx(1, 500))
    assert plan.label.startswith("draft_model:") and plan.k >= 4
    planner.observe(plan, [1], [2], 0.0, 1.0)        # sure guess right, unsure one wrong
    assert planner.goes_seen == [2] and planner.goes[0] < GOES
    assert planner.unsure_seen == [1] and planner.unsure[0] < UNSURE
    assert state.seen[0][:2] == [1, 0] and state.alphas[0][0] > PRIORS["draft_model/sure"]
    assert state.tally[0] == [1, 1]

    planner.reset([0])
    plan = planner.choose(_ctx(1, 500))
    planner.observe(plan, [0], [1], 0.0, 1.0)        # unsure of its first guess
    assert planner.goes_seen == [1] and planner.unsure_seen == [1]
    assert state.seen[0] == [0] * 8 and state.tally[0] == [0, 0]   # no sure guess seen

    planner.reset([0])
    plan = planner.choose(_ctx(1, 500))
    planner.observe(plan, [plan.k], [plan.k], 0.0, 1.0)   # drafted its K: sure of all it
    assert planner.goes_seen == [plan.k - 1] and planner.goes[0] > GOES   # went on after
    assert planner.unsure_seen == [0]

    planner.reset([0])
    plan = planner.choose(_ctx(1, 500))
    planner.observe(plan, [1], [plan.k], 0.0, 1.0)   # past the rejected second guess the
    assert planner.goes_seen == [2]                  # draft read its own guess: not learnt

    from specrt.spec.drafters.base import DraftContext

    planner = _stopping(max_k=8, batch=2)
    ctx = DraftContext(histories=[[1] * 4] * 2, active=[True] * 2,
                       params=[SamplingParams()] * 2, generators=[None] * 2,
                       remaining=[3, 500])           # row 0 has room for 2 guesses only
    plan = planner.choose(ctx)
    assert plan.k > 2 and plan.notes.rooms == (2, 8)
    planner.observe(plan, [2, 0], [2, 1], 0.0, 1.0)   # row 0 drafted its room; row 1 stopped
    assert planner.goes_seen == [1, 1] and planner.goes[0] > GOES > planner.goes[1]
    assert planner.unsure_seen == [0, 1]


def test_a_full_rounds_last_guess_is_learnt_as_the_kind_the_draft_reported():
    """A round that drafted its K ended on a guess the draft did not draft past; where the
    draft reports its kind (`last_sure`), an unsure one is learnt as unsure (the per-position
    estimates do not learn it, the share of sure guesses counts it as a stop) and a sure one
    as sure. So K = 1 rounds over unsure guesses no longer drag the sure guesses' estimate
    down."""
    planner = _stopping(max_k=8)
    state = planner.states["draft_model"]
    plan = planner.choose(_ctx(1, 500))
    k = plan.k
    planner.observe(plan, [k - 1], [k], 0.0, 1.0, last_sure=[False])  # the unsure last missed
    assert planner.goes_seen == [k] and planner.unsure_seen == [1]
    assert planner.unsure[0] < UNSURE
    assert state.tally[0] == [k - 1, k - 1] and state.seen[0][k - 1] == 0

    planner.reset([0])
    plan = planner.choose(_ctx(1, 500))
    planner.observe(plan, [plan.k], [plan.k], 0.0, 1.0, last_sure=[True])
    assert planner.goes_seen == [plan.k] and planner.goes[0] > GOES
    assert planner.unsure_seen == [0] and state.tally[0] == [plan.k, plan.k]

    for last in (None, True, False):                 # K = 1, its one guess missed
        planner.reset([0])
        plan = dataclasses.replace(planner.choose(_ctx(1, 500)), k=1)
        planner.observe(plan, [0], [1], 0.0, 1.0,
                        last_sure=None if last is None else [last])
        learnt_sure = state.alphas[0][0] < PRIORS["draft_model/sure"]
        assert learnt_sure == (last is not False), last
        assert planner.unsure_seen == [int(last is False)], last


def test_a_stopping_draft_that_drafted_one_unsure_guess_has_drafted():
    """A round that stopped after its first guess observed no sure guess, yet the draft model
    has drafted: the row's plain steps no longer ask how sure the target was, and what they
    report lifts nothing (evidence against the draft read as a reason to lift it)."""
    planner = _stopping(costs=_fast_memory_costs(), lag=1)
    planner.draft_model.lag = 1
    ctx = _ctx(1, 500, history=150, generated=1)
    plan = planner.choose(ctx)
    assert plan.label.startswith("draft_model:")
    planner.observe(plan, [0], [1], 0.0, 1.0)
    state = planner.states["draft_model"]
    assert state.tally[0] == [0, 0]                   # no sure guess seen
    state.alphas[0][:] = [0.05] * 16                  # ... and the draft since found wanting
    plan = planner.choose(ctx)
    assert plan.label == "plain" and not plan.wants_sure
    planner.observe(plan, [0], [0], 0.0, 1.0, [0.99])
    assert max(state.alphas[0]) < 0.2                 # relaxed a little, not lifted to 0.99


def test_sitting_out_relaxes_a_stopping_drafts_estimates_up_to_their_priors():
    """A bad stretch is not held against the draft model for the rest of the answer: each
    round it sits out, its share of sure guesses and their acceptance below their priors move
    RELAX of the way back (an estimate above its prior stays)."""
    from specrt.spec.planners.adaptive import RELAX

    planner = _stopping(batch=2)
    planner.goes[:] = [0.2, 0.95]
    planner.unsure[:] = [0.1, 0.6]
    _lost_on_merit(planner, 0)
    _lost_on_merit(planner, 1)
    plan = planner.choose(_ctx(2, 500))
    assert plan.label == "plain"
    planner.observe(plan, [0, 0], [0, 0], 0.0, 1.0)
    assert planner.goes == pytest.approx([0.2 + RELAX * (GOES - 0.2), 0.95])
    assert planner.unsure == pytest.approx([0.1 + RELAX * (UNSURE - 0.1), 0.6])


def test_a_heard_target_lifts_a_stopping_drafts_sure_guesses_to_match_it():
    """The target's mean confidence predicts how often the draft's guesses are right, sure
    and unsure together: a stopping draft's estimates (of its sure guesses) are lifted to
    what, beside its unsure ones, averages that mean."""
    planner = _stopping(costs=_fast_memory_costs(), lag=150)
    plan = planner.choose(_ctx(1, 500, history=150, generated=1))
    assert plan.label == "plain" and plan.wants_sure
    planner.observe(plan, [0], [0], 0.0, 1.0, [0.99])
    heard = PRIORS["draft_model"] + (0.99 - PRIORS["draft_model"]) / (PRIOR_COUNT + 1)
    lifted = max(PRIORS["draft_model/sure"], (heard - (1 - GOES) * UNSURE) / GOES)
    assert planner.states["draft_model"].alphas[0] == pytest.approx([lifted] * 16)
    assert lifted > PRIORS["draft_model/sure"]
