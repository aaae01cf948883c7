"""One worker thread owns the engine (and so the device): it admits queued requests in arrival order
and steps the active ones in turn, one token each, so that every stream makes progress (a batching
engine computes the round's tokens of all of them in one step). A request for ``n`` choices holds
``n`` of the engine's sequences; each choice's events carry its index. Each finished choice reports its
usage: prompt and completion tokens, time to first token and tokens per second (also logged)."""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from orion.serve.engine import Engine, SamplingParams, TokenLogprob
from orion.serve.metrics import Metrics
from orion.serve.text import TextStream

log = logging.getLogger("orion.serve")

BURST_WAIT = 0.002  # seconds: the server's default Scheduler.burst_wait (--burst-wait-ms) for the batched engine


@dataclass
class Delta:
    text: str
    index: int = 0  # the choice
    logprobs: list[TokenLogprob] = field(default_factory=list)  # of the tokens this text completes


@dataclass
class Finished:
    reason: str  # "stop" or "length"
    prompt_tokens: int
    completion_tokens: int
    index: int = 0  # the choice
    logprobs: list[TokenLogprob] = field(default_factory=list)  # of the tokens no Delta carried
    first_token_s: float = 0.0  # from arrival to the first token
    tokens_per_s: float = 0.0  # completion tokens after the first, per second


@dataclass
class Failed:
    error: BaseException


Event = Delta | Finished | Failed


@dataclass
class Job:
    """One generation request; ``emit`` delivers its events (called from the worker thread)."""

    prompt_ids: list[int]
    params: SamplingParams
    stops: list[str]
    emit: Callable[[Event], None]
    n: int = 1  # choices, each one of the engine's sequences
    cancelled: threading.Event = field(default_factory=threading.Event)
    arrived: float = field(default_factory=time.monotonic)  # for the time to first token

    def cancel(self) -> None:
        self.cancelled.set()


class ServerStopping(Exception):
    """The worker stopped before this job finished."""


class QueueFull(Exception):
    """Every queue slot is taken; retry after ``retry_after`` seconds."""

    def __init__(self, waiting: int, retry_after: int) -> None:
        super().__init__(f"the server is busy: {waiting} requests are waiting")
        self.retry_after = retry_after


@dataclass
class _Running:
    job: Job
    tokens: Iterator[int | TokenLogprob | None]
    text: TextStream
    index: int = 0
    produced: int = 0
    first_token_at: float = 0.0
    logprobs: list[TokenLogprob] = field(default_factory=list)  # not yet sent with a delta


@dataclass
class Stats:
    """Counters for /health."""

    completed: int = 0
    cancelled: int = 0
    failed: int = 0
    rejected: int = 0
    tokens: int = 0


