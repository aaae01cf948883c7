"""The training loop: :class:`Trainer` (one model, one token dataset, one run directory).

Each optimizer step draws ``accum`` batches of ``batch`` windows (the sampler's state is checkpointed), runs
:meth:`GradientRunner.loss_and_grads` per window with the loss scale (fp16 programs, fp32 gradients back),
sums the gradients in fp32, and then either skips the step (any NaN/Inf gradient: counted, the loss scale
backs off, nothing is rewritten) or applies AdamW (C++; decay on matrices) at the warmup+cosine rate with the
gradients read as ``grad * clip / (batch * accum)``. Every step appends one JSON line to ``train.jsonl``
(loss, grad norm, loss scale, skips, clamps, lr, ms/step, tokens/s, the process's compile count); validation
runs every ``eval_every`` steps and checkpoints (:mod:`orion.train.checkpoint`) every ``checkpoint_every``,
keeping the last ``keep``.

Compilation is deferred: the runner (which compiles every program) is built only once the run's
checkpoint, if any, is loaded. Weights strategy (``TrainConfig.weights``, see
:class:`orion.autodiff.runner.GradientRunner`): ``"inputs"``, the programs take the weights as inputs, so an
update needs no compile; ``"patch"``, per-layer programs with baked weights whose files are swapped after each
optimizer step, without a compile; ``"recompile"``, the same programs compiled again after each step. Before
each step the trainer forecasts the step's compiles (building the runner, the update after the optimizer step)
and, if they would cross the compile budget's threshold, checkpoints and exec-restarts
(:mod:`orion.train.restart`; with ``exec_restart=True``, as the command line does). Checkpoints are taken at
optimizer-step boundaries only, so the saved accumulation phase is always 0 and a resumed run continues with
exactly the batches, weights and moments of an uninterrupted one.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np

from orion import compile_count, importance, quant
from orion._core import kernels
from orion.autodiff.partition import ANE, Plan, partition
from orion.autodiff.runner import WEIGHT_STRATEGIES, GradientRunner, NonFiniteGradient, planned_compiles
from orion.autodiff.trainable import TrainableModel
from orion.errors import OrionError
from orion.limits import FP16_MAX
from orion.lora.train import LoraSpec, LoraTrainable, modules_of
from orion.models import UnknownModel, family, family_of
from orion.models.gpt2.config import GPT2Config
from orion.models.llama.config import LlamaConfig
from orion.train import checkpoint, export, loss_scale, restart, schedule
from orion.train.data import BatchSampler, Dataset, eval_batches, open_data
from orion.train.errors import CheckpointError, TrainError
from orion.train.optim import AdamW, clip_coefficient, grad_norm

LOG_FILE, CHECKPOINT_DIR = "train.jsonl", "checkpoints"
DEFAULT_SEQ = 256  # tokens per window unless the model's context is shorter

SHAPES: dict[str, GPT2Config | LlamaConfig] = {
    "tiny-gpt2": GPT2Config(n_layer=2, n_head=2, n_embd=64, vocab_size=512, n_positions=1024),
    "tiny-llama": LlamaConfig(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, hidden_dim=192,
                              vocab_size=512, max_position_embeddings=1024),
    "gpt2": GPT2Config(),
    "stories110m": LlamaConfig.stories110m(),
}


@dataclass(frozen=True)
class TrainConfig:
    """What a run does. Everything but the bookkeeping fields (``eval_every``, ``checkpoint_every``, ``keep``)
    enters the config hash a resumed run must match."""

    steps: int = 100
    seq: int | None = None            # default min(256, the model's context)
    batch: int = 1
    accum: int = 1
    lr: float = 3e-4
    min_lr: float | None = None       # default lr / 10
    warmup: int | None = None         # default min(100, steps // 10)
    weight_decay: float = 0.1
    max_grad_norm: float = 1.0
    loss_scale: str | float = "dynamic"  # "dynamic", or a number for a static scale
    initial_scale: float = 1024.0     # the dynamic scale's start (4x the static 256 that cured fp16 underflow)
    growth_interval: int = 2000       # good steps before the dynamic scale doubles
    seed: int = 0                     # initial weights of a random shape (or of the LoRA A), and the batch sampler
    weights: str = "inputs"           # how updated weights reach the programs: "inputs", "patch", "recompile"
    prefer: str = "auto"              # the partitioner's placement ("auto", "ane", "cpu")
    eval_every: int = 100
    eval_batches: int = 4
    checkpoint_every: int = 100
    keep: int = 3
    lora: LoraSpec | None = None      # fine-tune only LoRA adapters of these targets (the base frozen)
    quant: str = "fp16"               # the frozen base's projections as orion.quant stores them (LoRA only: QLoRA)
    imatrix: str | None = None        # with quant lut4/lut6: the importance matrix file its LUTs are fitted by

    def __post_init__(self) -> None:
        for name in ("steps", "seq", "batch", "accum", "eval_every", "eval_batches", "checkpoint_every", "keep"):
            value = getattr(self, name)
            if name == "seq" and value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise TrainError(f"TrainConfig.{name}={value!r} must be an integer >= 1")
        if self.weights not in WEIGHT_STRATEGIES:
            raise TrainError(f"TrainConfig.weights={self.weights!r}. Fix: use one of {WEIGHT_STRATEGIES}")
        if not (isinstance(self.loss_scale, (int, float)) and self.loss_scale > 0) and self.loss_scale != "dynamic":
            raise TrainError(f"TrainConfig.loss_scale={self.loss_scale!r}: use 'dynamic' or a positive number")
        if self.warmup is not None and not 0 <= self.warmup < self.steps:
            raise TrainError(f"TrainConfig.warmup={self.warmup} must be in [0, steps={self.steps})")
        if self.lora is not None and not isinstance(self.lora, LoraSpec):
            raise TrainError(f"TrainConfig.lora={self.lora!r}: pass an orion.lora.train.LoraSpec "
                             "(LoraSpec.parse('r=16,alpha=32,targets=q,v'))")
        if self.quant not in quant.QUANT_MODES:
            raise TrainError(f"TrainConfig.quant={self.quant!r}: use one of {', '.join(quant.QUANT_MODES)}")
        if self.quant != "fp16" and self.lora is None:
            raise TrainError(f"TrainConfig.quant={self.quant!r} without lora: a full fine-tune of a {self.quant} base "
                             "would move every weight off its quantization grid, so it is refused. Fix: fine-tune "
                             "LoRA adapters over the frozen quantized base (--lora r=16,alpha=32,targets=q,v, as "
                             "QLoRA does), or train the fp16 model and quantize it after (quant= on load)")
        if self.imatrix is not None and self.quant not in quant.IMPORTANCE_MODES:
            raise TrainError(f"TrainConfig.imatrix={self.imatrix!r} with quant={self.quant!r}: only "
                             f"{', '.join(quant.IMPORTANCE_MODES)} use an importance matrix. Fix: pass one of them, "
                             "or no imatrix")

    @property
    def warmup_steps(self) -> int:
        return min(100, self.steps // 10) if self.warmup is None else self.warmup

    @property
    def tokens_per_step(self) -> int:
        return (self.seq or DEFAULT_SEQ) * self.batch * self.accum

    def hashed(self) -> dict[str, Any]:
        """The fields that change the trajectory (the config hash's part of this config)."""
        skip = {"eval_every", "checkpoint_every", "keep"}
        hashed = {k: v for k, v in dataclasses.asdict(self).items() if k not in skip}
        if hashed["lora"] is None:  # added later: unset, it leaves the hashes of earlier runs (and --resume) intact
            del hashed["lora"]
        if hashed["quant"] == "fp16":  # likewise
            del hashed["quant"]
        if hashed["imatrix"] is None:  # likewise; a file stands for its values
            del hashed["imatrix"]
        else:
            hashed["imatrix"] = importance.read(hashed["imatrix"]).digest
        return hashed


def quantized_base(model: TrainableModel, params: dict[str, np.ndarray], mode: str,
                   weighted: importance.Importance | None = None) -> dict[str, np.ndarray]:
    """``params`` with every layer's weight matrix replaced by the values ``mode`` stores it as
    (``orion.quant.quantize(...).dequantized()``, by the importance matrix ``weighted`` when given): the frozen
    base a QLoRA fine-tune trains its adapters against. Each matrix of the training layout is quantized on its
    own (Llama's query and output projections per query group, the slices inference quantizes them in). The
    training programs hold those values in fp16; the embedding, the norms and the CPU head stay as they are."""
    out = dict(params)
    for layer in range(model.n_layers):
        for name, shape in model.layer_shapes().items():
            key = model.layer_param(layer, name)
            if len(shape) == 2 and key in out:
                values = None if weighted is None else weighted.layers[layer][name]
                out[key] = quant.quantize(out[key], mode, key, importance=values).dequantized().astype(np.float32)
    return out


def base_importance(model: str | os.PathLike | GPT2Config | LlamaConfig, seed: int,
                    path: str | None) -> importance.Importance | None:
    """The importance matrix file ``path`` (None: none), checked against the weights of the base ``model`` (a
    directory, or a shape's or config's random weights from ``seed``) it must have been collected on."""
    if path is None:
        return None
    found = importance.read(path)
    base = _base_weights(model, seed)
    if base is None:
        raise TrainError(f"imatrix with the base {model!r}: a trainer checkpoint's weights are not those an "
                         "importance matrix is collected on. Fix: merge it into a model directory (python -m orion "
                         "lora merge) and collect one on that (python -m orion imatrix)")
    config, weights, _ = base
    found.check(config, weights)
    return found


def load_model(model: str | os.PathLike | GPT2Config | LlamaConfig, seed: int = 0
               ) -> tuple[TrainableModel, dict[str, np.ndarray], dict[str, Any]]:
    """``(trainable model, fp32 C-contiguous parameters, description)`` of a shape name (:data:`SHAPES`), a
    config of a registered model (random weights from ``seed``) or a Hugging Face directory of one (its
    weights): the model registry's family record says which trainable and which weights reader."""
    trainable, params, description = _load_model(model, seed)
    return trainable, {k: np.ascontiguousarray(v) for k, v in params.items()}, description


def _load_model(model: str | os.PathLike | GPT2Config | LlamaConfig, seed: int
                ) -> tuple[TrainableModel, dict[str, np.ndarray], dict[str, Any]]:
    base = _base_weights(model, seed)
    if base is None:
        return _checkpoint_model(_checkpoint_manifest(Path(model)))  # type: ignore[arg-type]
    config, weights, origin = base
    trainable = _trainable(config)
    return trainable, trainable.params(weights), {"config": _config_dict(config), "origin": origin}


def _base_weights(model: str | os.PathLike | GPT2Config | LlamaConfig, seed: int) -> tuple[Any, Any, str] | None:
    """``(config, weights as loaded, origin)`` of a shape name or config (random weights from ``seed``) or a model
    directory; None for a trainer checkpoint."""
    if isinstance(model, str) and model in SHAPES:
        config, origin = SHAPES[model], f"random {model}, seed {seed}"
    elif not isinstance(model, (str, os.PathLike)):
        config, origin = model, f"random, seed {seed}"
    else:
        path = Path(model)
        if _checkpoint_manifest(path) is not None:
            return None
        if not path.is_dir():
            raise TrainError(f"model {model!r} is neither a shape ({', '.join(SHAPES)}), a model config, a model "
                             "directory nor a trainer checkpoint. Fix: name a shape or pass a Hugging Face model "
                             "directory, a run directory or a ckpt-*.json")
        try:
            model_type = json.loads((path / "config.json").read_text()).get("model_type")
        except (OSError, json.JSONDecodeError) as exc:
            raise TrainError(f"{path / 'config.json'}: cannot read the model's config ({exc})") from exc
        try:
            config, weights = family(model_type, str(path / "config.json")).weights.load_hf(path)
        except UnknownModel as exc:
            raise TrainError(f"{exc}; the trainer trains every model type Orion runs") from None
        return config, weights, str(path.resolve())
    return config, _family(config).weights.random_weights(config, seed=seed), origin


def _is_model_directory(model: str | os.PathLike | GPT2Config | LlamaConfig) -> bool:
    """True for a Hugging Face model directory (pretrained weights), not a shape, config or trainer checkpoint."""
    if isinstance(model, (GPT2Config, LlamaConfig)) or (isinstance(model, str) and model in SHAPES):
        return False
    path = Path(model)
    return path.is_dir() and _checkpoint_manifest(path) is None


def _checkpoint_manifest(path: Path) -> Path | None:
    """The checkpoint ``path`` names: a ``ckpt-*.json``, or the newest valid one of a run or checkpoints
    directory (None: ``path`` is none of these)."""
    if path.is_file() and path.suffix == ".json" and path.name.startswith("ckpt-"):
        return path
    for directory in (path / CHECKPOINT_DIR, path):
        if path.is_dir() and checkpoint.checkpoints(directory):
            newest = checkpoint.latest_valid(directory)
            if newest is None:
                raise TrainError(f"{directory}: no checkpoint passes its checksums. Fix: name a valid ckpt-*.json")
            return newest
    return None


def _checkpoint_model(manifest: Path) -> tuple[TrainableModel, dict[str, np.ndarray], dict[str, Any]]:
    """The weights of a (full) trainer checkpoint of one of the :data:`SHAPES`, recognized by its parameters."""
    ckpt = checkpoint.load(manifest)
    params = {k.split("/", 1)[1]: v for k, v in ckpt.tensors.items() if k.startswith("param/")}
    for name, config in SHAPES.items():
        trainable = _trainable(config)
        layers = {trainable.layer_param(i, n): s for i in range(trainable.n_layers)
                  for n, s in trainable.layer_shapes().items()}
        if all(k in params and params[k].shape == s for k, s in layers.items()):
            try:
                weights = trainable.weights(params)
                weights.validate(config)
            except (KeyError, OrionError) as exc:
                raise TrainError(f"checkpoint {manifest}: its layers are {name}'s but not the rest ({exc}). Fix: "
                                 "pass a full (not LoRA) trainer checkpoint") from None
            return trainable, trainable.params(weights), {"config": _config_dict(config),
                                                          "origin": f"{manifest.resolve()} (step {ckpt.step})"}
    raise TrainError(f"checkpoint {manifest}: its parameters match none of the shapes {', '.join(SHAPES)} (a LoRA run's "
                     "checkpoint holds only adapters). Fix: pass a full trainer checkpoint of one of those shapes")


def _trainable(config: Any) -> TrainableModel:
    """The registered family's trainable of ``config``."""
    return _family(config).trainable(config)


def _family(config: Any) -> Any:
    """The registered family of ``config`` (a TrainError for none)."""
    try:
        return family_of(config)
    except UnknownModel as exc:
        raise TrainError(f"model {config!r}: {exc}") from None


def _config_dict(config: GPT2Config | LlamaConfig) -> dict[str, Any]:
    return {"class": type(config).__name__, **dataclasses.asdict(config)}


class Trainer:
    """Trains ``model`` (see :func:`load_model`) on ``data`` (a :class:`Dataset` or a path for
    :func:`open_dataset`), writing the log and checkpoints under ``out_dir``.

    ``config`` (or keyword overrides of :class:`TrainConfig` fields) says what to do; ``resume=True``
    continues from the newest valid checkpoint in ``out_dir`` (a fresh start if there is none);
    ``exec_restart=True`` lets the run checkpoint and re-exec itself when compiling its programs would cross
    the compile budget's threshold (:mod:`orion.train.restart`; for command-line runs). ``data_options``
    (``train_on_prompt``, ``max_examples``, ``val_examples``) go to :func:`orion.train.data.open_data`.
    """

    def __init__(self, model: str | os.PathLike | GPT2Config | LlamaConfig, data: Dataset | str | os.PathLike,
                 out_dir: str | os.PathLike, config: TrainConfig | None = None, *, resume: bool = False,
                 quiet: bool = False, exec_restart: bool = False, from_scratch: bool = False,
                 data_options: Mapping[str, Any] | None = None,
                 **overrides: Any) -> None:
        try:
            self.config = dataclasses.replace(config or TrainConfig(), **overrides)
        except TypeError as exc:
            raise TrainError(f"Trainer: {exc}. Fix: pass only TrainConfig fields "
                             f"({', '.join(f.name for f in dataclasses.fields(TrainConfig))})") from None
        cfg = self.config
        self.model, self.params, model_description = load_model(model, cfg.seed)
        self.base_dir = Path(model) if _is_model_directory(model) else None  # type: ignore[arg-type]
        # a fine-tune of pretrained weights (a model directory) must start from a sane loss; shapes start at random
        self.check_base = not from_scratch and self.base_dir is not None
        if cfg.lora is not None:  # the base becomes frozen; the parameters are the adapters alone
            if cfg.quant != "fp16":
                self.params = quantized_base(self.model, self.params, cfg.quant,
                                             base_importance(model, cfg.seed, cfg.imatrix))
            self.model = LoraTrainable(self.model, self.params, cfg.lora, modules_of(self.model, cfg.lora.targets))
            self.params = self.model.init_params(cfg.seed)
        if cfg.seq is None:
            self.config = cfg = dataclasses.replace(cfg, seq=min(DEFAULT_SEQ, self.model.context))
        if cfg.seq > self.model.context:
            raise TrainError(f"seq={cfg.seq} exceeds the model's context of {self.model.context} "
                             "positions. Fix: pass a shorter seq")
        model_dir = Path(model) if isinstance(model, (str, os.PathLike)) and (Path(model) / "config.json").is_file() \
            else None
        self.data = data if isinstance(data, Dataset) else open_data(data, vocab_size=self.model.vocab_size,
                                                                     model_dir=model_dir, seq=cfg.seq,
                                                                     **(data_options or {}))
        _check_vocabulary(self.data, self.model.vocab_size)
        self.out_dir, self.quiet, self.exec_restart = Path(out_dir), quiet, exec_restart
        self.checkpoint_dir, self.log_path = self.out_dir / CHECKPOINT_DIR, self.out_dir / LOG_FILE
        self.sampler = BatchSampler(self.data.train, cfg.seq, cfg.batch, seed=cfg.seed)
        next(eval_batches(self.data.val, cfg.seq, 1, self.data.eval_windows(cfg.eval_batches)))  # too short: fail now
        self.optimizer = AdamW(self.params, lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay)
        self.schedule = schedule.WarmupCosine(cfg.lr, cfg.warmup_steps, cfg.steps,
                                              cfg.lr / 10 if cfg.min_lr is None else cfg.min_lr)
        self.scaler: loss_scale.LossScale = (
            loss_scale.DynamicLossScale(scale=cfg.initial_scale, growth_interval=cfg.growth_interval)
            if cfg.loss_scale == "dynamic" else loss_scale.StaticLossScale(float(cfg.loss_scale)))
        data_description = {"layout": self.data.layout, "train": self.data.train.sources, "val": self.data.val.sources,
                            "tokens": [self.data.train.num_tokens, self.data.val.num_tokens],
                            **({"report": self.data.meta["report"], "train_on_prompt": self.data.meta["train_on_prompt"]}
                               if self.data.layout == "examples" else {})}
        self.config_hash = checkpoint.config_hash({"model": model_description, "data": data_description,
                                                   "train": cfg.hashed()})
        self.step = 0
        self.clamps_total = 0
        self.resumed_from: Path | None = None
        self.runner: GradientRunner | None = None
        self.plan: Plan | None = None
        self._log: IO[str] | None = None
        self._resume, self._started, self._resume_logged, self._pending_note = resume, False, False, ""
        self._checkpointed_step: int | None = None  # the step of the last checkpoint this process wrote
        # the layer weights' fp16 program inputs (clamped to fp16's range: _fp16_clamps values), rewritten by AdamW
        # with each update; None until _program_params first writes them, and again whenever self.params are set
        self._fp16: dict[str, np.ndarray] | None = None
        self._fp16_clamps = 0
        self._grads: dict[str, np.ndarray] = {}  # the step's summed gradients, reused by the next step

    # -- the run ---------------------------------------------------------------------------------------

    def train(self) -> list[dict[str, Any]]:
        """Runs (or continues) the run to ``config.steps``; returns every step's log record of the run."""
        cfg = self.config
        self._start()
        started, first_step = time.perf_counter(), self.step
        try:
            if self.step == 0 and (cfg.lora is not None or self.check_base):  # LoRA's B = 0: the base's loss
                self._base_loss(self.validation_loss())
            while self.step < cfg.steps:
                record = self.train_step()
                if self.step % cfg.eval_every == 0 or self.step == cfg.steps:
                    self._write({"event": "eval", "step": self.step, "val_loss": self.validation_loss()})
                if self.step % cfg.checkpoint_every == 0 or self.step == cfg.steps:
                    self.save_checkpoint()
                self._progress(record, started, first_step)
        finally:
            if not self.quiet and self.step > first_step:
                print(file=sys.stderr)
            self._close_log()
        return [r for r in read_log(self.log_path) if r.get("event") == "step"]

    def train_step(self) -> dict[str, Any]:
        """One optimizer step (or a skipped one), logged; no validation or checkpoint (:meth:`train` adds them).
        Restarts the process first (checkpoint, exec) if the step's compiles would cross the budget's threshold."""
        if self._log is None:
            self._start()
        record = self._train_step(self._ensure_runner(updates=1))
        self._write(record)
        return record

    def _train_step(self, runner: GradientRunner) -> dict[str, Any]:
        cfg = self.config
        began = time.perf_counter()
        lr, scale = schedule.current_lr(self.schedule), self.scaler.scale
        batches = [self.sampler.next_batch() for _ in range(cfg.accum)]  # every step consumes accum batches
        program_params, clamps = self._program_params()
        total: dict[str, np.ndarray] | None = None
        losses: list[float] = []
        overflow = None
        pairs = ((i, t) for inputs, outputs in batches for i, t in zip(inputs, outputs, strict=True))
        for window, (ids, targets) in enumerate(pairs):
            try:  # the gradients summed in place, in the arrays of the last step (no new memory to fault in)
                loss, total = runner.loss_and_grads(program_params, ids, targets, loss_scale=scale,
                                                    into=self._grads, add=window > 0)
            except NonFiniteGradient as exc:
                overflow = str(exc)
                break
            losses.append(loss)
        stats = grad_norm(total) if overflow is None else None
        nonfinite = 1 if overflow is not None else stats.nonfinite
        applied = self.scaler.update(nonfinite)
        windows = cfg.batch * cfg.accum
        record: dict[str, Any] = {"event": "step", "step": self.step + 1, "loss": None, "grad_norm": None,
                                  "loss_scale": scale, "skipped": not applied,
                                  "skipped_steps": self.scaler.skipped_steps, "clamps": clamps,
                                  "clamps_total": self.clamps_total + clamps, "lr": None}
        if applied:
            norm = stats.norm / windows
            coefficient = clip_coefficient(norm, cfg.max_grad_norm)
            clamped = self.optimizer.step(total, lr=schedule.advance(self.schedule), grad_scale=coefficient / windows,
                                          halves=self._fp16)
            if self._fp16 is not None:
                self._fp16_clamps = clamped
            if runner.rebakes:  # baked weights follow the step ("patch", "recompile")
                runner.update(self._program_params()[0])
            record.update(loss=float(np.mean(losses)), grad_norm=norm, lr=lr)
        else:
            record["nonfinite"] = overflow or f"{stats.nonfinite} non-finite gradient values"
        self.step += 1
        self.clamps_total += clamps
        seconds = time.perf_counter() - began
        record.update(ms=seconds * 1e3, tokens_per_s=cfg.tokens_per_step / seconds, compiles=compile_count())
        return record

    def _program_params(self) -> tuple[dict[str, np.ndarray], int]:
        """The parameters as the programs get them: layer weights entering fp16 (ANE) programs clamped to
        +-FP16_MAX in a copy (the master weights stay as they are), with the number of values clamped. When every
        program is fp16 and takes the weights as inputs, those copies are the fp16 ones AdamW writes in its pass
        (:attr:`_fp16`), so no step converts or range-checks the weights again."""
        if self.plan is None or not any(p.device == ANE for p in self.plan.programs):
            return self.params, 0
        fp16 = self.config.weights == "inputs" and all(p.device == ANE for p in self.plan.programs)
        if fp16 and self._fp16 is not None:
            return {**self.params, **self._fp16}, self._fp16_clamps
        out, clamped = dict(self.params), 0
        for key in self._layer_keys():
            p = self.params[key]
            if p.max() > FP16_MAX or p.min() < -FP16_MAX:
                out[key] = p.copy()
                clamped += loss_scale.clamp_to_fp16(out[key], key).clamped
        if fp16:  # written once here; AdamW rewrites them with every update
            self._fp16 = {key: _as_fp16(out[key]) for key in self._layer_keys()}
            self._fp16_clamps = clamped
            return {**self.params, **self._fp16}, clamped
        return out, clamped

    def _layer_keys(self) -> list[str]:
        """The trained layer parameters (a frozen LoRA base weight is baked, and range-checked, by the runner)."""
        return [key for i in range(self.model.n_layers) for name in self.model.layer_shapes()
                if (key := self.model.layer_param(i, name)) in self.params]

    def validation_loss(self) -> float | None:
        """Mean loss per trained token over the fixed validation windows (``config.eval_batches`` of them, or every
        validation example); None if a forward activation overflowed fp16."""
        runner = self._ensure_runner()
        losses, counts = [], []
        windows = self.data.eval_windows(self.config.eval_batches)
        for inputs, targets in eval_batches(self.data.val, self.config.seq, 1, windows):
            try:
                losses.append(runner.loss(self.params, inputs[0], targets[0]))
            except NonFiniteGradient:
                return None
            counts.append(int((targets[0] >= 0).sum()))
        return float(np.average(losses, weights=counts))

    def _base_loss(self, loss: float | None) -> None:
        """Logs and shows the base model's validation loss before the first step. Above log(vocabulary size),
        the loss of guessing uniformly, no pretrained model is: its weights or the data's tokens are wrong, and
        a fine-tune of a model directory stops there (``from_scratch=True`` / ``--from-scratch`` says it is meant)."""
        self._write({"event": "eval", "step": 0, "val_loss": loss})
        uniform = float(np.log(self.model.vocab_size))
        shown = "overflowed fp16" if loss is None else f"{loss:.4f} (perplexity {np.exp(min(loss, 700.0)):.4g})"
        if not self.quiet:
            print(f"base model: validation loss {shown} over {self.config.eval_batches} windows of {self.config.seq} "
                  f"tokens; uniform guessing gives {uniform:.4f}", file=sys.stderr)
        if self.check_base and (loss is None or loss > uniform):
            raise TrainError(f"the base model's validation loss {shown} is above log(vocabulary size) = {uniform:.4f}, "
                             "the loss of guessing uniformly; a pretrained model never starts there. Its weights or the "
                             "data are wrong: check that the data was prepared with this model's tokenizer. Fix: "
                             "re-prepare the data with --tokenizer MODEL_DIR/tokenizer.json, or pass from_scratch=True "
                             "(--from-scratch) if the weights are meant to be untrained")

    # -- compilation, checkpoints and resume -----------------------------------------------------------

    def _ensure_runner(self, updates: int = 0) -> GradientRunner:
        """Plans and compiles the programs (once). If that and ``updates`` weight updates would take the process
        past the compile budget's threshold, checkpoints and restarts it first."""
        weights = self.config.weights
        # LoRA: gradients for the adapters only, the frozen base baked per layer (under any weights strategy)
        options = self.model.runner_options() if isinstance(self.model, LoraTrainable) else {}
        if self.plan is None:
            self.plan = partition(self.model, self.config.seq, prefer=self.config.prefer,
                                  trainable=options.get("trainable"))
        build, per_update = planned_compiles(self.plan, self.model, weights, options.get("baked"),
                                             options.get("trainable"))
        compiles = (build if self.runner is None else 0) + updates * per_update
        if restart.needs_restart(compiles):
            if compile_count() == 0:
                raise TrainError(f"this run's {compiles} compiles (building its programs and updating weights="
                                 f"{weights!r}) would cross the compile threshold of {restart.compile_threshold()} "
                                 "even in a fresh process. Fix: raise ORION_COMPILE_BUDGET or use weights='inputs'")
            if not self.exec_restart:
                raise TrainError(f"compiling {compiles} more programs would take the process past the compile "
                                 f"threshold ({compile_count()} compiled, threshold {restart.compile_threshold()}). "
                                 "Fix: pass exec_restart=True (the command line does) or start the run in a fresh "
                                 "process")
            if self._checkpointed_step != self.step:  # the step's own checkpoint may just have been written
                self.save_checkpoint()
            restart.exec_restart([f for f in (self._log,) if f is not None])
        if self.runner is None:
            baking = {"params": self._program_params()[0]} if weights != "inputs" else {}
            self.runner = GradientRunner(self.model, self.config.seq, plan=self.plan, weights=weights,
                                         **(baking | options))
        return self.runner

    def _start(self) -> None:
        """Loads the checkpoint to resume from (or refuses to overwrite a run) once, trims the log to the
        current step and opens it."""
        self._close_log()
        if not self._started:
            found = checkpoint.checkpoints(self.checkpoint_dir)
            if found and not self._resume:
                raise TrainError(f"{self.checkpoint_dir} already holds checkpoints (newest {found[-1].name}). Fix: "
                                 "resume (resume=True / --resume) or choose another output directory")
            if self._resume and found:
                try:
                    self.load_checkpoint(checkpoint.load(found[-1], self.config_hash))
                except CheckpointError as damaged:
                    if damaged.previous is None:
                        raise
                    self.load_checkpoint(checkpoint.load(damaged.previous, self.config_hash))
                    self._pending_note = str(damaged)
            self._started = True
        try:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            _rewrite(self.log_path, [r for r in read_log(self.log_path) if r.get("step", 0) <= self.step])
            self._log = open(self.log_path, "a", buffering=1)
        except OSError as exc:
            raise TrainError(f"cannot write the run's log {self.log_path} ({exc}). Fix: make {self.out_dir} a "
                             f"writable directory and {LOG_FILE} in it a file") from None
        if self._pending_note:
            self._note(self._pending_note)
            self._pending_note = ""
        if self.resumed_from is not None and not self._resume_logged:
            self._write({"event": "resume", "step": self.step, "checkpoint": self.resumed_from.name})
            self._resume_logged = True

    def checkpoint_state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """The full training state: ``(tensors, JSON state)`` as :func:`checkpoint.save` takes them."""
        opt = self.optimizer.state_dict()
        tensors = {f"param/{n}": p for n, p in self.params.items()}
        tensors.update({f"exp_avg/{n}": a for n, a in opt["exp_avg"].items()})
        tensors.update({f"exp_avg_sq/{n}": a for n, a in opt["exp_avg_sq"].items()})
        state = {"step": self.step, "optimizer": {"step": opt["step"], "hyper": opt["hyper"]},
                 "schedule": schedule.state_dict(self.schedule), "sampler": self.sampler.state_dict(),
                 "accumulation_phase": 0, "loss_scale": loss_scale.state_dict(self.scaler),
                 "clamps_total": self.clamps_total}
        return tensors, state

    def save_model(self, path: str | os.PathLike, dtype: str = "float32") -> Path:
        """The trained model as a Hugging Face directory at ``path`` (:func:`orion.train.export.save_model`): the
        weights in ``dtype``, with the base directory's tokenizer and settings, else the token data's tokenizer."""
        if self.config.lora is not None:
            raise TrainError("a LoRA run's parameters are its adapters: write them with model.save_peft, or merge "
                             "them into the base with python -m orion lora merge")
        return export.save_model(self.model, self.params, path, base_dir=self.base_dir,
                                 tokenizer_file=self.data.tokenizer_file, dtype=dtype)

    def save_checkpoint(self) -> Path:
        """Writes the full state at the current step (atomically; the newest ``config.keep`` are kept)."""
        tensors, state = self.checkpoint_state()
        path = checkpoint.save(self.checkpoint_dir, self.step, tensors, state, self.config_hash, keep=self.config.keep)
        self._checkpointed_step = self.step
        self._write({"event": "checkpoint", "step": self.step, "path": path.name})
        return path

    def load_checkpoint(self, ckpt: checkpoint.Checkpoint) -> None:
        """Restores the state a checkpoint holds (weights copied into the master weights in place). A state
        this trainer cannot restore is a damaged checkpoint (CheckpointError offering the previous one)."""
        try:
            self._restore(ckpt)
        except (KeyError, TypeError, ValueError, AttributeError, IndexError, OverflowError, TrainError) as exc:
            raise checkpoint.damaged(ckpt.path, f"its training state cannot be restored ({type(exc).__name__}: "
                                     f"{exc})", self.config_hash) from None

    def _restore(self, ckpt: checkpoint.Checkpoint) -> None:
        state, tensors = ckpt.state, ckpt.tensors
        names = set(self.params)
        for kind in ("param", "exp_avg", "exp_avg_sq"):
            have = {k.split("/", 1)[1] for k in tensors if k.startswith(f"{kind}/")}
            if have != names:
                raise ValueError(f"its {kind} tensors do not match this model's parameters (missing "
                                 f"{sorted(names - have)[:4]}, extra {sorted(have - names)[:4]})")
        for name, p in self.params.items():
            np.copyto(p, tensors[f"param/{name}"])
        self._fp16 = None  # the master weights changed: their fp16 copies are written again
        self.optimizer.load_state_dict({**state["optimizer"],
                                        "exp_avg": {n: tensors[f"exp_avg/{n}"] for n in names},
                                        "exp_avg_sq": {n: tensors[f"exp_avg_sq/{n}"] for n in names}})
        self.schedule = schedule.from_state_dict(state["schedule"])
        self.sampler.load_state_dict(state["sampler"])
        self.scaler = loss_scale.from_state_dict(state["loss_scale"])
        if state["accumulation_phase"] != 0:
            raise ValueError(f"accumulation phase {state['accumulation_phase']}; this trainer checkpoints at "
                             "optimizer-step boundaries only (phase 0)")
        if state["step"] != ckpt.step or not (isinstance(state["clamps_total"], int) and state["clamps_total"] >= 0):
            raise ValueError(f"its state's step {state['step']!r} is not the manifest's {ckpt.step}, or its "
                             f"clamps_total {state['clamps_total']!r} is no count")
        self.step, self.clamps_total = ckpt.step, state["clamps_total"]
        self.resumed_from = ckpt.path

    # -- the log and the display -----------------------------------------------------------------------

    def log_event(self, record: Mapping[str, Any]) -> None:
        """Appends a record (e.g. the CLI's note about the loss-curve figure) to the run's JSONL log."""
        opened = self._log is None
        if opened:
            self._log = open(self.log_path, "a", buffering=1)
        try:
            self._write({"step": self.step, **record})
        finally:
            if opened:
                self._close_log()

    def _write(self, record: Mapping[str, Any]) -> None:
        if self._log is not None:
            self._log.write(json.dumps(record, allow_nan=True) + "\n")

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    def _note(self, message: str) -> None:
        self._write({"event": "note", "step": self.step, "message": message})
        if not self.quiet:
            print(f"note: {message}", file=sys.stderr)

    def _progress(self, record: Mapping[str, Any], started: float, first_step: int) -> None:
        if self.quiet:
            return
        done, total = self.step, self.config.steps
        per_step = (time.perf_counter() - started) / max(done - first_step, 1)
        eta = int(per_step * (total - done))
        loss = "skipped" if record["loss"] is None else f"{record['loss']:.4f}"
        line = (f"\rstep {done}/{total} loss {loss} | {record['tokens_per_s']:,.0f} tok/s {record['ms']:.0f} ms/step "
                f"| scale {record['loss_scale']:g} skipped {record['skipped_steps']} | ETA {eta // 3600}:"
                f"{eta // 60 % 60:02d}:{eta % 60:02d}")
        sys.stderr.write(line.ljust(100))
        sys.stderr.flush()


def _as_fp16(a: np.ndarray) -> np.ndarray:
    """A float32 array rounded to fp16 (ties to even, as numpy and the program input surfaces), on every core."""
    out = np.empty(a.shape, np.float16)
    kernels.to_fp16(np.ascontiguousarray(a), out)
    return out


def read_log(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The records of a run's JSONL log; a torn last line (a kill mid-write) is dropped. Raises TrainError
    naming the line if another one is not a record this trainer writes."""
    try:
        lines = Path(path).read_bytes().splitlines()
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise TrainError(f"cannot read the run's log {path} ({exc}). Fix: make it a readable file") from None
    records = []
    for number, line in enumerate(lines, 1):
        problem = _log_record(line, records)
        if problem and number < len(lines):
            raise TrainError(f"the run's log {path} is damaged at line {number}: {problem}. Fix: delete that line "
                             "(or move the log aside); the checkpoints do not depend on it")
    return records


def _log_record(line: bytes, records: list[dict[str, Any]]) -> str:
    """Appends the record ``line`` holds to ``records``; returns what is wrong with it instead, if anything."""
    try:
        record = json.loads(line.decode())
    except (ValueError, RecursionError) as exc:  # not UTF-8, not JSON, nested too deep, a 5,000-digit number
        return f"not a JSON record ({type(exc).__name__}: {str(exc)[:200]})"
    if not isinstance(record, dict):
        return "not a JSON object"
    checks = {"step": _is_int, "event": lambda v: isinstance(v, str)}
    for name, check in checks.items():
        if name in record and not check(record[name]):
            return f"its {name!r} is {json.dumps(record[name])[:80]}"
    for name, check in _EVENT_FIELDS.get(record.get("event"), {}).items():  # what the summary and the plot read
        if not check(record.get(name, ...)):
            return f"its {name!r} is {json.dumps(record.get(name, 'missing'))[:80]}"
    records.append(record)
    return ""


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


_EVENT_FIELDS: dict[str, dict[str, Any]] = {
    "step": {"loss": lambda v: v is None or _is_number(v), "ms": _is_number, "skipped": lambda v: isinstance(v, bool)},
    "eval": {"val_loss": lambda v: v is None or _is_number(v)},
}


def _rewrite(path: Path, records: list[dict[str, Any]]) -> None:
    tmp = path.with_name(f".tmp-{os.getpid()}-{path.name}")
    with open(tmp, "w") as f:
        f.writelines(json.dumps(r, allow_nan=True) + "\n" for r in records)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _check_vocabulary(data: Dataset, vocab_size: int) -> None:
    for split in (data.train, data.val):
        for array, source in zip(split.arrays, split.sources or ["?"] * len(split.arrays), strict=True):
            top = int(array.max())
            if top >= vocab_size:
                raise TrainError(f"{source}: token id {top} is outside the model's vocabulary of {vocab_size}. Fix: "
                                 "tokenize the data with the model's tokenizer (or a vocabulary that fits)")


def loss_summary(records: list[dict[str, Any]]) -> dict[str, Any]:
    """First, last and minimum loss, skipped (non-finite) steps and mean ms/step of a run's step records."""
    losses = [r["loss"] for r in records if r["loss"] is not None]  # a non-finite step is skipped, loss None
    return {"steps": len(records), "first_loss": losses[0] if losses else None,
            "last_loss": losses[-1] if losses else None, "min_loss": min(losses) if losses else None,
            "skipped": sum(r["skipped"] for r in records),
            "ms_per_step": float(np.mean([r["ms"] for r in records])) if records else None}
