"""Training infrastructure: the pieces a training loop plugs together.

- ``orion.train.optim``: AdamW on fp32 master weights (C++, all cores), global gradient norm, clipping.
- ``orion.train.schedule``: learning-rate schedules (linear warmup + cosine, constant) by optimizer step.
- ``orion.train.loss_scale``: dynamic or static loss scaling, and the counted clamp to the fp16 range.
- ``orion.train.data``: memory-mapped token files, the resumable batch sampler, ``prepare``
  (``orion.train.data_cli.main``: ``python -m orion data prepare``).
- ``orion.train.corpus``: the built-in default corpus (Python's standard library sources).
- ``orion.train.checkpoint``: atomic, checksummed safetensors + JSON checkpoints.
- ``orion.train.restart``: the exec() restart and the compile-budget predicate.
- ``orion.train.trainer``: :class:`Trainer`, the loop over all of the above (``orion.train.cli.main``:
  ``python -m orion train``). Imported on first use of ``orion.train.Trainer`` / ``TrainConfig``.
"""

from typing import Any

from orion.train.errors import CheckpointError, DataError, TrainError

__all__ = ["CheckpointError", "DataError", "TrainConfig", "TrainError", "Trainer"]


def __getattr__(name: str) -> Any:
    if name in ("Trainer", "TrainConfig"):  # lazily: the trainer pulls in the compiler and the autodiff
        from orion.train import trainer

        return getattr(trainer, name)
    raise AttributeError(f"module 'orion.train' has no attribute {name!r}")
