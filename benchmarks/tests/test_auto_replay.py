"""benchmarks.auto_replay: a replay of a recorded trace runs the rounds the engine runs."""
import statistics

import pytest

import specrt
from benchmarks import auto_replay
from specrt.engine.request import Request
from specrt.spec.config import SpecConfig
from specrt.spec.costs import CostModel
from specrt.spec.drafters.ngram import NgramDrafter
from specrt.spec.planners.adaptive import AdaptivePlanner
from specrt.spec.sampling import SamplingParams
from tests.tiny import make_model

N_NEW = 32
ITEMS = [("tuning", "code", {"id": "a", "prompt": "def add(a, b): return a + b"}),
         ("held-out", "story", {"id": "b", "messages": [
             {"role": "user", "content": "Tell me a story."},
             {"role": "assistant", "content": "Once upon a time"},
             {"role": "user", "content": "Go on."}]})]


@pytest.fixture(scope="module")
def llm(tiny_noeos_dir, tmp_path_factory):
    # a draft noisier than the shared one, which agrees with this target on every token here
    draft = make_model(tmp_path_factory.mktemp("replay_draft"), "qwen2", seed=7, eos=False,
                       noise_from=tiny_noeos_dir, noise=0.35)
    return specrt.LLM(tiny_noeos_dir, draft=draft, max_seq_len=256, dtype="float32")


@pytest.fixture(scope="module")
def traces(llm):
    return auto_replay.record_traces(llm, ITEMS, N_NEW)


@pytest.fixture(scope="module")
def stop(llm, traces) -> float:
    """The draft's stop, set on the engine to the lower quartile of its recorded confidences
    (the tiny draft is unsure of every guess, ~1/50: at the default 0.5 every round would stop
    after one guess), so some rounds stop early and some draft on."""
    value = statistics.quantiles([c for t in traces.values() for c in t["confidence"]], n=4)[0]
    llm.engine.draft_drafter.stop_below = value
    return value


def test_a_trace_holds_the_plain_output_and_the_draft_guesses(llm, traces):
    assert set(traces) == {"tuning:code:a", "held-out:story:b"}
    for key, trace in traces.items():
        assert trace["output"] == llm.generate(trace["prompt"], max_new_tokens=N_NEW).token_ids
        assert len(trace["draft"]) == len(trace["output"]) == len(trace["confidence"]) == N_NEW
        assert all(0.0 < c <= 1.0 for c in trace["confidence"])
    # the tiny draft is its target plus noise: it agrees often, and not always
    matches = [g == t for tr in traces.values() for g, t in zip(tr["draft"], tr["output"])]
    assert 0 < sum(matches) < len(matches)


def test_a_shortlisted_draft_records_the_ids_its_request_read_from_where_it_read_them(
        tiny_noeos_dir):
    """The draft as the target itself, scoring ids < 100 and the ids its request has read: its
    recorded guess is the target's token wherever that token is one it scores by then (a read
    id from the position after it was read), and never an id it does not yet score."""
    llm = specrt.LLM(tiny_noeos_dir, draft=tiny_noeos_dir, max_seq_len=256, dtype="float32",
                     draft_vocab=100)
    try:
        shortlist = set(llm.engine.draft.head_rows.tolist())
        traces = auto_replay.record_traces(llm, ITEMS, 24)
    finally:
        llm.close()
    read_hits = 0
    for trace in traces.values():
        text = trace["prompt"] + trace["output"]
        for i, (guess, token) in enumerate(zip(trace["draft"], trace["output"])):
            scored = shortlist | set(text[:len(trace["prompt"]) + i])
            assert guess in scored
            if token in scored:
                assert guess == token
                read_hits += token not in shortlist
    assert read_hits         # some token past the shortlist was guessed from having read it


