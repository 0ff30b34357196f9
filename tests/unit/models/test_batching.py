"""Continuous batching (``ragserve.models.batching``) on a tiny randomly initialised Gemma 3: real
transformers code, sliding-window layers included, nothing downloaded.

The reference for every sequence is its run alone, on the path the engine used before batching
(``model.generate``, greedy, one request at a time): a sequence served in a batch, whatever joined
or left it meanwhile, must produce exactly those tokens.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from ragserve.models import batching
from ragserve.models.batching import Batch, BatchLoop, LoopClosed, Reader, Sequence
from tests.unit.models.stand_ins import TINY_WINDOW, Breakable, tiny_gemma

WAIT_S = 60  # a liveness bound, never a speed one: a sequence that does not end in this long hangs


@pytest.fixture(scope="module")
def model() -> Any:
    return tiny_gemma()


def alone(model: Any, prompt: list[int], max_new: int, eos: tuple[int, ...] = ()) -> list[int]:
    """The tokens ``generate`` decodes greedily for ``prompt`` on its own."""
    ids = torch.tensor([prompt])
    with torch.inference_mode():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_new,
            do_sample=False,
            eos_token_id=list(eos) or None,
            pad_token_id=0,
        )
    return out[0, len(prompt) :].tolist()


def prompt_of(length: int, salt: int = 0) -> list[int]:
    return [1] + [10 + (i * 7 + salt * 13) % 120 for i in range(length - 1)]


class Recorder:
    """A sink that keeps the tokens and how the sequence ended; ``on_token(recorder, count)`` runs
    on the loop's thread after each token (to submit or cancel at a known step)."""

    def __init__(self, on_token: Callable[[Recorder, int], None] | None = None):
        self.tokens: list[int] = []
        self.error: BaseException | None = None
        self.ended = threading.Event()
        self.on_token = on_token

    def token(self, token_id: int) -> None:
        self.tokens.append(token_id)
        if self.on_token is not None:
            self.on_token(self, len(self.tokens))

    def end(self, error: BaseException | None) -> None:
        assert not self.ended.is_set(), "a sequence ended twice"
        self.error = error
        self.ended.set()

    def wait(self) -> Recorder:
        assert self.ended.wait(WAIT_S), "the sequence never ended"
        return self


@pytest.fixture
def loops() -> Any:
    """Builds loops and closes them after the test."""
    made: list[BatchLoop] = []

    def make(model: Any, **kwargs: Any) -> BatchLoop:
        loop = BatchLoop(model, **kwargs)
        made.append(loop)
        return loop

    yield make
    for loop in made:
        loop.close()
        assert loop.join(WAIT_S)


def seq(prompt: list[int], max_new: int, sink: Any, **kwargs: Any) -> Sequence:
    return Sequence(prompt=prompt, max_new_tokens=max_new, sink=sink, **kwargs)


# --- greedy: a sequence in a batch decodes what it decodes alone ----------------------------------


