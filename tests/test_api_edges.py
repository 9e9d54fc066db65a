"""The API's edges a service meets: use after close, a batch whose reader fails, waiting on the
scheduler's own thread, a draft model named per request under asyncio, and stats that depend on
neither the batch nor a stop string."""
import asyncio
import contextlib
import threading
import time

import pytest

import specrt
from specrt.errors import ClosedError, SpecrtError

NGRAM = {"method": "ngram", "num_speculative_tokens": 3}


def _scheduler_threads() -> int:
    return sum(t.name == "specrt-scheduler" and t.is_alive() for t in threading.enumerate())


def test_a_closed_llm_builds_no_engine_for_a_newly_named_draft(tiny_noeos_dir, tiny_draft_dir):
    llm = specrt.LLM(tiny_noeos_dir, max_seq_len=64, dtype="float32")
    llm.generate([5, 6, 7], max_new_tokens=2)
    before = _scheduler_threads()
    llm.close()
    named = {"method": "draft_model", "model": str(tiny_draft_dir), "num_speculative_tokens": 2}
    for speculative in (None, named):
        with pytest.raises(ClosedError, match="was closed"):
            llm.generate([5, 6, 7], max_new_tokens=2, speculative=speculative)
    # a server shutting down (the LLM closed after --shutdown-timeout) answers 503, not 400
    from specrt.serve.errors import as_api_error
    err = as_api_error(ClosedError("this LLM was closed; create a new one"))
    assert (err.status, err.code) == (503, "shutting_down")
    assert len(llm._schedulers) == 1                # the default engine only
    assert _scheduler_threads() <= before - 1      # the default's thread ended, none started