def _engine_run(llm, prompt, method, costs, max_new_tokens=N_NEW, planner_cls=AdaptivePlanner):
    """The engine generating `prompt` with `method`; auto plans with `costs`."""
    name, k = method.split(":")
    spec = SpecConfig(method=name, num_speculative_tokens=int(k))
    planner = None
    if name == "auto":
        planner = planner_cls(int(k), costs, draft_model=llm.engine.draft_drafter,
                              ngram=NgramDrafter(spec.prompt_lookup_min,
                                                 spec.prompt_lookup_max))
    request = Request(tuple(prompt), max_new_tokens, SamplingParams(), spec)
    steps = [s for batch in llm.engine.run([request], planner=planner) for s in batch]
    return [t for s in steps for t in s.new_tokens], steps[-1].stats


def _cheap_draft_costs() -> CostModel:
    """Costs that make the draft model cheap, so auto mixes both drafters and several K."""
    return CostModel(verify=[1.0 + 0.03 * t for t in range(1, 33)],
                     draft=[0.05 + 0.01 * t for t in range(1, 33)])


@pytest.mark.parametrize("method", ["draft_model:3", "ngram:4", "auto:8"])
def test_replay_runs_the_rounds_the_engine_runs(llm, traces, stop, method):
    """The same plans (rounds per drafter and K), target passes (the engine counts its prefill
    as one) and accepted drafts (up to the last round's overshoot) as the engine generating
    the same prompt, the draft model stopping where the engine's does. auto plans with costs
    that make the draft model cheap, so it mixes both drafters and several K."""
    costs = _cheap_draft_costs()
    mixes = []
    for trace in traces.values():
        out, stats = _engine_run(llm, trace["prompt"], method, costs)
        assert out == trace["output"]
        _, mix, accepted = auto_replay.replay(trace, method, costs, draft_stop=stop)
        assert mix == stats["plan_histogram"], trace["prompt"]
        assert sum(mix.values()) + 1 == stats["target_passes"]
        # neither drafts past the token budget (`DraftContext.room`)
        assert stats["num_accepted_tokens"] == accepted
        mixes.append(mix)
    if method == "auto:8":
        labels = {m for mix in mixes for m in mix}
        assert any(m.startswith("draft_model") for m in labels) and len(labels) >= 3, labels


@pytest.fixture(scope="module")
def traces_64(llm):
    return auto_replay.record_traces(llm, ITEMS, 64)


@pytest.mark.parametrize("quartile", [0, 1, 2])
def test_auto_learns_in_the_replay_what_it_learns_in_the_engine(llm, traces_64, quartile):
    """Past a rejected guess the live draft reads its own guess and the replay the recorded
    (teacher-forced) text, so their drafts there differ; what `auto` learns from a round may
    not: the same plans, acceptances and share of sure guesses round by round over 64-token
    answers, at draft stops from the lower quartile of the confidences to the upper (learnt
    from every drafted guess, the share parted from the engine's by round 20 at 64 tokens)."""
    stop = statistics.quantiles([c for t in traces_64.values() for c in t["confidence"]],
                                n=4)[quartile]
    saved = llm.engine.draft_drafter.stop_below
    llm.engine.draft_drafter.stop_below = stop
    log = []

    class Logged(AdaptivePlanner):
        def observe(self, plan, num_accepted, num_drafted, *args, **kwargs):
            super().observe(plan, num_accepted, num_drafted, *args, **kwargs)
            log.append((plan.label, num_accepted[0], round(self.goes[0], 9),
                        round(self.unsure[0], 9), tuple(self.states["draft_model"].tally[0])))

    costs = _cheap_draft_costs()
    try:
        for trace in traces_64.values():
            log.clear()
            _, stats = _engine_run(llm, trace["prompt"], "auto:8", costs, 64, Logged)
            live = list(log)
            log.clear()
            mix = auto_replay.replay(trace, "auto:8", costs, Logged, draft_stop=stop)[1]
            assert log == live and mix == stats["plan_histogram"], trace["prompt"]
            assert any(label.startswith("draft_model") for label, *_ in live)
    finally:
        llm.engine.draft_drafter.stop_below = saved