def test_each_sequence_of_a_batch_is_its_greedy_run_alone(model: Any, loops: Any) -> None:
    """Five sequences of different prompt lengths (one a single token, two longer than the sliding
    window) and budgets; they join at different steps, one longer than the batch so far (every row
    is padded), one is cancelled mid-way, one ends on its end-of-sequence token; prompts are read in
    chunks between decode steps."""
    loop = loops(model, max_batch=5, prefill_chunk=4)
    prompts = {"a": prompt_of(13, 1), "b": prompt_of(2, 2), "c": prompt_of(25, 3), "d": prompt_of(7, 4), "e": [1]}
    budgets = {"a": 16, "b": 10, "c": 12, "d": 30, "e": 14}
    refs = {k: alone(model, prompts[k], budgets[k]) for k in prompts}
    eos_e = refs["e"][3]  # e's end-of-sequence token: the fourth it decodes
    refs["e"] = alone(model, prompts["e"], budgets["e"], eos=(eos_e,))
    assert len(refs["e"]) == refs["e"].index(eos_e) + 1 <= 4
    seqs: dict[str, Sequence] = {}

    def then(after: int, *names: str) -> Callable[[Recorder, int], None]:
        def on_token(_: Recorder, count: int) -> None:
            if count == after:
                for name in names:
                    loop.submit(seqs[name])

        return on_token

    def cancel_d(_: Recorder, count: int) -> None:
        if count == 4:
            seqs["d"].cancel.set()

    callbacks = {"a": then(2, "b", "d", "e"), "b": then(3, "c"), "d": cancel_d}
    for name in prompts:
        eos = frozenset({eos_e}) if name == "e" else frozenset()
        seqs[name] = seq(prompts[name], budgets[name], Recorder(callbacks.get(name)), eos=eos)
    loop.submit(seqs["a"])
    for name, s in seqs.items():
        assert s.sink.wait().error is None, name
    assert seqs["d"].sink.tokens == refs["d"][:4]  # cancelled after its fourth token: none after it
    for name in "abce":
        assert seqs[name].sink.tokens == refs[name], name
    assert loop.peak >= 4  # they did share decode steps
    assert loop.running == 0 and loop.waiting == 0


def test_the_batch_cache_gives_each_row_its_own_logits_as_rows_join_and_leave(model: Any) -> None:
    """The cache merge itself: rows of 9, 3 and 20 tokens (the window is 6) join a batch at different
    steps and leave it; at every step each row's logits are those of the same sequence decoded on its
    own cache, and once the longest has left the batch is only as long as the longest left."""
    forward = batching.forward_fn(model)
    prompts = [prompt_of(9, 5), prompt_of(3, 6), prompt_of(20, 7)]
    batch = Batch()
    solo: dict[int, tuple[Any, int]] = {}  # row's sequence index -> (its own cache, its length)
    order: list[int] = []  # which sequence each batch row is

    def read(i: int) -> tuple[Any, Any]:
        reader = Reader(seq(prompts[i], 1, Recorder()), batching.new_cache(model), chunk=5)
        while (logits := reader.step(forward)) is None:
            pass
        return reader.cache, logits

    def join(i: int) -> None:
        cache, logits = read(i)
        token = int(logits.argmax())
        own, _ = read(i)
        solo[i] = (own, len(prompts[i]))
        batch.join(seq(prompts[i], 1, Recorder()), cache, len(prompts[i]), token)
        order.append(i)

    def step() -> None:
        tokens = list(batch.last)
        logits = batch.step(forward)
        for row, i in enumerate(order):
            own, length = solo[i]
            expected = forward(
                input_ids=torch.tensor([[tokens[row]]]),
                attention_mask=None,
                position_ids=torch.tensor([[length]]),
                cache=own,
            )
            solo[i] = (own, length + 1)
            torch.testing.assert_close(logits[row], expected[0], rtol=1e-4, atol=1e-4)
        batch.last = logits.argmax(-1).tolist()

    def leave(i: int) -> None:
        batch.keep([row for row, j in enumerate(order) if j != i])
        order.remove(i)

    with torch.inference_mode():
        join(0)
        for _ in range(3):
            step()
        join(1)  # shorter than the batch: padded on its own
        for _ in range(4):
            step()
        join(2)  # longer than the batch: every row is padded
        for _ in range(3):
            step()
        leave(0)
        step()
        leave(2)  # the longest leaves: the columns that were padding in the rest are cut
        assert batch.length == solo[1][1] and batch.pads == [0]
        for _ in range(2):
            step()
    for layer in batch.cache.layers:
        window = getattr(layer, "sliding_window", None)
        assert layer.keys.shape[-2] == (batch.length if window is None else min(batch.length, TINY_WINDOW - 1))


# --- sampling -------------------------------------------------------------------------------------


