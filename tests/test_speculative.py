"""Speculative decoding is exact: greedy output equals plain greedy output token for token."""
import pytest

import specrt
from specrt.errors import SpecrtError
from tests.helpers import drafted_k_a_round

PROMPTS = [[5, 6, 7, 8], list(range(40, 70)), [250, 3], [9, 9, 9, 9, 9, 9]]


@pytest.fixture(scope="module")
def llm(tiny_noeos_dir, tiny_draft_dir):
    # Every round drafts all K (draft_stop 0), but where the budget has no room for K: the tiny
    # draft is unsure of every guess (~1/50), and these tests are about K. The stop has its own
    # tests (test_draft_stop.py), and the budget's room test_uncommittable_guesses.py.
    return specrt.LLM(tiny_noeos_dir, draft=tiny_draft_dir, max_seq_len=256, max_batch_size=3,
                      dtype="float32", draft_stop=0.0)


@pytest.fixture(scope="module")
def plain(llm):
    return {tuple(p): llm.generate(p, max_new_tokens=40).token_ids for p in PROMPTS}


@pytest.mark.parametrize("k", [1, 2, 3, 8])
def test_draft_model_greedy_equals_plain_batch_1(llm, plain, k):
    spec = {"method": "draft_model", "num_speculative_tokens": k}
    accepted = 0
    for p in PROMPTS:
        res = llm.generate(p, max_new_tokens=40, speculative=spec)
        assert res.token_ids == plain[tuple(p)], f"K={k} prompt={p}"
        accepted += res.stats["num_accepted_tokens"]
        assert res.stats["target_passes"] < 40 or k == 1
    assert accepted > 0      # the noisy-copy draft agrees often: long accepted runs happen


@pytest.mark.parametrize("k", [1, 3, 8])
def test_draft_model_greedy_equals_plain_batch_3(llm, plain, k):
    spec = {"method": "draft_model", "num_speculative_tokens": k}
    for prompts in (PROMPTS[:3], PROMPTS[1:]):
        results = llm.generate(prompts, max_new_tokens=40, speculative=spec)
        assert [r.token_ids for r in results] == [plain[tuple(p)] for p in prompts]


@pytest.mark.parametrize("k", [1, 4])
def test_unrelated_draft_still_exact(tiny_noeos_dir, tiny_bad_draft_dir, plain, k):
    llm = specrt.LLM(tiny_noeos_dir, draft=tiny_bad_draft_dir, max_seq_len=256, max_batch_size=3,
                     dtype="float32", draft_stop=0.0)
    results = llm.generate(PROMPTS[:3], max_new_tokens=40,
                           speculative={"method": "draft_model", "num_speculative_tokens": k})
    assert [r.token_ids for r in results] == [plain[tuple(p)] for p in PROMPTS[:3]]
    assert any(r.stats["num_accepted_tokens"] < r.stats["num_draft_tokens"] for r in results)
    # every round verified all K drafts (the unrelated draft is never sure: with a draft stop
    # each round would be K = 1), or as many as the budget had room for (DraftContext.room)
    for p in PROMPTS[:3]:
        run = llm.submit(p, max_new_tokens=40,
                         speculative={"method": "draft_model", "num_speculative_tokens": k})
        steps, done = [chunk.step for chunk in run.chunks()], 1
        for step in steps[1:]:
            assert len(step.draft_tokens) == min(k, 40 - done - 1), (done, step)
            done += len(step.new_tokens)
        assert len(steps) > 1 and done == 40