def test_replay_hears_the_target_as_the_engine_does(llm, traces, stop):
    """A trace records the target's confidence in each token of its answer. With a draft prior
    below the (tiny, unsure) target's confidences, what `auto` hears from its plain steps lifts
    the draft model's estimates: the replay hears, round by round, what the engine hears
    (the recorded confidence of the token each plain step commits), runs the rounds the
    engine runs, and not the ones it runs deaf to them."""
    from specrt.spec.planners.adaptive import PRIORS

    sures = [c for t in traces.values() for c in t["target_confidence"]]
    assert all(0.0 < c <= 1.0 for c in sures)
    assert all(len(t["target_confidence"]) == len(t["output"]) for t in traces.values())
    low, mean = min(sures) / 2, statistics.mean(sures)
    heard = []

    class LowPrior(AdaptivePlanner):          # the draft model alone (this target repeats
        priors = dict(PRIORS, **{"draft_model": low,   # itself: prompt lookup takes every
                                 "draft_model/sure": low})             # round)
        goes_prior, unsure_prior = 1.0, low       # every guess priced at the low prior

        def __init__(self, max_k, costs, draft_model=None, ngram=None):
            super().__init__(max_k, costs, draft_model=draft_model)

        def observe(self, plan, num_accepted, num_drafted, draft_seconds, verify_seconds,
                    target_sure=None, last_sure=None):
            heard.append(None if target_sure is None else target_sure[0])
            super().observe(plan, num_accepted, num_drafted, draft_seconds, verify_seconds,
                            target_sure, last_sure)

    # a draft step costs what a guess accepted at midway between the two saves: a K = 1
    # round beats a plain step once heard, not before
    costs = CostModel(verify=[1.0] * 33, draft=[(low + mean) / 2] * 33)
    changed = 0
    for trace in traces.values():
        heard.clear()
        out, stats = _engine_run(llm, trace["prompt"], "auto:8", costs, planner_cls=LowPrior)
        live = list(heard)
        assert out == trace["output"]
        heard.clear()
        mix = auto_replay.replay(trace, "auto:8", costs, LowPrior, draft_stop=stop)[1]
        assert mix == stats["plan_histogram"], trace["prompt"]
        assert [h is None for h in heard] == [h is None for h in live]
        assert [h for h in heard if h is not None] == pytest.approx(
            [h for h in live if h is not None], rel=1e-4)
        assert any(h is not None for h in live)
        deaf = dict(trace, target_confidence=None)
        changed += auto_replay.replay(deaf, "auto:8", costs, LowPrior, draft_stop=stop)[1] != mix
    assert changed


def test_the_oracle_prior_is_not_lifted_by_what_auto_hears(traces):
    """`auto_oracles`' "oracle accept" plans from the trace's true agreement: deaf to the
    target's confidence, which lifts the shipped planner's estimates."""
    from benchmarks import auto_oracles

    rules = auto_oracles.planners(traces["tuning:code:a"])
    for rule, lifted in (("oracle accept", False), ("both oracles", False), ("auto", True)):
        planner = (rules[rule] or AdaptivePlanner)(4, _cheap_draft_costs(),
                                                   draft_model=auto_replay.TraceDraft())
        planner.reset([0])
        before = list(planner.states["draft_model"].alphas[0])
        planner._hear_target([0.999])          # what a plain step's observe passes on
        assert (planner.states["draft_model"].alphas[0] != before) == lifted, rule


def test_a_cut_trace_replays_a_request_with_that_budget(llm, traces, stop):
    """`replay --max-new-tokens N`: a trace cut to its first N tokens replays what the engine
    runs for a request of N tokens (auto's horizon and the last round's room depend on the
    budget, not only on the text)."""
    costs = _cheap_draft_costs()
    for trace in traces.values():
        short = auto_replay.cut(trace, 12)
        assert short["output"] == trace["output"][:12] and short["max_new_tokens"] == 12
        assert short["confidence"] == trace["confidence"][:12]
        out, stats = _engine_run(llm, trace["prompt"], "auto:8", costs, max_new_tokens=12)
        assert out == short["output"]
        assert auto_replay.replay(short, "auto:8", costs, draft_stop=stop)[1] \
            == stats["plan_histogram"]