def sampled(model: Any, loops: Any, seed: int | None, company: bool) -> list[int]:
    loop = loops(model, max_batch=4, prefill_chunk=8)
    others = [Recorder() for _ in range(3)] if company else []
    if company:  # a greedy and a differently seeded sequence ahead of it, and one joining later
        loop.submit(seq(prompt_of(11, 1), 20, others[0]))
        loop.submit(seq(prompt_of(4, 2), 20, others[1], temperature=1.0, top_p=0.9, top_k=40, seed=99))
    rec = Recorder()
    loop.submit(seq(prompt_of(6, 3), 16, rec, temperature=0.9, top_p=0.95, top_k=40, seed=seed))
    if company:
        loop.submit(seq(prompt_of(17, 4), 20, others[2], temperature=1.3, seed=5))
    for other in others:
        assert other.wait().error is None
    return rec.wait().tokens


def test_a_seeded_sampled_sequence_draws_the_same_tokens_whatever_its_company(model: Any, loops: Any) -> None:
    rng = torch.get_rng_state()
    alone_tokens = sampled(model, loops, seed=1234, company=False)
    assert sampled(model, loops, seed=1234, company=True) == alone_tokens
    assert sampled(model, loops, seed=-7, company=True) == sampled(model, loops, seed=-7, company=False)
    assert alone_tokens != alone(model, prompt_of(6, 3), 16)  # it did sample
    # each sequence has a generator of its own: the process's global one was never drawn from
    sampled(model, loops, seed=None, company=True)
    assert torch.equal(torch.get_rng_state(), rng)


def test_a_temperature_too_small_to_divide_by_is_greedy(model: Any, loops: Any) -> None:
    loop = loops(model)
    rec = Recorder()
    loop.submit(seq(prompt_of(5), 10, rec, temperature=1e-30, top_p=0.5, seed=1))
    assert rec.wait().tokens == alone(model, prompt_of(5), 10)


def test_top_p_keeps_the_most_likely_tokens_until_their_mass_reaches_it() -> None:
    scores = torch.log(torch.tensor([0.05, 0.5, 0.3, 0.15]))
    drawn = set()
    for seed in range(200):
        s = Sequence(prompt=[1], max_new_tokens=1, sink=Recorder(), temperature=1.0, top_p=0.75, seed=seed)
        drawn.add(batching.sample(scores, s))
    assert drawn == {1, 2}  # 0.5 + 0.3 reach 0.75; 0.15 and 0.05 are cut
    one = Sequence(prompt=[1], max_new_tokens=1, sink=Recorder(), temperature=1.0, top_p=0.1, top_k=3, seed=3)
    assert batching.sample(scores, one) == 1  # the most likely token is always kept
    k1 = Sequence(prompt=[1], max_new_tokens=1, sink=Recorder(), temperature=2.0, top_k=1, seed=3)
    assert batching.sample(scores, k1) == 1


# --- the batch bound, cancellation, errors, closing -----------------------------------------------


def test_at_most_max_batch_are_served_at_once_and_the_rest_wait_in_order(model: Any, loops: Any) -> None:
    loop = loops(model, max_batch=2, prefill_chunk=4)
    events: list[tuple[str, int]] = []
    lock = threading.Lock()

    class Logged(Recorder):
        def __init__(self, n: int):
            super().__init__()
            self.n = n

        def token(self, token_id: int) -> None:
            if not self.tokens:
                with lock:
                    events.append(("start", self.n))
            super().token(token_id)

        def end(self, error: BaseException | None) -> None:
            with lock:
                events.append(("end", self.n))
            super().end(error)

    prompts = [prompt_of(3 + 4 * n, n) for n in range(5)]
    sinks = [Logged(n) for n in range(5)]
    for n in range(5):
        loop.submit(seq(prompts[n], 6 + n, sinks[n]))
    for n in range(5):
        assert sinks[n].wait().tokens == alone(model, prompts[n], 6 + n)
    served, most = 0, 0
    for kind, _ in events:
        served += 1 if kind == "start" else -1
        most = max(most, served)
    assert most == 2 and loop.peak == 2
    assert [n for kind, n in events if kind == "start"] == [0, 1, 2, 3, 4]  # first come, first served


