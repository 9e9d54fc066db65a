"""The text-level API services embed: text prompts, chat template, stop strings, streaming,
sharing one LLM between threads."""
import threading

import pytest

import specrt
from tests.helpers import slots_held_at_reserve

SPEC = {"method": "draft_model", "num_speculative_tokens": 3}


@pytest.fixture(scope="module")
def llm(tiny_noeos_dir, tiny_draft_dir):
    # draft_stop 0: every round with SPEC drafts all 3 (the tiny draft is never sure)
    return specrt.LLM(tiny_noeos_dir, draft=tiny_draft_dir, max_seq_len=256, max_batch_size=2,
                      dtype="float32", draft_stop=0.0)


def test_text_prompt_and_chat_template(llm):
    chat_ids = llm.encode("def add(a, b):", chat=True)
    assert llm.tokenizer._tok.decode(chat_ids) == (
        "<|im_start|>user\ndef add(a, b):<|im_end|>\n<|im_start|>assistant\n")
    assert llm.tokenizer.decode(llm.encode("def add(a, b):")) == "def add(a, b):"
    res = llm.generate("def add(a, b):", max_new_tokens=12, chat=True)
    assert res.token_ids == llm.generate(chat_ids, max_new_tokens=12).token_ids
    assert res.text == llm.tokenizer.decode(res.token_ids)


def test_stream_yields_the_same_text_in_multi_token_chunks(llm):
    prompt = "The quick brown fox"
    full = llm.generate(prompt, max_new_tokens=40, speculative=SPEC)
    chunks = list(llm.stream(prompt, max_new_tokens=40, speculative=SPEC))
    assert "".join(c.text for c in chunks) == full.text
    assert [t for c in chunks for t in c.token_ids] == full.token_ids
    assert chunks[-1].finish_reason == full.finish_reason and chunks[-1].stats is not None
    assert len(chunks) < 40          # rounds commit several tokens at once


def _first_text_with_a_stop_candidate(llm):
    res = llm.generate("for i in range", max_new_tokens=40)
    text = res.text
    assert len(text) > 12
    return text


@pytest.mark.parametrize("spec", [None, SPEC])
def test_stop_string_cuts_text_and_ids(llm, spec):
    text = _first_text_with_a_stop_candidate(llm)
    full = llm.generate("for i in range", max_new_tokens=40).token_ids
    stop = text[6:9]                                  # occurs in the answer; cut there
    cut = text.find(stop)
    res = llm.generate("for i in range", max_new_tokens=40, stop=[stop], speculative=spec)
    assert res.text == text[:cut]
    assert res.finish_reason == "stop"
    assert stop not in res.text
    # the ids: the unstopped answer's, up to the token that completes the stop string
    ids = res.token_ids
    assert 0 < len(ids) < len(full) and ids == full[:len(ids)]
    assert stop in llm.tokenizer.decode(ids) and stop not in llm.tokenizer.decode(ids[:-1])
    assert res.stats["new_tokens"] == len(ids)
    streamed = "".join(c.text for c in llm.stream("for i in range", max_new_tokens=40,
                                                  stop=stop, speculative=spec))
    assert streamed == text[:cut]


def test_abandoned_stream_leaves_the_next_call_clean(llm):
    ref = llm.generate("Once upon a time", max_new_tokens=30, speculative=SPEC)
    stream = llm.stream("Once upon a time", max_new_tokens=30, speculative=SPEC)
    next(stream)
    stream.close()                         # abandon mid-way
    again = llm.generate("Once upon a time", max_new_tokens=30, speculative=SPEC)
    assert again.token_ids == ref.token_ids
    stream = llm.stream("A refrigerator", max_new_tokens=30)
    next(stream)
    del stream                             # dropped without close: the lock is released too
    assert llm.generate("Once upon a time", max_new_tokens=30).token_ids == ref.token_ids


def test_threads_share_one_llm(llm):
    prompts = ["def add", "The quick", "for i in", "Once upon", "A refrigerator"]
    specs = [None, SPEC, {"method": "ngram", "num_speculative_tokens": 2}]
    expected = {(p, i): llm.generate(p, max_new_tokens=16, speculative=specs[i % 3]).token_ids
                for i, p in enumerate(prompts)}
    results, errors = {}, []

    def worker(t):
        try:
            for i, p in enumerate(prompts):
                results[(t, p, i)] = llm.generate(p, max_new_tokens=16,
                                                  speculative=specs[i % 3]).token_ids
        except Exception as e:  # surfaced below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(t,), daemon=True) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
        assert not th.is_alive(), "a thread hung: its requests never finished"
    assert not errors
    assert len(results) == 20
    for (t, p, i), ids in results.items():
        assert ids == expected[(p, i)]


