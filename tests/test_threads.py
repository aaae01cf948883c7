"""Programs and models used from several threads: results are each thread's own, or a clear error.

References: numpy float32 for the program (tolerance 2e-2, fp16 I/O); for GPT-2, the same model run
sequentially in one thread (bit-identical token ids)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import orion
from orion.models import GPT2, GPT2Config
from support.gpt2_fixtures import lively_weights

ADD_TANH = """program(1.3)
{
    func main<ios18>(tensor<fp16, [1, 64, 1, 64]> x, tensor<fp16, [1, 64, 1, 64]> y) {
        tensor<fp16, [1, 64, 1, 64]> s = add(x=x, y=y)[name=string("s")];
        tensor<fp16, [1, 64, 1, 64]> t = tanh(x=s)[name=string("t")];
    } -> (t);
}
"""
CONFIG = GPT2Config(n_layer=2, n_head=4, n_embd=64, vocab_size=512, n_positions=128)


def in_threads(*jobs) -> list:
    """Runs each job in its own thread at once; returns their results (re-raising the first error)."""
    results, errors = [None] * len(jobs), []
    start = threading.Barrier(len(jobs))

    def run(i: int) -> None:
        start.wait()
        try:
            results[i] = jobs[i]()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the main thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results


def test_program_calls_from_two_threads_get_their_own_results() -> None:
    program = orion.compile(ADD_TANH, surface_counts=(2, 1))  # two inputs: as a probe report proving them
    rng = np.random.default_rng(0)
    inputs = [(rng.standard_normal((1, 64, 1, 64)).astype(np.float16), np.full((1, 64, 1, 64), s, np.float16))
              for s in (-1.0, 1.0)]

    def calls(x: np.ndarray, y: np.ndarray) -> float:
        want = np.tanh(x.astype(np.float32) + y.astype(np.float32))
        return max(float(np.abs(program(x=x, y=y)["t"].astype(np.float32) - want).max()) for _ in range(300))

    errors = in_threads(*(lambda x=x, y=y: calls(x, y) for x, y in inputs))
    assert max(errors) < 2e-2


def sequential_generations(model: GPT2, prompts: list[list[int]], n: int) -> list[list[int]]:
    return [list(model.generate(p, n)) for p in prompts]


def test_forks_generate_in_two_threads_as_they_do_alone() -> None:
    model = GPT2(CONFIG, lively_weights(CONFIG, seed=3), progress=False)
    prompts = [[5, 17, 200, 2, 9], [1, 2, 3]]
    want = sequential_generations(model, prompts, 24)
    branches = [model.fork(), model.fork()]
    for _ in range(3):
        got = in_threads(*(lambda b=b, p=p: list(b.generate(p, 24)) for b, p in zip(branches, prompts)))
        assert got == want


def test_one_model_in_two_threads_is_a_clear_error() -> None:
    model = GPT2(CONFIG, lively_weights(CONFIG, seed=3), progress=False)
    model.prefill([1, 2, 3])
    with model._exclusive("decode_step"):  # as if another thread were inside decode_step
        with pytest.raises(orion.OrionError, match=r"GPT2.decode_step: this model is running in another thread; "
                                                     r"give each thread its own fork\(\)"):
            model.decode_step(4)
        with pytest.raises(orion.OrionError, match="running in another thread"):
            model.fork()
    assert model.cache.length == 3  # the refused call changed nothing
    model.decode_step(4)
    assert model.cache.length == 4
