"""The first steps of a `python -m orion train` run against PyTorch fp32 training of the same model, from the
same initial weights, on the same batches, at the same learning rates: the loss of every step side by side.

    python benchmarks/train_vs_torch.py --compare 100 -- --model stories110m --data stdlib --steps 1000 \\
        --out /tmp/trainer-mission --checkpoint-every 10 --keep 2 --eval-every 50

Everything after ``--`` is the run's own ``python -m orion train`` command line. The script rebuilds that run's
trainer in a temporary directory (initial weights from the seed, the batch sampler) and proves it is the same
run: its config hash must equal the hash in the run's newest checkpoint. PyTorch (transformers' model, fp32,
2 threads) then trains on the trainer's batches with the learning rate the run logged for each step. Orion's
losses are read from the run's ``train.jsonl`` (the last record of each step: resumed steps are logged again).
Nothing of the run is modified.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from orion.bench.train import TorchSide
from orion.train import checkpoint
from orion.train.cli import DATA_SUBDIR, STDLIB
from orion.train.cli import parser as train_parser
from orion.train.trainer import CHECKPOINT_DIR, LOG_FILE, TrainConfig, Trainer


def logged_steps(run: Path) -> dict[int, dict]:
    """The last logged record of each optimizer step of ``run``."""
    steps = {}
    for line in (run / LOG_FILE).read_text().splitlines():
        record = json.loads(line)
        if record.get("event") == "step":
            steps[record["step"]] = record
    return steps


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    split = argv.index("--") if "--" in argv else len(argv)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--compare", type=int, default=100, help="steps to compare (default 100)")
    args = parser.parse_args(argv[:split])
    run_args = train_parser().parse_args(argv[split + 1:])
    run = Path(run_args.out)
    config = TrainConfig(**{f.name: getattr(run_args, f.name) for f in dataclasses.fields(TrainConfig)
                            if hasattr(run_args, f.name)})
    data = run / DATA_SUBDIR if run_args.data == STDLIB else run_args.data
    orion_steps = logged_steps(run)
    missing = [s for s in range(1, args.compare + 1) if s not in orion_steps]
    if missing:
        sys.exit(f"{run / LOG_FILE}: steps {missing[:5]}... are not logged; compare fewer steps")
    newest = checkpoint.latest_valid(run / CHECKPOINT_DIR)
    with tempfile.TemporaryDirectory() as tmp:
        trainer = Trainer(run_args.model, data, Path(tmp) / "run", config, quiet=True)
        if newest is None or checkpoint.verify(newest)["config_hash"] != trainer.config_hash:
            sys.exit(f"{run}: this command line does not rebuild that run (config hash {trainer.config_hash[:12]} "
                     f"differs from {newest}'s); pass the run's own arguments after --")
        torch_side = TorchSide(trainer, Path(tmp))
        rows, began = [], time.perf_counter()
        for step in range(1, args.compare + 1):
            record = orion_steps[step]
            for group in torch_side.optimizer.param_groups:
                group["lr"] = record["lr"]
            loss, ms = torch_side.step()
            rows.append((step, record["loss"], loss, ms))
            print(f"\rstep {step}/{args.compare}: orion {record['loss']:.4f} torch {loss:.4f}", end="",
                  file=sys.stderr, flush=True)
        print(file=sys.stderr)
    ours, theirs = np.array([r[1] for r in rows]), np.array([r[2] for r in rows])
    gap = np.abs(ours - theirs)
    relative = gap / np.abs(theirs)
    print(f"{run}: the first {args.compare} steps, Orion (logged) vs PyTorch fp32 (replayed, "
          f"{(time.perf_counter() - began) / 60:.1f} min)")
    print(" step   orion   torch   |gap|")
    for step, o, t, _ in rows:
        if step in (1, 2, 5, 10, 20, 50, 100, args.compare) or gap[step - 1] == gap.max():
            print(f"{step:5d} {o:7.4f} {t:7.4f} {abs(o - t):7.4f}")
    print(f"|gap|: median {np.median(gap):.4f}, max {gap.max():.4f} (step {int(gap.argmax()) + 1}); relative: "
          f"median {np.median(relative):.2e}, max {relative.max():.2e}")
    print(f"mean loss over the {args.compare} steps: orion {ours.mean():.4f}, torch {theirs.mean():.4f}; "
          f"torch {statistics.median(r[3] for r in rows):.0f} ms/step")
    return 0


if __name__ == "__main__":
    sys.exit(main())