def test_batch_of_text_prompts_returns_list(llm):
    res = llm.generate(["def add", "The quick"], max_new_tokens=8)
    assert isinstance(res, list) and len(res) == 2
    assert res[1].token_ids == llm.generate("The quick", max_new_tokens=8).token_ids


def test_request_joining_a_running_batch_gives_its_solo_tokens(llm):
    """Continuous batching: a request admitted while another is mid-generation joins at a
    round boundary and gives exactly the tokens it gives alone (and so does the other)."""
    solo_a = llm.generate("Once upon a time", max_new_tokens=200, speculative=SPEC).token_ids
    solo_b = llm.generate("def add", max_new_tokens=20).token_ids
    with slots_held_at_reserve(llm.engine) as busy_at_reserve:
        stream = llm.stream("Once upon a time", max_new_tokens=200, speculative=SPEC)
        got_a = list(next(stream).token_ids)       # a is running (200 tokens): b joins it
        got_b = llm.generate("def add", max_new_tokens=20).token_ids
        got_a += [t for chunk in stream for t in chunk.token_ids]
    assert busy_at_reserve == [0, 1], "b did not join a running batch"
    assert got_a == solo_a and got_b == solo_b


def test_chat_template_options_continue_a_prefilled_reply(llm):
    """continue_final_message leaves the assistant's last message open (vLLM's prefill), and
    add_generation_prompt=False ends after the last turn; the answer continues those ids."""
    tok = llm.tokenizer._tok
    turns = [{"role": "user", "content": "def add(a, b):"},
             {"role": "assistant", "content": "return a"}]
    ids = llm.encode(messages=turns, add_generation_prompt=False, continue_final_message=True)
    assert tok.decode(ids) == ("<|im_start|>user\ndef add(a, b):<|im_end|>\n"
                               "<|im_start|>assistant\nreturn a")
    closed = llm.encode(messages=turns[:1], add_generation_prompt=False)
    assert tok.decode(closed) == "<|im_start|>user\ndef add(a, b):<|im_end|>\n"
    assert llm.generate(messages=turns[:1], max_new_tokens=6).token_ids == \
        llm.generate(llm.encode(messages=turns[:1]), max_new_tokens=6).token_ids
    with pytest.raises(specrt.SpecrtError, match="turn add_generation_prompt off"):
        llm.encode(messages=turns, continue_final_message=True)
    # any last message may be continued, as in vLLM and transformers
    assert tok.decode(llm.encode(messages=turns[:1], add_generation_prompt=False,
                                 continue_final_message=True)) == \
        "<|im_start|>user\ndef add(a, b):"
    with pytest.raises(specrt.SpecrtError, match="apply to chat messages"):
        llm.encode("hi", continue_final_message=True)
    with pytest.raises(specrt.SpecrtError, match="must be True or False"):
        llm.encode("hi", add_generation_prompt="yes")
    for name in ("tokenize", "self", "conversations", "messages"):
        with pytest.raises(specrt.SpecrtError, match=f"may not set '{name}'"):
            llm.encode(messages=turns[:1], chat_template_kwargs={name: True})
    with pytest.raises(specrt.SpecrtError, match="must be an object"):
        llm.encode(messages=turns[:1], chat_template_kwargs=["x"])


def test_chat_flag_that_cannot_apply_is_refused_not_ignored(llm):
    """chat=True on token ids, or chat=False with messages, asked for something that would not
    happen: each is an error naming why."""
    ids = llm.encode("def add(a, b):")
    with pytest.raises(specrt.SpecrtError, match="chat=True .* token ids"):
        llm.generate(ids, max_new_tokens=2, chat=True)
    with pytest.raises(specrt.SpecrtError, match="chat=False sends raw text"):
        llm.generate(messages=[{"role": "user", "content": "hi"}], max_new_tokens=2, chat=False)
    assert llm.generate(ids, max_new_tokens=2, chat=False).token_ids    # no-op: still fine


def test_decode_keeps_special_tokens_unless_told_and_checks_ids(llm):
    ids = llm.encode(messages=[{"role": "user", "content": "hi"}])
    assert llm.decode(ids) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert llm.decode(ids, skip_special_tokens=True) == "user\nhi\nassistant\n"
    import numpy
    import torch

    assert llm.decode(numpy.array(ids)) == llm.decode(torch.tensor(ids)) == llm.decode(ids)
    for bad, match in [([0, 10**6], "outside the model's vocabulary"), ([-1], "outside"),
                       ("12", "list of token ids"), ([1.0], "list of token ids")]:
        with pytest.raises(specrt.SpecrtError, match=match):
            llm.decode(bad)