def test_oracles_replay_auto_with_each_draft_prior_asked(traces):
    """`auto_oracles --draft-priors`: a rule per prior, each planning from its own prior. With a
    cheap verify pass the draft model pays at a 0.95 prior and not at 0.05, so the first drafts
    it for more rounds (the second only once a probe shows the draft is better than feared)."""
    from benchmarks import auto_oracles

    trace = traces["tuning:code:a"]
    rules = auto_oracles.planners(trace, (0.05, 0.95))
    assert {"auto", "prior 0.05", "prior 0.95"} <= set(rules)
    costs = CostModel(verify=[1.0 + 0.05 * t for t in range(1, 33)],
                      draft=[0.05 + 0.01 * t for t in range(1, 33)])
    rounds = {}
    for rule in ("prior 0.05", "prior 0.95"):
        _, mix, _ = auto_replay.replay(trace, "auto:4", costs, rules[rule])
        rounds[rule] = sum(n for m, n in mix.items() if m.startswith("draft_model"))
    assert rounds["prior 0.95"] > rounds["prior 0.05"], rounds


def test_a_fixed_setting_chosen_on_the_answer_start_is_the_fastest_there():
    """`auto_oracles`' "fixed, 1/2 seen": the fixed setting fastest on the answer's first part,
    which need not be the best in hindsight. Here only the draft model guesses the answer's
    first quarter, and the rest copies the prompt: chosen on the first quarter, a draft-model
    setting; on the whole answer, prompt lookup, the fastest of all."""
    from benchmarks import auto_oracles

    prompt = list(range(1000, 1064))
    out = list(range(2000, 2016)) + prompt[:48]
    trace = {"set": "tuning", "prompt": prompt, "output": out, "draft": out[:16] + [7] * 48,
             "confidence": [1.0] * 64, "max_new_tokens": 64}
    costs = _cheap_draft_costs()
    fixed = auto_replay.fixed_methods(auto_replay.FIXED)
    speeds = {m: auto_replay.replay(trace, m, costs)[0] for m in fixed}
    assert auto_oracles.chosen_on_start(trace, fixed, costs, 1.0) == max(speeds, key=speeds.get)
    assert max(speeds, key=speeds.get).startswith("ngram")
    assert auto_oracles.chosen_on_start(trace, fixed, costs, 0.25).startswith("draft_model")


def test_task_misses_count_tasks_by_their_mean_share():
    """The goal's measure: a task (a set's prompts of one kind) misses where the mean share of
    the best fixed setting over its prompts is below 95%, whatever its lowest prompt."""
    from benchmarks import auto_oracles

    def row(trace, share):
        return {"trace": trace, "set": trace.split(":")[0], "budget": 64, "best": 10.0,
                "plain": 5.0, "auto": {"auto": 10.0 * share}}

    rows = [row("tuning:code:a", 0.92), row("tuning:code:b", 1.00),
            row("tuning:story:c", 0.90), row("tuning:story:d", 0.99)]
    assert auto_oracles.task_misses(rows) == [[64, "auto", "1 of 2", "tuning:story"]]


@pytest.mark.parametrize("argv, needle", [
    (["--draft-priors", "1.5"], "--draft-priors: each prior is an acceptance probability"),
    (["--draft-priors", "x"], "--draft-priors: expected comma-separated numbers"),
    (["--sets", "nosuch"], "--sets: no traces of nosuch")])
def test_oracles_reject_bad_options_with_a_clear_error(argv, needle, capsys, tmp_path):
    from benchmarks import auto_oracles

    path = tmp_path / "traces.json"
    path.write_text('{"target": "t", "draft": "d", "traces": {"tuning:code:a": '
                    '{"set": "tuning", "prompt": [1], "output": [2], "draft": [2]}}}')
    with pytest.raises(SystemExit) as err:
        auto_oracles.main([*argv, "--traces", str(path)])
    assert err.value.code == 2
    assert needle in capsys.readouterr().err


def test_replay_rejects_a_budget_below_two_tokens(capsys):
    with pytest.raises(SystemExit) as err:
        auto_replay.main(["replay", "--max-new-tokens", "1"])
    assert err.value.code == 2
    assert "--max-new-tokens must be at least 2" in capsys.readouterr().err