def test_a_cancelled_sequence_frees_its_slot_at_the_next_step(model: Any, loops: Any) -> None:
    loop = loops(model, max_batch=1)
    long = Sequence(prompt=prompt_of(5), max_new_tokens=200, sink=None)  # type: ignore[arg-type]

    def leave_after_three(_: Recorder, count: int) -> None:
        if count == 3:
            long.cancel.set()

    long.sink = Recorder(leave_after_three)
    waiting_gone = seq(prompt_of(4), 5, Recorder())
    waiting_gone.cancel.set()  # its client left while it waited
    after = seq(prompt_of(9), 5, Recorder())
    for s in (long, waiting_gone, after):
        loop.submit(s)
    assert after.sink.wait().tokens == alone(model, prompt_of(9), 5)
    assert long.sink.wait().tokens == alone(model, prompt_of(5), 3)  # none after it left
    assert long.sink.error is None and waiting_gone.sink.wait().tokens == [] and waiting_gone.sink.error is None


def test_a_failed_step_fails_its_batch_and_the_loop_serves_the_next(model: Any, loops: Any) -> None:
    flaky = Breakable(model)
    loop = loops(flaky, max_batch=4, prefill_chunk=64)

    def then_break_a_step(_: Recorder, count: int) -> None:
        if count == 2:  # b decodes beside a now: the next step of both breaks
            flaky.fail = lambda input_ids: input_ids.shape[0] == 2

    a, b = Recorder(), Recorder(then_break_a_step)
    loop.submit(seq(prompt_of(6, 1), 50, a))
    loop.submit(seq(prompt_of(8, 2), 50, b))
    assert isinstance(a.wait().error, RuntimeError) and isinstance(b.wait().error, RuntimeError)
    assert len(b.tokens) == 2 and len(a.tokens) < 50
    after = Recorder()
    loop.submit(seq(prompt_of(7, 3), 9, after))
    assert after.wait().error is None and after.tokens == alone(model, prompt_of(7, 3), 9)


def test_a_prompt_that_fails_to_be_read_fails_alone(model: Any, loops: Any) -> None:
    flaky = Breakable(model)
    loop = loops(flaky, max_batch=4, prefill_chunk=64)
    broken, running = Recorder(), Recorder()

    def then_a_broken_read(_: Recorder, count: int) -> None:
        if count == 2:
            flaky.fail = lambda input_ids: input_ids.shape[1] > 1
            loop.submit(seq(prompt_of(9, 2), 5, broken))

    running.on_token = then_a_broken_read
    loop.submit(seq(prompt_of(6, 1), 12, running))
    assert isinstance(broken.wait().error, RuntimeError) and broken.tokens == []
    assert running.wait().error is None and running.tokens == alone(model, prompt_of(6, 1), 12)


def test_closing_ends_waiting_and_running_sequences_and_refuses_new_ones(model: Any) -> None:
    loop = BatchLoop(model, max_batch=1)
    first_token = threading.Event()
    running = Recorder(lambda _, count: first_token.set())
    waiting = Recorder()
    loop.submit(seq(prompt_of(5), 10_000, running))
    loop.submit(seq(prompt_of(5), 10, waiting))
    assert first_token.wait(WAIT_S)
    loop.close()
    assert isinstance(waiting.wait().error, LoopClosed) and waiting.tokens == []
    assert isinstance(running.wait().error, LoopClosed)
    assert loop.join(WAIT_S)
    with pytest.raises(LoopClosed):
        loop.submit(seq(prompt_of(5), 10, Recorder()))