class Scheduler:
    """A bounded FIFO of waiting jobs and up to ``engine.max_sequences`` active ones, round-robin.

    ``burst_wait``: seconds an idle worker waits, after a request arrives, for another (and so on while they keep
    coming, up to the engine's sequences) before it starts them: a burst of requests then starts in one round, and
    a batching engine reads their prompts in one pass instead of two or three (clients that send their next
    request when the last ends arrive a few ms apart). A request that finds other sequences decoding never waits.
    """

    def __init__(self, engine: Engine, max_waiting: int = 64, retry_after: int = 1, burst_wait: float = 0.0) -> None:
        if max_waiting < 1:
            raise ValueError(f"max_waiting={max_waiting}: use 1 or more")
        if not 0 <= burst_wait <= 1:
            raise ValueError(f"burst_wait={burst_wait}: use 0 to 1 seconds")
        self.engine, self.max_waiting, self.retry_after = engine, max_waiting, retry_after
        self.burst_wait = burst_wait
        self.stats = Stats()
        self.metrics = Metrics()
        self._waiting: deque[Job] = deque()
        self._active: list[_Running] = []
        self._wake = threading.Condition()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="orion-serve-worker", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        with self._wake:
            self._stopping = True
            self._wake.notify()
        self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def load(self) -> tuple[int, int]:
        """(waiting, active) job counts."""
        with self._wake:
            return len(self._waiting), len(self._active)

    def submit(self, job: Job) -> None:
        """Queue ``job``; raises :class:`QueueFull` when ``max_waiting`` jobs already wait."""
        with self._wake:
            if len(self._waiting) >= self.max_waiting:
                self.stats.rejected += 1
                raise QueueFull(len(self._waiting), self.retry_after)
            self._waiting.append(job)
            self._wake.notify()

    # -- worker -------------------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._wake:
                while not (self._stopping or self._waiting or self._active):
                    self._wake.wait()
                if not self._active:
                    self._gather()
                if self._stopping:
                    break
                while self._waiting and len(self._active) + self._waiting[0].n <= self.engine.max_sequences:
                    self._admit(self._waiting.popleft())
                round_robin = list(self._active)
            start, tokens = time.perf_counter(), self.stats.tokens
            for running in round_robin:  # one token each, outside the lock so submit never waits on the device
                if not self._step(running):
                    with self._wake:
                        self._active.remove(running)
            self.metrics.stepped(time.perf_counter() - start, self.stats.tokens - tokens)
        stopping = ServerStopping("the server is shutting down: retry on another instance or after it restarts")
        for running in self._active:
            running.tokens.close()
            running.job.emit(Failed(stopping))
        for job in self._waiting:
            job.emit(Failed(stopping))

    def _gather(self) -> None:
        """Wait (holding ``_wake``) while requests keep arriving within ``burst_wait`` of each other, until the
        waiting ones hold the engine's sequences."""
        while self.burst_wait and not self._stopping and \
                sum(job.n for job in self._waiting) < self.engine.max_sequences:
            waiting = len(self._waiting)
            self._wake.wait(self.burst_wait)
            if len(self._waiting) == waiting:
                return

    def _admit(self, job: Job) -> None:
        if job.cancelled.is_set():
            self.stats.cancelled += 1
            return
        engine = self.engine
        try:
            choices = [engine.generate(job.prompt_ids, job.params, job.cancelled.is_set)] if job.n == 1 else \
                engine.generate_choices(job.prompt_ids, job.params, job.cancelled.is_set, job.n)
            texts = [TextStream(engine.decode, job.prompt_ids, job.stops, job.params.stop_token_ids) for _ in choices]
        except Exception as exc:  # an engine that fails before its first token fails this request only
            log.exception("generation failed to start")
            self.stats.failed += 1
            job.emit(Failed(exc))
            return
        self._active.extend(_Running(job, tokens, text, i) for i, (tokens, text) in enumerate(zip(choices, texts)))
        self.metrics.started(len(job.prompt_ids))

    def _step(self, running: _Running) -> bool:
        """Advance ``running`` by one token; False once it has ended."""
        job = running.job
        try:
            if job.cancelled.is_set():
                return self._cancel(running)
            try:
                token = next(running.tokens)
            except StopIteration:
                if job.cancelled.is_set():
                    return self._cancel(running)
                text, reason = running.text.finish()
                return self._finish(running, text, reason)
            if token is None:  # no token this round: the engine is reading a prompt
                return True
            if isinstance(token, TokenLogprob):
                running.logprobs.append(token)
                token = token.token
            running.produced += 1
            self.stats.tokens += 1
            if running.produced == 1:
                running.first_token_at = time.monotonic()
                self.metrics.first_token(running.first_token_at - job.arrived)
            text, reason = running.text.push(token)
            if reason is not None:
                running.tokens.close()
                return self._finish(running, text, reason)
            if text:
                job.emit(Delta(text, running.index, running.logprobs))
                running.logprobs = []
            return True
        except Exception as exc:  # a crash in generation fails this request only
            log.exception("generation failed")
            self.stats.failed += 1
            running.tokens.close()
            job.cancel()  # its other choices stop too
            job.emit(Failed(exc))
            return False

    def _finish(self, running: _Running, text: str, reason: str) -> bool:
        job = running.job
        if text:
            job.emit(Delta(text, running.index, running.logprobs))
            running.logprobs = []
        now = time.monotonic()
        decoding = now - running.first_token_at if running.produced else 0.0
        rate = (running.produced - 1) / decoding if running.produced > 1 and decoding > 0 else 0.0
        first = running.first_token_at - job.arrived if running.produced else 0.0
        job.emit(Finished(reason, len(job.prompt_ids), running.produced, running.index, running.logprobs, first, rate))
        log.info("request finished (%s): %d prompt tokens, %d completion tokens, %.3f s to the first token, "
                 "%.1f tok/s", reason, len(job.prompt_ids), running.produced, first, rate)
        if running.produced:
            self.metrics.finished(decoding, running.produced - 1)
        self.stats.completed += 1
        return False

    def _cancel(self, running: _Running) -> bool:
        running.tokens.close()
        self.stats.cancelled += 1
        return False