@pytest.mark.parametrize("k", [1, 2, 4, 8])
def test_ngram_greedy_equals_plain(llm, plain, k):
    spec = {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": 2}
    singles = [llm.generate(p, max_new_tokens=40, speculative=spec) for p in PROMPTS]
    assert [r.token_ids for r in singles] == [plain[tuple(p)] for p in PROMPTS]
    results = llm.generate(PROMPTS[:3], max_new_tokens=40, speculative=spec)
    assert [r.token_ids for r in results] == [plain[tuple(p)] for p in PROMPTS[:3]]
    # prompt lookup really drafted, and some drafts were right (not plain steps throughout)
    for runs in (singles, results):
        assert sum(r.stats["num_draft_tokens"] for r in runs) > 0
        assert sum(r.stats["num_accepted_tokens"] for r in runs) > 0


@pytest.mark.parametrize("static", [False, True])
def test_eos_and_budget_cut_rounds(tiny_noeos_dir, tmp_path, plain, static):
    """A round that commits several tokens stops at EOS (kept) and at max_new_tokens. The
    eager drafter drafts no guess past either (tests/test_uncommittable_guesses.py), so only
    the bonus token after an accepted EOS is dropped; the static one (`cuda_graphs`, its
    runners run eagerly on a CPU) drafts all K, and its rounds are cut at both."""
    import json
    import shutil

    # The target: tiny_noeos_dir's weights, with an EOS that plain greedy emits mid-answer
    # (the first token of its answer to PROMPTS[0] that differs from the answer's first).
    answer = plain[tuple(PROMPTS[0])]
    eos = next(t for t in answer if t != answer[0])
    target = shutil.copytree(tiny_noeos_dir, tmp_path / "target")
    (target / "generation_config.json").write_text(json.dumps({"eos_token_id": [eos]}))
    # The draft: the same weights, unquantized (draft_dtype "auto" is int8 on a CPU), drafting
    # all K: always right, so every round commits K + 1 tokens unless EOS or the budget cuts it.
    llm = specrt.LLM(target, draft=tiny_noeos_dir, max_seq_len=256, dtype="float32",
                     draft_dtype="float32", draft_stop=0.0, cuda_graphs=static)
    assert llm.eos_ids == {eos}
    cut = set()          # the finish reasons of the runs whose last round was cut
    for p in PROMPTS:
        ref = llm.generate(p, max_new_tokens=33)
        spec = llm.generate(p, max_new_tokens=33,
                            speculative={"method": "draft_model", "num_speculative_tokens": 8})
        assert spec.token_ids == ref.token_ids
        assert spec.finish_reason == ref.finish_reason
        s = spec.stats
        assert s["num_accepted_tokens"] == s["num_draft_tokens"] > 0
        if static:
            assert s["num_draft_tokens"] == 8 * s["num_drafts"]
        assert s["new_tokens"] == len(spec.token_ids)
        if spec.finish_reason == "eos":
            assert spec.token_ids[-1] == eos and eos not in spec.token_ids[:-1]
            assert len(spec.token_ids) < 33
        else:
            assert spec.finish_reason == "length" and len(spec.token_ids) == 33
            assert eos not in spec.token_ids
        # the prefill commits 1 token and each round accepted + 1, unless its end was dropped
        if s["new_tokens"] < s["target_passes"] + s["num_accepted_tokens"]:
            cut.add(spec.finish_reason)
    assert cut == ({"eos", "length"} if static else {"eos"})


def test_metrics_are_consistent(llm):
    res = llm.generate(PROMPTS[1], max_new_tokens=40,
                       speculative={"method": "draft_model", "num_speculative_tokens": 4})
    s = res.stats
    assert len(s["accepted_per_position"]) == 4
    assert sum(s["accepted_per_position"]) == s["num_accepted_tokens"]
    # acceptance at position i requires acceptance at every earlier position
    assert s["accepted_per_position"] == sorted(s["accepted_per_position"], reverse=True)
    assert drafted_k_a_round(s, 4)
    assert s["acceptance_rate"] == pytest.approx(s["num_accepted_tokens"] / s["num_draft_tokens"])
    assert s["mean_acceptance_length"] == pytest.approx(
        1 + s["num_accepted_tokens"] / s["num_drafts"])
    # every target pass commits accepted + 1 tokens (the budget may cut the last round)
    assert s["new_tokens"] <= s["target_passes"] + s["num_accepted_tokens"]
    assert s["new_tokens"] > s["target_passes"]
    for key in ("draft_seconds", "verify_seconds", "other_seconds", "prefill_seconds"):
        assert s[key] >= 0
    assert s["draft_seconds"] + s["verify_seconds"] <= s["seconds"]


def test_same_seed_same_sampled_output(llm):
    kw = dict(max_new_tokens=30, temperature=0.9, top_k=50, top_p=0.95,
              speculative={"method": "draft_model", "num_speculative_tokens": 3})
    a = llm.generate(PROMPTS[0], seed=11, **kw).token_ids
    b = llm.generate(PROMPTS[0], seed=11, **kw).token_ids
    c = llm.generate(PROMPTS[0], seed=12, **kw).token_ids
    assert a == b
    assert a != c


@pytest.mark.parametrize("spec, pattern", [
    ({"method": "medusa"}, "draft_model, ngram, auto"),
    ({"method": "ngram", "num_speculative_tokens": 0}, "num_speculative_tokens"),
    ({"method": "ngram", "num_speculative_tokens": 17}, "num_speculative_tokens"),
    ({"method": "ngram", "num_speculative_tokens": "4"}, "num_speculative_tokens"),
    ({"method": "ngram", "speculative_tokens": 4}, "allowed: method, model"),
    ({"method": "ngram", "prompt_lookup_min": 3, "prompt_lookup_max": 2}, "prompt_lookup_min"),
    ("{not json", "not valid JSON"),
])
def test_bad_speculative_config(llm, spec, pattern):
    with pytest.raises(SpecrtError, match=pattern):
        llm.generate([1, 2, 3], max_new_tokens=4, speculative=spec)


@pytest.mark.parametrize("word", ["none", "None", "off"])
def test_the_clis_word_for_plain_decoding_means_plain_decoding_in_the_api_too(llm, word):
    """`--speculative-config none` is plain decoding in both CLIs; the same string passed as
    `speculative=` was "not valid JSON"."""
    res = llm.generate([1, 2, 3], max_new_tokens=8, speculative=word)
    assert res.token_ids == llm.generate([1, 2, 3], max_new_tokens=8).token_ids
    assert res.stats["num_draft_tokens"] == 0 and set(res.stats["plan_histogram"]) == {"plain"}


def test_draft_model_method_without_draft(tiny_noeos_dir):
    llm = specrt.LLM(tiny_noeos_dir, max_seq_len=64, dtype="float32")
    with pytest.raises(SpecrtError, match="needs a draft model"):
        llm.generate([1, 2], max_new_tokens=4, speculative={"method": "draft_model"})


def test_draft_from_speculative_config_model_key(tiny_noeos_dir, tiny_draft_dir, plain):
    llm = specrt.LLM(tiny_noeos_dir, max_seq_len=256, dtype="float32")
    res = llm.generate(PROMPTS[0], max_new_tokens=40,
                       speculative={"method": "draft_model", "model": str(tiny_draft_dir),
                                    "num_speculative_tokens": 3})
    assert res.token_ids == plain[tuple(PROMPTS[0])]
    assert res.stats["num_drafts"] > 0


def test_two_threads_naming_one_new_draft_get_one_engine(tiny_noeos_dir, tiny_draft_dir,
                                                         monkeypatch):
    import threading
    import time

    from specrt.api import llm as llm_module
    from specrt.spec.config import SpecConfig

    llm = specrt.LLM(tiny_noeos_dir, max_seq_len=256, dtype="float32")
    real = llm_module.Scheduler
    built = []

    def slow_scheduler(*args, **kwargs):       # widens the window between check and insert
        time.sleep(0.2)
        built.append(real(*args, **kwargs))
        return built[-1]

    monkeypatch.setattr(llm_module, "Scheduler", slow_scheduler)
    spec = SpecConfig.parse({"method": "draft_model", "model": str(tiny_draft_dir)})
    got = []
    threads = [threading.Thread(target=lambda: got.append(llm._scheduler_for(spec)))
               for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    try:
        assert len(built) == 1 and got == [built[0], built[0]]
    finally:
        llm.close()
        for s in built:
            s.close()


def test_mismatched_draft_vocabulary_is_refused(tiny_noeos_dir, tmp_path):
    from tests.tiny import make_model

    other = make_model(tmp_path / "other", "qwen2", eos=False,
                       corpus=["zebra quartz jukebox " * 3, "xylophone wizard " * 5])
    with pytest.raises(SpecrtError, match="different vocabularies"):
        specrt.LLM(tiny_noeos_dir, draft=other, dtype="float32")


def test_a_draft_naming_another_special_token_eos_is_allowed(tiny_noeos_dir, tiny_draft_dir,
                                                              tmp_path):
    """A base model's eos_token is <|endoftext|>, its instruct model's <|im_end|>: same ids,
    same vocabulary, yet the draft was refused for "different special tokens". The target
    alone ends an answer; only the ids of the special tokens must agree."""
    import json
    import shutil

    draft = tmp_path / "base_draft"
    shutil.copytree(tiny_draft_dir, draft)
    config = json.loads((draft / "tokenizer_config.json").read_text())
    assert config["eos_token"] == "<|im_end|>"
    config["eos_token"] = "<|endoftext|>"
    (draft / "tokenizer_config.json").write_text(json.dumps(config))
    llm = specrt.LLM(tiny_noeos_dir, draft=draft, dtype="float32", max_seq_len=64)
    try:
        spec = {"method": "draft_model", "num_speculative_tokens": 3}
        res = llm.generate([5, 6, 7], max_new_tokens=8, speculative=spec)
        assert res.token_ids == llm.generate([5, 6, 7], max_new_tokens=8).token_ids
    finally:
        llm.close()


def test_draft_with_padded_embedding_is_allowed(tiny_noeos_dir, tmp_path, plain):
    """Checkpoints pad embeddings differently; only the tokenizer has to agree."""
    from tests.tiny import make_model, save_tokenizer

    padded = make_model(tmp_path / "padded", "qwen2", vocab_size=384, eos=False,
                        tokenizer=False)
    save_tokenizer(padded, 320)
    llm = specrt.LLM(tiny_noeos_dir, draft=padded, max_seq_len=256, dtype="float32")
    res = llm.generate(PROMPTS[0], max_new_tokens=40,
                       speculative={"method": "draft_model", "num_speculative_tokens": 2})
    assert res.token_ids == plain[tuple(PROMPTS[0])]


@pytest.mark.parametrize("method", ["ngram", "auto"])
def test_a_speculative_request_joining_plain_ones_in_lower_slots(tiny_noeos_dir, method):
    """Plain requests fill the slots with no planner attached; one ends, and a request whose
    planner looks up n-grams takes its (lower) slot while a plain one runs above it: every row
    of the batch needs the drafter's state, not only the new request's."""
    from specrt.engine.engine import Engine
    from specrt.engine.request import Request
    from specrt.model.transformer import Transformer
    from specrt.spec.config import SpecConfig

    target = Transformer.from_dir(tiny_noeos_dir, "float32", "cpu", 256)
    spec = SpecConfig(method=method, num_speculative_tokens=3)
    requests = [Request((5, 6, 7, 5, 6, 7, 5, 6), 2), Request((9, 9, 9, 9), 40),
                Request((5, 6, 7, 5, 6, 7, 5, 6, 7, 5, 6), 12, spec=spec)]

    def outputs(engine, reqs):
        out = {r.request_id: [] for r in reqs}
        for steps in engine.run(reqs):
            for s in steps:
                assert s.error is None, s.error
                out[s.request_id] += s.new_tokens
        return [out[r.request_id] for r in reqs]

    together = outputs(Engine(target, None, 2, 256), requests)
    alone = [outputs(Engine(target, None, 1, 256), [r])[0] for r in requests]
    assert together == alone
    assert [len(t) for t in together] == [2, 40, 12]


def test_a_draft_with_fewer_ids_than_its_target_reads_past_them(tmp_path, tiny_noeos_dir,
                                                                tiny_draft_dir):
    """Checkpoints pad their vocabularies differently (Qwen2.5-7B: 152,064 ids, the 0.5B
    draft: 151,936). A target id past the draft's vocabulary, in the prompt or chosen by the
    target, used to crash the draft's embedding lookup and end the whole batch; the draft now
    reads a placeholder there and the output stays the target's."""
    import shutil

    from tests.tiny import make_model

    big = make_model(tmp_path / "big", "qwen2", seed=0, eos=False, vocab_size=336,
                     tokenizer=False)
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (tiny_noeos_dir / f).exists():
            shutil.copy(tiny_noeos_dir / f, big / f)
    llm = specrt.LLM(big, draft=tiny_draft_dir, max_seq_len=128, max_batch_size=2,
                     dtype="float32")
    try:
        prompts = [[330, 5, 6], [200, 218, 23, 135]]           # 330: past the draft's 320 ids
        plain = [llm.generate(p, max_new_tokens=12).token_ids for p in prompts]
        assert any(t >= 320 for t in plain[1])                 # the target writes such ids too
        for method in ("draft_model", "auto"):
            spec = {"method": method, "num_speculative_tokens": 3}
            got = llm.generate(prompts, max_new_tokens=12, speculative=spec)
            assert [r.token_ids for r in got] == plain, method
    finally:
        llm.close()