def test_a_cache_that_cannot_be_merged_is_served_one_sequence_at_a_time(
    model: Any, loops: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(batching, "mergeable", lambda cache: False)
    loop = loops(model, max_batch=8)
    assert loop.max_batch == 1
    recs = [Recorder() for _ in range(3)]
    for n, rec in enumerate(recs):
        loop.submit(seq(prompt_of(4 + n, n), 6, rec))
    for n, rec in enumerate(recs):
        assert rec.wait().tokens == alone(model, prompt_of(4 + n, n), 6)
    assert loop.peak == 1


def test_odd_submissions_are_refused(model: Any, loops: Any) -> None:
    loop = loops(model)
    with pytest.raises(ValueError, match="prompt token"):
        loop.submit(seq([], 5, Recorder()))
    with pytest.raises(ValueError, match="max_new_tokens"):
        loop.submit(seq([1], 0, Recorder()))
    with pytest.raises(ValueError):
        BatchLoop(model, max_batch=0)


def test_the_rows_first_head_is_the_same_product() -> None:
    """The vocabulary head laid the other way for a few rows (what the loop installs) gives what
    ``F.linear`` gives, with or without a bias, for any number of rows and leading dimensions."""
    torch.manual_seed(3)
    for bias in (False, True):
        head = torch.nn.Linear(24, 300, bias=bias)
        model = SimpleNamespace(get_output_embeddings=lambda head=head: head)
        expected = {rows: torch.nn.functional.linear(x, head.weight, head.bias) for rows, x in _inputs().items()}
        assert batching.rows_first_head(model) and not batching.rows_first_head(model)  # once
        for rows, x in _inputs().items():
            torch.testing.assert_close(head(x), expected[rows], rtol=1e-5, atol=1e-5)
    assert not batching.rows_first_head(object())  # a model without a linear head is left as it is


def _inputs() -> dict[int, Any]:
    gen = torch.Generator().manual_seed(4)
    return {
        rows: torch.randn(rows, 1, 24, generator=gen) if rows % 2 else torch.randn(rows, 24, generator=gen)
        for rows in (1, 2, 3, 8, 16, 17, 40)
    }


EXITING_MID_DECODE = """
import threading
from ragserve.models.batching import BatchLoop, Sequence
from tests.unit.models.stand_ins import tiny_gemma

class Sink:
    def __init__(self):
        self.first = threading.Event()
    def token(self, token_id):
        self.first.set()
    def end(self, error):
        pass

loops, sinks = [], []
for n in range(3):
    loop = BatchLoop(tiny_gemma(window=100_000), prefill_chunk=8)  # nobody closes it
    sinks.append(Sink())
    loop.submit(Sequence(prompt=[1, 10 + n, 11], max_new_tokens=50_000, sink=sinks[-1]))
    loops.append(loop)
assert all(s.first.wait(60) for s in sinks)
print("exiting while", sum(loop.running for loop in loops), "sequences decode", flush=True)
"""


def test_a_process_that_exits_while_its_loops_decode_exits_cleanly() -> None:
    """The interpreter's exit closes running loops and waits for their step: a daemon thread left
    inside a torch operator aborts the process at exit ("terminate called without an active
    exception", or a segmentation fault: a `make test` run that passed every test failed so)."""
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[3]
    done = subprocess.run(
        [sys.executable, "-c", EXITING_MID_DECODE], cwd=repo, capture_output=True, text=True, timeout=WAIT_S * 3
    )
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert "exiting while 3 sequences decode" in done.stdout


def test_a_forked_child_does_not_hold_its_parents_loops(model: Any, loops: Any) -> None:
    """A fork's exit must not close (and end the requests of) the parent's loops: the child forgets them."""
    import os

    loop = loops(model)
    assert loop in batching._live
    pid = os.fork()
    if pid == 0:  # the child: report and leave at once, without the interpreter's exit
        os._exit(0 if not batching._live else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert loop in batching._live  # the parent's are untouched