def _traces_file(tmp_path, **traces) -> str:
    import json

    path = tmp_path / "traces.json"
    path.write_text(json.dumps({"target": "t", "draft": "d", "traces": traces}))
    return str(path)


def test_a_trace_cut_by_its_budget_is_not_replayed_past_it():
    """A trace that ran to its recorded budget does not say how the answer went on: a longer
    budget is refused, not replayed as an answer that ended there. One that ended on its own
    replays at any budget as a request of that budget."""
    stopped = {"set": "tuning", "prompt": [1], "output": [2, 3, 4, 5], "draft": [2, 3, 4, 5],
               "max_new_tokens": 4}
    ended = dict(stopped, max_new_tokens=8)
    assert auto_replay.cut(stopped, 3)["max_new_tokens"] == 3
    assert auto_replay.cut(stopped, 4)["output"] == stopped["output"]
    with pytest.raises(ValueError, match="budget of 4 tokens"):
        auto_replay.cut(stopped, 5)
    long = auto_replay.cut(ended, 512)
    assert long["output"] == ended["output"] and long["max_new_tokens"] == 512
    assert auto_replay.cut_all({"a": ended}, 512, "--budgets")["a"] == long


@pytest.mark.parametrize("main, argv, needle", [
    ("oracles", ["--budgets", "64,128,512"], "--budgets: 1 of 1 traces stopped at a recorded "
                                             "budget below 512 tokens (the lowest 128)"),
    ("oracles", ["--budgets", "64,x"], "--budgets must be comma-separated integers"),
    ("oracles", ["--device", "gpu"], "--device must be cpu, cuda or cuda:N"),
    ("replay", ["--max-new-tokens", "200"], "use at most 128"),
    ("replay", ["--fixed", "draft_model:2,draft_modle:3"],
     "--fixed: 'draft_modle:3' is not draft_model:K or ngram:K"),
    ("replay", ["--fixed", "ngram"], "--fixed: 'ngram' is not draft_model:K or ngram:K"),
    ("replay", ["--fixed", "ngram:0"], "--fixed: K of 'ngram:0' must be positive")])
def test_replays_refuse_bad_budgets_and_methods_before_loading(main, argv, needle, capsys,
                                                               tmp_path):
    from benchmarks import auto_oracles

    out = list(range(128))
    path = _traces_file(tmp_path, **{"tuning:code:a": {
        "set": "tuning", "prompt": [1], "output": out, "draft": out, "confidence": [1.0] * 128,
        "max_new_tokens": 128}})
    run = auto_oracles.main if main == "oracles" else \
        lambda a: auto_replay.main(["replay", "--no-record", *a])
    with pytest.raises(SystemExit) as err:
        run([*argv, "--traces", path, "--model", "/nonexistent"])
    assert err.value.code == 2
    assert needle in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["replay"], ["record"]])
def test_replay_needs_a_draft_with_a_custom_target(argv, tiny_noeos_dir, capsys, tmp_path):
    path = _traces_file(tmp_path, **{"tuning:code:a": {
        "set": "tuning", "prompt": [1], "output": [2, 3], "draft": [2, 3],
        "confidence": [1.0, 1.0], "max_new_tokens": 2}})
    with pytest.raises(SystemExit) as err:
        auto_replay.main([*argv, "--model", str(tiny_noeos_dir), "--traces", path])
    assert err.value.code == 2
    assert "--model was given without --draft" in capsys.readouterr().err


