"""The server's counters and timings, and ``GET /metrics`` in Prometheus' text format (version 0.0.4).

The worker thread records; a request handler renders. Names follow vLLM's where they mean the same:
requests by outcome, prompt and generated tokens, the queue, time to first token, time per output
token, and the generation rate while the worker is busy.
"""

from __future__ import annotations

import bisect
import threading
from dataclasses import dataclass, field

PREFIX = "orion"
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


@dataclass
class Histogram:
    """Cumulative buckets, sum and count, as Prometheus keeps them."""

    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * len(self.bounds)

    def observe(self, value: float) -> None:
        index = bisect.bisect_left(self.bounds, value)
        for i in range(index, len(self.bounds)):
            self.counts[i] += 1
        self.total += value
        self.count += 1

    def lines(self, name: str) -> list[str]:
        out = [f'{name}_bucket{{le="{bound:g}"}} {n}' for bound, n in zip(self.bounds, self.counts)]
        return [*out, f'{name}_bucket{{le="+Inf"}} {self.count}', f"{name}_sum {self.total:.6g}",
                f"{name}_count {self.count}"]


class Metrics:
    """Everything ``/metrics`` reports; the methods are called by the scheduler's worker."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.prompt_tokens = 0
        self.ttft = Histogram(TTFT_BUCKETS)
        self.time_per_output_token = Histogram(TPOT_BUCKETS)
        self._busy_seconds = 0.0
        self._busy_tokens = 0

    def started(self, prompt_tokens: int) -> None:
        with self._lock:
            self.prompt_tokens += prompt_tokens

    def first_token(self, seconds_since_arrival: float) -> None:
        with self._lock:
            self.ttft.observe(seconds_since_arrival)

    def finished(self, decode_seconds: float, tokens_after_first: int) -> None:
        if tokens_after_first > 0:
            with self._lock:
                self.time_per_output_token.observe(decode_seconds / tokens_after_first)

    def stepped(self, seconds: float, tokens: int) -> None:
        """One round of the worker: ``tokens`` new tokens in ``seconds``."""
        with self._lock:
            self._busy_seconds += seconds
            self._busy_tokens += tokens

    def render(self, counts: dict[str, int], waiting: int, running: int, generated: int) -> str:
        """The text exposition: ``counts`` are requests by outcome (completed, cancelled, failed, rejected)."""
        p = PREFIX
        with self._lock:
            rate = self._busy_tokens / self._busy_seconds if self._busy_seconds > 0 else 0.0
            blocks = [
                (f"{p}_requests_total", "counter", "Requests by outcome.",
                 [f'{p}_requests_total{{outcome="{k}"}} {v}' for k, v in counts.items()]),
                (f"{p}_prompt_tokens_total", "counter", "Prompt tokens of the requests started.",
                 [f"{p}_prompt_tokens_total {self.prompt_tokens}"]),
                (f"{p}_generation_tokens_total", "counter", "Tokens generated.",
                 [f"{p}_generation_tokens_total {generated}"]),
                (f"{p}_requests_waiting", "gauge", "Requests queued, not yet generating.",
                 [f"{p}_requests_waiting {waiting}"]),
                (f"{p}_requests_running", "gauge", "Requests generating now.", [f"{p}_requests_running {running}"]),
                (f"{p}_time_to_first_token_seconds", "histogram", "From a request's arrival to its first token.",
                 self.ttft.lines(f"{p}_time_to_first_token_seconds")),
                (f"{p}_time_per_output_token_seconds", "histogram", "Seconds per token after a request's first.",
                 self.time_per_output_token.lines(f"{p}_time_per_output_token_seconds")),
                (f"{p}_generation_tokens_per_second", "gauge",
                 "Tokens generated per second of the worker's busy time (prefills included), since the start.",
                 [f"{p}_generation_tokens_per_second {rate:.6g}"]),
            ]
        lines = []
        for name, kind, text, samples in blocks:
            lines += [f"# HELP {name} {text}", f"# TYPE {name} {kind}", *samples]
        return "\n".join(lines) + "\n"