def test_a_batch_whose_first_request_fails_cancels_the_rest(tiny_noeos_dir, monkeypatch):
    """Sync generate of a batch: when reading one run raises (here its prefill failed), the
    runs nobody will read are cancelled, not left to generate into the void ahead of later
    callers."""
    import specrt.engine.engine as engine_module
    llm = specrt.LLM(tiny_noeos_dir, max_seq_len=1024, max_batch_size=1, dtype="float32")
    real, calls = engine_module.prefill_rows, []

    def first_fails(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("injected prefill failure")
        return real(*args, **kwargs)

    monkeypatch.setattr(engine_module, "prefill_rows", first_fails)
    try:
        with pytest.raises(RuntimeError, match="injected prefill failure"):
            llm.generate([[5, 6, 7], [8, 9, 10], [11, 12, 13]], max_new_tokens=600)
        deadline = time.monotonic() + 10
        while (llm.scheduler.pending or any(llm.engine.slots)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert llm.scheduler.pending == 0 and not any(llm.engine.slots)
        assert len(calls) <= 2            # at most the second request started before its cancel
    finally:
        llm.close()


def test_waiting_for_a_request_on_the_schedulers_thread_is_an_error_not_a_hang(tiny_noeos_dir):
    llm = specrt.LLM(tiny_noeos_dir, max_seq_len=64, dtype="float32")
    try:
        with pytest.raises(SpecrtError, match="scheduler's own thread"):
            llm.scheduler.call(lambda: llm.generate([5, 6, 7], max_new_tokens=3))
        run = llm.submit([5, 6, 7], max_new_tokens=50)               # submitted elsewhere,
        with pytest.raises(SpecrtError, match="scheduler's own thread"):   # awaited there
            llm.scheduler.call(lambda: run.handle.next_step(timeout=5))
        run.handle.cancel()
        assert llm.generate([5, 6, 7], max_new_tokens=3).token_ids    # the LLM still serves
    finally:
        llm.close()


def test_async_requests_naming_a_new_draft_load_it_off_the_event_loop(tiny_noeos_dir,
                                                                      tiny_draft_dir,
                                                                      monkeypatch):
    from specrt.api import llm as llm_module
    real = llm_module.LLM._load_draft

    def slow_load(self, *args, **kwargs):     # stands in for a real draft's seconds of loading
        time.sleep(2.0)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(llm_module.LLM, "_load_draft", slow_load)
    allm = specrt.AsyncLLM(tiny_noeos_dir, max_seq_len=64, dtype="float32")
    named = {"method": "draft_model", "model": str(tiny_draft_dir), "num_speculative_tokens": 2}

    async def main():
        gaps, done = [], asyncio.Event()

        async def ticker():
            last = time.perf_counter()
            while not done.is_set():
                await asyncio.sleep(0.01)
                now = time.perf_counter()
                gaps.append(now - last)
                last = now

        tick = asyncio.create_task(ticker())
        await asyncio.sleep(0.05)
        res = await allm.generate([5, 6, 7], max_new_tokens=4, speculative=named)
        done.set()
        await tick
        return res, max(gaps)

    try:
        res, stall = asyncio.run(main())
        assert len(res.token_ids) == 4
        # a load on the loop would stall it >= 2 s; the bound leaves room for a busy machine
        assert stall < 1.5, f"the event loop stalled {stall:.2f} s while the draft loaded"
    finally:
        allm.close()


def test_a_requests_plan_histogram_does_not_depend_on_its_batch(tiny_noeos_dir):
    """A round in which a speculating row got no drafts is a plain step for that row, whatever
    plan the batch ran (it was labelled with the batch's plan beside a row that drafted)."""
    llm = specrt.LLM(tiny_noeos_dir, max_seq_len=256, max_batch_size=2, dtype="float32")
    try:
        sparse = [5, 6, 7, 8]                       # few repeats: often nothing to look up
        repetitive = [9, 10, 11] * 3                # the n-gram drafter drafts every round
        alone = llm.generate(sparse, max_new_tokens=40, speculative=NGRAM)
        both = llm.generate([sparse, repetitive], max_new_tokens=40, speculative=NGRAM)
        assert both[0].token_ids == alone.token_ids
        assert alone.stats["plan_histogram"].get("plain", 0) > 0    # the case is exercised
        for key in ("plan_histogram", "num_drafts", "num_draft_tokens", "target_passes"):
            assert both[0].stats[key] == alone.stats[key], key
    finally:
        llm.close()


def test_a_stop_string_cuts_the_rates_with_the_token_count(tiny_noeos_dir):
    llm = specrt.LLM(tiny_noeos_dir, max_seq_len=256, dtype="float32")
    try:
        full = llm.generate("The quick brown", max_new_tokens=40, chat=False)
        stop = full.text[len(full.text) // 3: len(full.text) // 3 + 3]
        res = llm.generate("The quick brown", max_new_tokens=40, chat=False, stop=stop)
        s = res.stats
        assert res.finish_reason == "stop" and s["new_tokens"] == len(res.token_ids)
        assert s["new_tokens"] < len(full.token_ids)
        assert s["tokens_per_target_pass"] == s["new_tokens"] / s["target_passes"]
        assert s["tokens_per_second"] == pytest.approx(s["new_tokens"] / s["seconds"])
    finally:
        llm.close()


def test_finished_requests_leave_no_history_and_configs_no_unbounded_planners(tiny_noeos_dir):
    """A server's clients may send a different speculative config with every request: an
    engine keeps MAX_PLANNERS planners at most, and a finished request's n-gram history is
    dropped from its planner's drafters at once (each config kept every slot's history before,
    ~4 MiB per 8k tokens with long lookups), with every output still the plain one."""
    from specrt.engine.engine import MAX_PLANNERS
    from specrt.spec.config import SpecConfig

    llm = specrt.LLM(tiny_noeos_dir, max_seq_len=256, max_batch_size=2, dtype="float32")
    try:
        prompt = [9, 10, 11] * 5
        plain = llm.generate(prompt, max_new_tokens=20).token_ids
        for k in range(1, MAX_PLANNERS + 5):
            spec = {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": 4}
            assert llm.generate(prompt, max_new_tokens=20, speculative=spec).token_ids == plain
            planner = llm.engine._planners[SpecConfig.parse(spec)]
            assert all(len(index) == 0 for d in planner.drafters for index in d.indexes)
        assert len(llm.engine._planners) == MAX_PLANNERS
    finally:
        llm.close()


@pytest.mark.parametrize("error, logged", [(SpecrtError("bad request"), False),
                                           (RuntimeError("a bug"), True)])
def test_a_failed_round_logs_a_traceback_only_for_a_bug(tiny_noeos_dir, monkeypatch, caplog,
                                                       error, logged):
    """A SpecrtError reaches its caller, who reports it in one line (the CLI: `error: ...`);
    logging its traceback too printed 8 lines above that one. Anything else is a bug: logged."""
    llm = specrt.LLM(tiny_noeos_dir, dtype="float32", max_seq_len=64)
    try:
        def fail():
            raise error

        monkeypatch.setattr(llm.engine, "step", fail)
        with caplog.at_level("DEBUG", logger="specrt.scheduler"):
            with pytest.raises(type(error)):
                llm.generate([5, 6], max_new_tokens=2)
        errors = [r for r in caplog.records if r.levelname == "ERROR"]
        assert bool(errors) == logged and all(r.exc_info for r in errors), caplog.text
    finally:
        monkeypatch.undo()
        llm.close()


def test_async_llm_wrapping_an_llm_takes_no_other_arguments(tiny_noeos_dir):
    """AsyncLLM(llm=llm, max_batch_size=8) kept batch 1 silently; llm="x" failed later with an
    AttributeError."""
    from specrt.errors import ArgumentError

    llm = specrt.LLM(tiny_noeos_dir, dtype="float32", max_seq_len=64)
    try:
        with pytest.raises(ArgumentError, match=r"other arguments \(max_batch_size\)"):
            specrt.AsyncLLM(llm=llm, max_batch_size=8)
        with pytest.raises(ArgumentError, match="llm must be an LLM, got str"):
            specrt.AsyncLLM(llm="x")
        assert specrt.AsyncLLM(llm=llm).llm is llm
    finally:
        llm.close()


def test_a_submitted_runs_result_waits_for_its_end(tiny_noeos_dir):
    """result() before (or after part of) the chunks returned finish_reason 'cancelled' with
    the tokens read so far, while the request went on running."""
    llm = specrt.LLM(tiny_noeos_dir, dtype="float32", max_seq_len=128)
    try:
        whole = llm.generate([5, 6, 7], max_new_tokens=20)
        res = llm.submit([5, 6, 7], max_new_tokens=20).result()
        assert (res.token_ids, res.finish_reason) == (whole.token_ids, "length")
        run = llm.submit([5, 6, 7], max_new_tokens=20)
        next(iter(run.chunks()))            # read one chunk, then drop the iterator
        # dropping it cancels the request, unless it ended first (a race): either way result()
        # reports what really ran -- all of it, or a prefix of it, cancelled
        res = run.result()
        if res.finish_reason == "length":
            assert res.token_ids == whole.token_ids
        else:
            assert res.finish_reason == "cancelled", res.finish_reason
            assert res.token_ids == whole.token_ids[:len(res.token_ids)]
    finally:
        llm.close()


def test_async_close_keeps_the_event_loop_serving_while_the_round_in_progress_ends(
        tiny_noeos_dir, monkeypatch):
    """AsyncLLM.close() joined the scheduler on the event loop, freezing every other coroutine
    until the round in progress ended. Here the round can only end once another coroutine on
    the same loop runs: with a blocking close it never would (a watchdog thread ends it after
    10 s and the test fails); `aclose()` waits on a worker thread."""
    from specrt.engine.engine import Engine
    real_step = Engine.step
    in_round, release, watchdog_fired = threading.Event(), threading.Event(), []

    def held_step(self):
        in_round.set()
        if not release.wait(10):
            watchdog_fired.append(True)
        return real_step(self)

    monkeypatch.setattr(Engine, "step", held_step)

    async def main():
        async with specrt.AsyncLLM(tiny_noeos_dir, max_seq_len=64, dtype="float32") as allm:
            task = asyncio.create_task(allm.generate([5, 6, 7], max_new_tokens=8))
            await asyncio.to_thread(in_round.wait, 10)
            assert in_round.is_set()

            async def let_the_round_end():
                await asyncio.sleep(0.05)       # runs only while the loop is free
                release.set()

            releaser = asyncio.create_task(let_the_round_end())
            await allm.aclose()
            await releaser
            res = await task
            return res

    res = asyncio.run(main())
    assert not watchdog_fired, "the event loop was blocked while the scheduler closed"
    assert res.finish_reason == "cancelled"


def test_async_requests_are_encoded_off_the_event_loop(tiny_noeos_dir, monkeypatch):
    """AsyncLLM encoded the prompt on the event loop: a 2 MB prompt (2.35 s to tokenize)
    froze every other coroutine. Here encoding can only finish once another coroutine on the
    loop runs: encoded on the loop it would wait for a watchdog (10 s) and the test fails.
    A request cancelled while it is encoded is never queued."""
    from specrt.api.llm import LLM
    real_encode = LLM.encode
    in_encode, release, watchdog_fired = threading.Event(), threading.Event(), []

    def held_encode(self, *args, **kwargs):
        if args and args[0] == "held":
            in_encode.set()
            if not release.wait(10):
                watchdog_fired.append(True)
        return real_encode(self, *args, **kwargs)

    monkeypatch.setattr(LLM, "encode", held_encode)
    real_start, started = LLM._start, []

    def recorded_start(self, prepared):
        started.append(prepared.request.max_new_tokens)
        return real_start(self, prepared)

    monkeypatch.setattr(LLM, "_start", recorded_start)

    async def main():
        async with specrt.AsyncLLM(tiny_noeos_dir, max_seq_len=64, dtype="float32") as allm:
            async def let_encoding_end():
                await asyncio.to_thread(in_encode.wait, 10)
                release.set()                  # runs only while the loop is free

            releaser = asyncio.create_task(let_encoding_end())
            res = await allm.generate("held", max_new_tokens=4, chat=False)
            await releaser

            in_encode.clear()
            release.clear()
            task = asyncio.create_task(allm.generate("held", max_new_tokens=60, chat=False))
            await asyncio.to_thread(in_encode.wait, 10)
            task.cancel()                      # while the prompt is being encoded
            with pytest.raises(asyncio.CancelledError):
                await task
            release.set()
            after = await asyncio.wait_for(allm.generate([5, 6, 7], max_new_tokens=4), 60)
            return res, after

    res, after = asyncio.run(main())
    assert not watchdog_fired, "the prompt was encoded on the event loop"
    assert len(res.token_ids) == 4 and len(after.token_ids) == 4
    assert started == [4, 4], started        # the one cancelled mid-encode never queued


@pytest.fixture(scope="module")
def shared_llm(tiny_noeos_dir, tiny_draft_dir):
    llm = specrt.LLM(tiny_noeos_dir, draft=tiny_draft_dir, max_seq_len=256, dtype="float32")
    yield llm
    llm.close()


NGRAM2 = {"method": "ngram", "num_speculative_tokens": 2}
SEEDED = dict(temperature=0.8, seed=11, speculative=NGRAM2)


def _slow_to_apply(monkeypatch):
    """Make a reader that took an even step wait 30 ms before applying it: without the run's
    lock, another reader takes the next (odd) step in that window and applies it first."""
    from specrt.engine.handle import RequestHandle
    real_next_step = RequestHandle.next_step

    def next_step(self, timeout=None):
        step = real_next_step(self, timeout)
        if step is not None and step.index % 2 == 0:
            time.sleep(0.03)
        return step

    monkeypatch.setattr(RequestHandle, "next_step", next_step)


def test_two_threads_reading_one_run_get_its_tokens_in_order(shared_llm, monkeypatch):
    """run.result() from two threads at once: each took steps and applied them to the run's
    tokens unlocked, so a step taken second could land first (tokens swapped, one lost).
    Each step is now taken and applied under the run's lock."""
    solo = shared_llm.generate([5, 6, 7], max_new_tokens=40, **SEEDED).token_ids
    _slow_to_apply(monkeypatch)
    run = shared_llm.submit([5, 6, 7], max_new_tokens=40, **SEEDED)
    results = []
    readers = [threading.Thread(target=lambda: results.append(run.result().token_ids))
               for _ in range(2)]
    for t in readers:
        t.start()
    for t in readers:
        t.join(60)
    assert results == [solo, solo]


def test_a_stream_stepped_from_two_threads_at_once(shared_llm, monkeypatch):
    """next() on one LLM.stream from two threads raised "generator already executing": the
    stream now serves them in turn, each chunk to one of them, in order."""
    solo = shared_llm.generate([5, 6, 7], max_new_tokens=40, **SEEDED).token_ids
    _slow_to_apply(monkeypatch)
    stream = shared_llm.stream([5, 6, 7], max_new_tokens=40, **SEEDED)
    got, errors = [], []

    def read():
        try:
            for chunk in stream:
                got.append((chunk.step.index, chunk.token_ids))
        except Exception as e:             # noqa: BLE001 - the test reports any
            errors.append(e)

    readers = [threading.Thread(target=read) for _ in range(2)]
    for t in readers:
        t.start()
    for t in readers:
        t.join(60)
    assert errors == []
    assert [t for _, ids in sorted(got) for t in ids] == solo


def test_an_async_stream_stepped_from_two_tasks_at_once(shared_llm):
    """Two tasks iterating one AsyncLLM.stream raised "anext(): asynchronous generator is
    already running"; they are served in turn now. Another event loop gets a clear error."""
    solo = shared_llm.generate([5, 6, 7], max_new_tokens=40, **SEEDED).token_ids
    allm = specrt.AsyncLLM(llm=shared_llm)

    async def main():
        stream = allm.stream([5, 6, 7], max_new_tokens=40, **SEEDED)
        got = []

        async def read():
            async for chunk in stream:
                got.append((chunk.step.index, chunk.token_ids))
                await asyncio.sleep(0)

        await asyncio.wait_for(asyncio.gather(read(), read()), 60)
        return got, stream

    got, stream = asyncio.run(main())
    assert [t for _, ids in sorted(got) for t in ids] == solo

    async def step_again():
        await stream.__anext__()

    with pytest.raises(SpecrtError, match="event loop that first stepped it"):
        asyncio.run(step_again())


def test_a_submitted_run_dropped_unread_is_cancelled(shared_llm):
    """A run from submit() dropped without a read or a cancel held its slot until its whole
    budget was generated (a dropped stream was cancelled); now it is cancelled too."""
    import gc

    run = shared_llm.submit([5, 6, 7], max_new_tokens=200)
    handle = run.handle
    del run
    gc.collect()
    assert handle.cancelled
    steps = []
    while (step := handle.next_step(timeout=60)) is not None:
        steps.append(step)
    assert steps[-1].finish_reason == "cancelled"


def test_a_stream_is_submitted_at_its_first_step_and_closing_it_before_ends_it(shared_llm,
                                                                              monkeypatch):
    """LLM.stream submitted at the call for a while: a stream not read yet held a slot for its
    whole budget. It is submitted at the first next(), like AsyncLLM.stream's first step."""
    from specrt.api.llm import LLM
    real_submit_stream, submitted = LLM.submit_stream, []

    def counted(self, *args, **kwargs):
        submitted.append(real_submit_stream(self, *args, **kwargs))
        return submitted[-1]

    monkeypatch.setattr(LLM, "submit_stream", counted)
    stream = shared_llm.stream([5, 6, 7], max_new_tokens=4)
    assert submitted == []
    assert len(next(stream).token_ids) >= 1 and len(submitted) == 1
    unread = shared_llm.stream([5, 6, 7], max_new_tokens=4)
    unread.close()
    assert list(unread) == [] and len(submitted) == 1
    with pytest.raises(SpecrtError, match="max_new_tokens"):
        next(shared_llm.stream([5, 6, 7], max_new_tokens=0))


def test_an_async_stream_closed_while_its_request_is_submitted_is_cancelled(shared_llm,
                                                                           monkeypatch):
    """aclose() while the first step was still submitting (a long prompt's encoding) left the
    request running unread until its whole budget was generated."""
    from specrt.api.llm import LLM
    real_submit_stream, submitted = LLM.submit_stream, []

    def slow(self, *args, **kwargs):
        time.sleep(0.5)
        submitted.append(real_submit_stream(self, *args, **kwargs))
        return submitted[-1]

    monkeypatch.setattr(LLM, "submit_stream", slow)
    allm = specrt.AsyncLLM(llm=shared_llm)

    async def main():
        stream = allm.stream([5, 6, 7], max_new_tokens=200)
        first = asyncio.create_task(stream.__anext__())
        await asyncio.sleep(0.1)                     # the submit is under way
        await stream.aclose()
        with pytest.raises(StopAsyncIteration):
            await asyncio.wait_for(first, 30)

    asyncio.run(main())
    (run,) = submitted
    assert run.handle.cancelled
    assert run.result().finish_reason == "cancelled"


@contextlib.contextmanager
def _scheduler_held(llm):
    """The scheduler's thread kept busy in a call (no admission, no round) for the block."""
    hold, held = threading.Event(), threading.Event()

    def block():
        held.set()
        hold.wait(30)

    blocker = threading.Thread(target=llm.scheduler.call, args=(block,))
    blocker.start()
    try:
        assert held.wait(30)
        yield
    finally:
        hold.set()
        blocker.join(30)


def test_a_burst_free_slots_will_take_is_not_refused_as_a_full_queue(tiny_noeos_dir):
    """max_queue counts requests waiting for a slot: requests submitted before the scheduler
    admits them, which free slots take at its next admission, do not fill the queue (a burst
    on an idle server got 503 queue_full); one more than slots + queue is refused."""
    from specrt.errors import QueueFullError

    llm = specrt.LLM(tiny_noeos_dir, max_seq_len=256, max_batch_size=3, max_queue=1,
                     dtype="float32")
    with _scheduler_held(llm):                    # nothing is admitted meanwhile
        runs = [llm.submit([5, 6, 7], max_new_tokens=2) for _ in range(4)]   # 3 slots + 1
        with pytest.raises(QueueFullError, match="--max-queue"):
            llm.submit([5, 6, 7], max_new_tokens=2)
    assert [r.result().finish_reason for r in runs] == ["length"] * 4
    llm.close()


def test_a_batch_larger_than_the_queue_waits_for_room_and_equals_its_single_runs(
        tiny_noeos_dir, monkeypatch):
    """generate([...]) of more prompts than slots + max_queue was refused at once with
    QueueFullError "retry later" on an idle LLM, though retrying could never pass. A batch
    now feeds the queue as its own requests end, sync and async, each result that of its
    single run; a bad prompt anywhere in it runs none of it."""
    from specrt.api.llm import LLM
    from specrt.errors import QueueFullError

    llm = specrt.LLM(tiny_noeos_dir, max_seq_len=64, max_batch_size=1, max_queue=2,
                     dtype="float32")
    try:
        prompts = [[5 + i, 6, 7] for i in range(7)]
        single = [llm.generate(p, max_new_tokens=3).token_ids for p in prompts]
        assert [r.token_ids for r in llm.generate(prompts, max_new_tokens=3)] == single
        sampled = [llm.generate(p, max_new_tokens=3, temperature=0.8, seed=1).token_ids
                   for p in prompts]
        assert [r.token_ids for r in llm.generate(prompts, max_new_tokens=3, temperature=0.8,
                                                  seed=1)] == sampled

        async def batch():
            async with specrt.AsyncLLM(llm=llm) as allm:     # closes llm at the end
                return await asyncio.wait_for(allm.generate(prompts, max_new_tokens=3), 120)

        assert [r.token_ids for r in asyncio.run(batch())] == single
        llm = specrt.LLM(tiny_noeos_dir, max_seq_len=64, max_batch_size=1, max_queue=2,
                         dtype="float32")
        real_start, started = LLM._start, []
        monkeypatch.setattr(LLM, "_start", lambda self, prepared: started.append(prepared)
                            or real_start(self, prepared))
        with pytest.raises(SpecrtError, match="vocabulary"):
            llm.generate(prompts + [[10**6]], max_new_tokens=3)
        assert started == []
        with _scheduler_held(llm):            # the queue full of other callers' requests
            others = [llm.submit([5, 6], max_new_tokens=2) for _ in range(3)]   # 1 slot + 2
            with pytest.raises(QueueFullError):
                llm.generate(prompts, max_new_tokens=3)
        assert [r.result().finish_reason for r in others] == ["length"] * 3
    finally:
        llm.close()


def test_unknown_keywords_of_llm_submit_and_asyncllm_get_a_did_you_mean(tiny_noeos_dir):
    """A misspelt keyword gets an ArgumentError naming the nearest one, as generate's do, not
    Python's TypeError; submit() given a batch says so."""
    from specrt.errors import ArgumentError

    with pytest.raises(ArgumentError, match="did you mean 'max_seq_len'"):
        specrt.LLM(tiny_noeos_dir, max_seqlen=64)
    with pytest.raises(ArgumentError, match="unknown argument 'bogus'"):
        specrt.AsyncLLM(tiny_noeos_dir, bogus=1)
    llm = specrt.LLM(tiny_noeos_dir, max_seq_len=64, dtype="float32")
    try:
        with pytest.raises(ArgumentError, match="did you mean 'max_new_tokens'"):
            llm.submit([5, 6], max_tokens=3)
        with pytest.raises(SpecrtError, match="a batch of 2: generate"):
            llm.submit([[5], [6]])
        assert llm.submit([5, 6], max_new_tokens=2).result().finish_reason == "length"
    finally:
        llm.close()


def test_options_given_by_position_get_an_argument_error_saying_pass_them_by_name(
        tiny_noeos_dir):
    """generate/stream/submit take the prompt by position and the rest by name: llm.generate(
    "a", 3) got Python's TypeError ("takes from 1 to 2 positional arguments"); now one
    ArgumentError that says how to pass it, and the engine serves on."""
    import asyncio

    from specrt.errors import ArgumentError

    llm = specrt.LLM(tiny_noeos_dir, max_seq_len=64, dtype="float32")
    try:
        for call in (lambda: llm.generate([5, 6], 3), lambda: llm.stream([5, 6], 3),
                     lambda: llm.submit([5, 6], 3)):
            with pytest.raises(ArgumentError, match=r"got 2; pass the others by name, e\.g\. "
                                                    r"\S+\(prompt, max_new_tokens=\.\.\.\)"):
                call()
        assert llm.generate([5, 6], max_new_tokens=3).finish_reason == "length"
    finally:
        llm.close()

    async def main():
        async with specrt.AsyncLLM(tiny_noeos_dir, max_seq_len=64, dtype="float32") as allm:
            with pytest.raises(ArgumentError, match="pass the others by name"):
                await allm.generate([5, 6], 3)
            with pytest.raises(ArgumentError, match="pass the others by name"):
                allm.stream([5, 6], 3)
            return (await allm.generate([5, 6], max_new_tokens=3)).finish_reason

    assert asyncio.run(main()) == "length"


def test_numpy_numbers_are_taken_as_the_python_numbers_they_hold(tiny_noeos_dir,
                                                                 tiny_draft_dir):
    """Token ids, budgets, seeds, temperatures and K given as numpy scalars (as an array's
    elements are) run as the Python numbers do, instead of "must be an integer ..., got
    np.int64(8)" (and np.float32 refused where np.float64, a float subclass, passed)."""
    import numpy as np

    llm = specrt.LLM(tiny_noeos_dir, draft=tiny_draft_dir, max_seq_len=128, dtype="float32")
    try:
        spec = {"method": "draft_model", "num_speculative_tokens": 3}
        plain = llm.generate([5, 6, 7], max_new_tokens=8, temperature=0.5, seed=3, top_k=5,
                             speculative=spec)
        ids = np.array([5, 6, 7])
        as_numpy = llm.generate(list(ids), max_new_tokens=np.int64(8),
                                temperature=np.float32(0.5), seed=np.int64(3),
                                top_k=np.int32(5), speculative={
                                    "method": "draft_model",
                                    "num_speculative_tokens": np.int64(3)})
        assert as_numpy.token_ids == plain.token_ids
        as_array = llm.generate(ids, max_new_tokens=8, temperature=0.5, seed=3, top_k=5,
                                speculative=spec)          # the ids as one array, as decode
        assert as_array.token_ids == plain.token_ids
        assert all(type(t) is int for t in llm.encode(list(ids)))    # what the engine gets
    finally:
        llm.close()


def test_free_slots_the_queue_cannot_take_do_not_make_room_in_it(tiny_noeos_dir):
    """Beside a running request of another speculative config the queue's head cannot take a
    free slot (`Engine.can_admit`), so those slots make no room in the queue: with one slot
    busy and two free, max_queue=1 holds one waiting request, not three."""
    from specrt.errors import QueueFullError

    llm = specrt.LLM(tiny_noeos_dir, max_seq_len=256, max_batch_size=3, max_queue=1,
                     dtype="float32")
    other = {"method": "ngram", "num_speculative_tokens": 2}
    long = llm.submit([5, 6, 7], max_new_tokens=200,
                      speculative={"method": "ngram", "num_speculative_tokens": 4})
    deadline = time.monotonic() + 30
    while llm.scheduler.running == 0:
        assert time.monotonic() < deadline
        time.sleep(0.001)
    with _scheduler_held(llm):                    # `long` stays running meanwhile
        waiting = llm.submit([5, 6], max_new_tokens=2, speculative=other)
        with pytest.raises(QueueFullError):
            llm.submit([5, 6], max_new_tokens=2, speculative=other)
    assert waiting.result().finish_reason == "length"
    long.handle.cancel()
    llm.close()


def test_a_max_seq_len_past_the_models_trained_positions_is_warned_of(tiny_noeos_dir, caplog):
    """Positions past max_position_embeddings run (the rotary tables are built for
    max_seq_len) but degrade what the model says; vLLM refuses them by default. A warning
    names both numbers and the setting; within them, none."""
    import json
    from pathlib import Path

    trained = json.loads((Path(tiny_noeos_dir) / "config.json").read_text())[
        "max_position_embeddings"]
    with caplog.at_level("WARNING", logger="specrt.api.llm"):
        specrt.LLM(tiny_noeos_dir, max_seq_len=trained, dtype="float32").close()
        assert not caplog.records
        specrt.LLM(tiny_noeos_dir, max_seq_len=trained + 1, dtype="float32").close()
    (said,) = [r.getMessage() for r in caplog.records]
    assert f"max_seq_len {trained + 1} is past the {trained} positions" in said
    assert f"max_seq_len={trained}" in said


def test_a_draft_path_is_taken_in_a_speculative_config_as_llm_takes_it():
    """LLM(draft=Path(...)) was accepted and speculative={"model": Path(...)} refused."""
    from pathlib import Path

    from specrt.spec.config import SpecConfig

    assert SpecConfig.parse({"model": Path("/models/draft")}).model == "/models/draft"
    assert SpecConfig.parse({"method": "auto", "prompt_lookup_max": 5}).prompt_lookup_max == 5


def test_an_llm_dropped_without_close_stops_its_engines_and_is_a_context_manager(
        tiny_noeos_dir, tiny_draft_dir):
    """Dropped without close(), an LLM lived on with its model, caches and scheduler thread
    (the thread held what built its engine, and that held the LLM), one more per LLM made;
    `with LLM(...)` was a TypeError after the load. Now the LLM and its engines' memory go,
    and their threads end, a draft engine named per request's too."""
    import gc
    import weakref

    def schedulers():
        return {t for t in threading.enumerate() if t.name == "specrt-scheduler"}

    before = schedulers()
    llm = specrt.LLM(tiny_noeos_dir, max_seq_len=64, dtype="float32")
    assert llm.generate([5, 6, 7], max_new_tokens=3,
                        speculative={"model": str(tiny_draft_dir)}).token_ids
    started = schedulers() - before
    assert len(started) == 2
    gone = weakref.ref(llm)
    engine = weakref.ref(llm.engine)
    del llm
    gc.collect()
    assert gone() is None
    deadline = time.monotonic() + 30
    while any(t.is_alive() for t in started) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(t.is_alive() for t in started)
    gc.collect()
    assert engine() is None
    with specrt.LLM(tiny_noeos_dir, max_seq_len=64, dtype="float32") as llm:
        assert llm.generate([5, 6, 7], max_new_tokens=2).token_ids
    with pytest.raises(ClosedError):
        llm.generate([5, 6, 7], max_new_tokens=2)
    # a run keeps its LLM: one held by nothing else still answers
    run = specrt.LLM(tiny_noeos_dir, max_seq_len=64, dtype="float32").submit([5, 6, 7],
                                                                             max_new_tokens=4)
    gc.collect()
    assert len(run.result().token_ids) == 4


def test_an_async_request_refused_for_its_arguments_loads_no_draft_it_names(tiny_noeos_dir,
                                                                            tiny_draft_dir):
    """AsyncLLM loaded a draft named per request before checking the rest: a refused request
    left an engine (a draft model, its caches, a thread) behind, and two such filled the
    engines a later sound request could name."""
    named = {"method": "draft_model", "model": str(tiny_draft_dir), "num_speculative_tokens": 2}

    async def main(allm):
        with pytest.raises(SpecrtError, match="max_new_tokens"):
            await allm.generate([1, 2], max_new_tokens=0, speculative=named)
        with pytest.raises(SpecrtError, match="max_tokens"):
            await allm.generate([1, 2], max_tokens=5, speculative=named)
        with pytest.raises(SpecrtError, match="max_new_tokens"):
            async for _ in allm.stream([1, 2], max_new_tokens=0, speculative=named):
                pass
        assert len(allm.llm._schedulers) == 1                 # the LLM's own engine only
        return await allm.generate([5, 6, 7], max_new_tokens=3, speculative=named)

    allm = specrt.AsyncLLM(tiny_noeos_dir, max_seq_len=64, dtype="float32")
    try:
        assert len(asyncio.run(main(allm)).token_ids) == 3
        assert len(allm.llm._schedulers) == 2
    finally:
        allm.close()


def test_an_argument_given_twice_or_unknown_is_an_argument_error_everywhere(shared_llm):
    """encode, decode and cost_model took no keyword check, and an argument given both by
    position and by name (the prompt) failed inside Python's binding: raw TypeErrors."""
    from specrt.errors import ArgumentError

    llm, ids = shared_llm, [5, 6, 7]
    allm = specrt.AsyncLLM(llm=llm)
    calls = {
        "generate twice": lambda: llm.generate(ids, prompt=ids),
        "stream twice": lambda: list(llm.stream(ids, prompt=ids)),
        "submit twice": lambda: llm.submit(ids, prompt=ids),
        "async generate twice": lambda: asyncio.run(allm.generate(ids, prompt=ids)),
        "async stream twice": lambda: allm.stream(ids, prompt=ids),
        "encode keyword": lambda: llm.encode("hi", add_special_tokens=False),
        "encode typo": lambda: llm.encode(promt="hi"),
        "encode positional": lambda: llm.encode("hi", False, None, True),
        "decode keyword": lambda: llm.decode(ids, skip_special=True),
        "decode positional": lambda: llm.decode(ids, True, 1),
        "cost_model keyword": lambda: llm.cost_model(k=4),
    }
    for name, call in calls.items():
        with pytest.raises(ArgumentError, match="both by position and by name|unknown argument"
                                                "|positional argument"):
            call()
    assert llm.decode(llm.encode("hi")) == "hi"     # the checked methods still answer


def test_a_list_of_numpy_arrays_or_tensors_is_a_batch(shared_llm):
    """A prompt may be a 1-D numpy array or tensor of ids, and a list of prompts is a batch:
    a list of them was read as one prompt ("a token-id prompt must be a list of ints")."""
    import numpy
    import torch

    llm, prompts = shared_llm, [[5, 6, 7], [8, 9]]
    solo = [llm.generate(p, max_new_tokens=3).token_ids for p in prompts]
    for batch in ([numpy.array(p) for p in prompts], [torch.tensor(p) for p in prompts]):
        assert [r.token_ids for r in llm.generate(batch, max_new_tokens=3)] == solo
    # numpy's integer scalars in a list are one prompt's ids
    one = llm.generate([numpy.int64(t) for t in prompts[0]], max_new_tokens=3)
    assert one.token_ids == solo[0]