@pytest.mark.parametrize("graphs", [False, True])
def test_with_cuda_graphs_the_replay_drafts_k_every_round_as_the_engine_does(
        graphs, tiny_noeos_dir, tiny_draft_dir, tmp_path, monkeypatch, capsys):
    """The static draft loop (CUDA graphs, the default on CUDA) always drafts K: a replay that
    still stopped at --draft-stop would price and teach rounds the engine never runs. Nor
    does a static round tell `auto` how sure the target was: the replay does not hear it."""
    path = _traces_file(tmp_path, **{"tuning:code:a": {
        "set": "tuning", "prompt": [1, 2, 3], "output": [2, 3, 4], "draft": [2, 3, 4],
        "confidence": [0.1, 0.1, 0.1], "target_confidence": [0.9, 0.9, 0.9],
        "max_new_tokens": 3}})
    real_llm, seen = specrt.LLM, []
    monkeypatch.setattr(specrt, "LLM", lambda *a, **kw: real_llm(*a, cuda_graphs=graphs,
                                                                 max_seq_len=64, **kw))
    monkeypatch.setattr(auto_replay, "replay_all",
                        lambda traces, fixed, auto, costs, stop: seen.append(
                            (stop, all("target_confidence" in t for t in traces.values())))
                        or [])
    monkeypatch.setattr(auto_replay, "render", lambda rows, auto: "")
    auto_replay.main(["replay", "--no-record", "--model", str(tiny_noeos_dir), "--draft",
                      str(tiny_draft_dir), "--dtype", "float32", "--traces", path])
    assert seen == [(0.0, False) if graphs else (0.5, True)]
    assert ("--draft-stop 0.5 ignored" in capsys.readouterr().err) == graphs


def test_lookup_counts_first_guesses_by_matched_length():
    """`lookup` tallies, per set and matched length, prompt lookup's first guess at each output
    position after the first against the true next token."""
    traces = {"s:a": {"set": "s", "prompt": [5, 6, 7, 8], "output": [5, 6, 7, 9]},
              "t:b": {"set": "t", "prompt": [1, 2], "output": [3, 1, 2]}}
    counts = auto_replay.lookup_acceptance(traces)
    # s: after [..8, 5] "5" -> 6 (right, n 1); after "5 6" -> 7 (right, n 2); after "5 6 7"
    # -> 8, but 9 came (wrong, n 3)
    assert counts["s"] == {1: [1, 1], 2: [1, 1], 3: [1, 0]}
    # t: after [1, 2, 3] nothing matches "3"; after "3 1" the "1" -> 2 (right, n 1)
    assert counts["t"] == {1: [1, 1]}
    table = auto_replay.render_lookup(counts)
    assert "| s | 1.00 (1) | 1.00 (1) | 0.00 (1) |" in table and "| t | 1.00 (1) | - | - |" in table


@pytest.mark.parametrize("method", ["plain", "draft_model:3", "ngram:4", "auto:8"])
def test_live_prices_the_forwards_the_replay_prices_where_the_replay_is_exact(
        llm, traces, method, monkeypatch):
    """`live`: the engine's own forwards on a prompt, priced by the calibration `auto` plans
    with. Where the replay is exact (the draft model drafts every guess it is asked for, so
    no stop falls past a wrong guess) the two agree on the output, the plans and the price;
    the prompt's own pass is left out, as decode-only speeds leave it."""
    monkeypatch.setattr(llm.engine.draft_drafter, "stop_below", 0.0)
    costs = llm.cost_model(8)
    for trace in traces.values():
        tokens, tps, plans = auto_replay.live_run(llm, trace["prompt"], method, costs, N_NEW)
        assert tokens == trace["output"]
        replayed, mix, _ = auto_replay.replay(trace, method, costs, draft_stop=0.0)
        assert plans == mix
        assert tps == pytest.approx(replayed, rel=1e-9)
    assert "forward" not in vars(llm.engine.target) and "forward" not in vars(llm.engine.draft)


@pytest.mark.parametrize("argv, needle", [
    (["--sets", "tuning,tunnig"], "--sets: unknown set(s) tunnig; choose from tuning,"),
    (["--fixed", "draft_model:x"], "--fixed: K of 'draft_model:x' must be"),
    (["--max-new-tokens", "1"], "--max-new-tokens must be at least 2"),
    (["--model", "/nonexistent"], "target model directory /nonexistent does not exist")])
def test_live_refuses_bad_options_before_loading(argv, needle, capsys):
    with pytest.raises(SystemExit) as err:
        auto_replay.main(["live", "--no-record", *argv])
    assert err.value.code == 2
    assert needle in capsys.readouterr().err
