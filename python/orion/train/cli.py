"""``python -m orion train --model (stories110m|gpt2|tiny-gpt2|tiny-llama|DIR|CHECKPOINT) --data (DIR|FILE|stdlib)
--steps N --out RUN_DIR [--lora r=16,alpha=32,targets=q,v] [...]``: train with :class:`orion.train.trainer.Trainer`.

``--data`` may also be chat or instruction examples (a ``.jsonl`` file, or a directory with ``train.jsonl`` and
``valid.jsonl``; see :mod:`orion.train.examples`): rendered with the model's chat template, trained on the
assistant turns only unless ``--train-on-prompt``. The run's first line prints every setting, marking the
defaults; the last line gives the validation loss and perplexity over trained tokens.

``--lora`` fine-tunes only LoRA adapters over the frozen base (:mod:`orion.lora.train`): the checkpoints hold the
adapters and the run state, and the run ends by writing ``RUN_DIR/adapter`` in PEFT's format. A full run ends by
writing ``RUN_DIR/model``, the trained model as a Hugging Face directory (:mod:`orion.train.export`) that
``generate``, ``serve``, ``orion.models.load`` and transformers read.

``--data stdlib`` tokenizes the built-in standard-library corpus on first use into ``RUN_DIR/data`` (with the
model directory's ``tokenizer.json`` if it has one, else a byte-level BPE of the model's vocabulary size,
trained on the text) and reuses it afterwards. At the end a loss-curve PNG (``RUN_DIR/loss.png``) is written
when matplotlib is installed; otherwise the log and the terminal say that no figure was written and why.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

from orion.cli import positive_int, report_errors
from orion.lora.adapter import AdapterError
from orion.lora.train import LoraSpec
from orion.models.weights_io import SAVE_DTYPES
from orion.quant import QUANT_MODES
from orion.train.data import eval_batches
from orion.train.errors import TrainError
from orion.train.examples import ExampleSplit, describe
from orion.train.trainer import SHAPES, WEIGHT_STRATEGIES, TrainConfig, Trainer, loss_summary, read_log

STDLIB = "stdlib"
DATA_SUBDIR, PLOT_FILE, ADAPTER_SUBDIR, MODEL_SUBDIR = "data", "loss.png", "adapter", "model"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m orion train",
                                description="Train a model of any family Orion runs (GPT-2, Llama, Mistral, Qwen2) on "
                                            "token data.")
    p.add_argument("--model", required=True, help=f"a shape ({', '.join(SHAPES)}; random weights), a Hugging "
                   "Face model directory of any family Orion runs (its weights), or a trainer checkpoint of a shape "
                   "(a run directory or ckpt-*.json: its weights)")
    p.add_argument("--data", required=True, help="chat/instruction examples (a .jsonl of {\"messages\"}, {\"prompt\", "
                   "\"completion\"} or {\"text\"} lines, or a directory with train.jsonl and valid.jsonl), a token "
                   "directory (data prepare's, nanoGPT train.bin/val.bin or llama2.c shards), one .bin file, or "
                   "'stdlib' (the built-in corpus, prepared on first use)")
    p.add_argument("--out", required=True, help="run directory: train.jsonl, checkpoints/, loss.png")
    p.add_argument("--steps", type=positive_int, required=True, help="optimizer steps")
    p.add_argument("--seq", type=positive_int, default=None, help="tokens per window; one example per window for "
                   "examples, cut to it (default: the smaller of 256 and the model's context)")
    p.add_argument("--train-on-prompt", action="store_true", help="examples: train on every token, not only on the "
                   "assistant turns or the completion")
    p.add_argument("--max-examples", type=positive_int, default=None, help="examples: use the first N training "
                   "examples (default all)")
    p.add_argument("--val-examples", type=positive_int, default=None, help="examples: evaluate on the first N "
                   "validation examples (default all)")
    p.add_argument("--batch", type=positive_int, default=1, help="windows per micro-batch (default 1)")
    p.add_argument("--accum", type=positive_int, default=1, help="micro-batches per optimizer step (default 1)")
    p.add_argument("--lr", type=float, default=3e-4, help="peak learning rate (default 3e-4)")
    p.add_argument("--min-lr", type=float, default=None, help="final learning rate (default lr/10)")
    p.add_argument("--warmup", type=int, default=None, help="warmup steps (default min(100, steps/10))")
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--max-grad-norm", type=float, default=1.0)
    p.add_argument("--loss-scale", type=_loss_scale, default="dynamic",
                   help="'dynamic' (default) or a number (static)")
    p.add_argument("--seed", type=int, default=0, help="initial weights of a shape, and the batch order")
    p.add_argument("--prefer", choices=("auto", "ane", "cpu"), default="auto",
                   help="where the partitioner puts the layer programs (default auto: where they pay)")
    p.add_argument("--weights", choices=WEIGHT_STRATEGIES, default="inputs",
                   help="how updated weights reach the programs: inputs (default; no compile per step), patch "
                   "(baked, weight files swapped: no compile per step) or recompile (baked, compiled every step; "
                   "the run exec-restarts before the compile budget)")
    p.add_argument("--eval-every", type=positive_int, default=100)
    p.add_argument("--eval-batches", type=positive_int, default=4)
    p.add_argument("--checkpoint-every", type=positive_int, default=100)
    p.add_argument("--keep", type=positive_int, default=3, help="checkpoints kept (default 3)")
    p.add_argument("--data-bytes", type=positive_int, default=8_000_000,
                   help="with --data stdlib: how much of the corpus to tokenize (default 8 MB)")
    p.add_argument("--lora", type=_lora_spec, default=None, metavar="r=R,alpha=A,targets=T[,T...][,dropout=0]",
                   help="fine-tune LoRA adapters only (targets: q,k,v,o,gate,up,down or PEFT module names such as "
                   "c_attn, c_proj, c_fc; on GPT-2 q/k/v all mean c_attn); writes RUN_DIR/adapter (PEFT format)")
    p.add_argument("--quant", choices=QUANT_MODES, default="fp16",
                   help="with --lora: the frozen base's layer weights as orion.quant stores them (int8, lut4, lut6, "
                        "int4), the adapters trained against those values as QLoRA does; a full fine-tune of a "
                        "quantized base is refused")
    p.add_argument("--imatrix", default=None, metavar="PATH",
                   help="with --quant lut4/lut6: an importance matrix of the base (python -m orion imatrix) that its "
                        "LUTs are fitted by")
    p.add_argument("--save-dtype", choices=list(SAVE_DTYPES), default="float32",
                   help="a full run ends by writing RUN_DIR/model, a Hugging Face directory of the trained weights in "
                        "this dtype (default float32: the master weights exactly)")
    p.add_argument("--resume", action="store_true", help="continue from the newest valid checkpoint in --out")
    p.add_argument("--from-scratch", action="store_true",
                   help="train a model directory whose weights are meant to be untrained (without it, a fine-tune "
                        "whose base validation loss is above log(vocabulary size) stops before the first step)")
    p.add_argument("--quiet", action="store_true", help="no progress line")
    return p


def main(argv: list[str] | None = None) -> int:
    """Runs ``python -m orion train`` with ``argv`` (default ``sys.argv[1:]``); returns the exit status."""
    argv = sys.argv[1:] if argv is None else argv
    p = parser()
    args = p.parse_args(argv)
    given = {a.dest for a in p._actions if any(arg.split("=", 1)[0] in a.option_strings for arg in argv)}
    return report_errors(lambda: _train(args, given))


def _train(args: argparse.Namespace, given: set[str] | None = None) -> int:
    config = TrainConfig(steps=args.steps, seq=args.seq, batch=args.batch, accum=args.accum, lr=args.lr,
                         min_lr=args.min_lr, warmup=args.warmup, weight_decay=args.weight_decay,
                         max_grad_norm=args.max_grad_norm, loss_scale=args.loss_scale, seed=args.seed,
                         prefer=args.prefer, weights=args.weights, eval_every=args.eval_every,
                         eval_batches=args.eval_batches, checkpoint_every=args.checkpoint_every, keep=args.keep,
                         lora=args.lora, quant=args.quant, imatrix=args.imatrix)
    out = Path(args.out)
    data = _stdlib_data(args.model, out, args.data_bytes, args.quiet) if args.data == STDLIB else args.data
    data_options = {"train_on_prompt": args.train_on_prompt, "max_examples": args.max_examples,
                    "val_examples": args.val_examples}
    trainer = Trainer(args.model, data, out, config, resume=args.resume, quiet=args.quiet, exec_restart=True,
                      from_scratch=args.from_scratch, data_options={k: v for k, v in data_options.items() if v})
    if not args.quiet:
        print(_settings_line(args, trainer, given or set()), file=sys.stderr)
        for split in (trainer.data.train, trainer.data.val):
            if isinstance(split, ExampleSplit):
                print(f"data {describe(split)}", file=sys.stderr)
    records = trainer.train()
    summary = loss_summary(records)
    vals = [r["val_loss"] for r in read_log(trainer.log_path) if r.get("event") == "eval"]
    val = vals[-1] if vals else None
    trained = sum(int((t >= 0).sum()) for _, t in eval_batches(
        trainer.data.val, trainer.config.seq, 1, trainer.data.eval_windows(trainer.config.eval_batches)))
    print(f"{out}: {summary['steps']} steps, loss {_fmt(summary['first_loss'])} -> {_fmt(summary['last_loss'])} "
          f"(min {_fmt(summary['min_loss'])}), validation loss {_fmt(val)} perplexity "
          f"{'n/a' if val is None else f'{math.exp(min(val, 700)):.2f}'} over {trained:,} trained tokens, "
          f"{summary['skipped']} skipped, {summary['ms_per_step']:.0f} ms/step")
    if args.lora is not None:
        adapter = out / ADAPTER_SUBDIR
        trainer.model.save_peft(str(adapter), trainer.params, base_name=str(args.model))
        trainer.log_event({"event": "adapter", "path": ADAPTER_SUBDIR})
        print(f"{adapter}: the LoRA adapter (PEFT format; load it with model.load_adapter or peft)")
    else:
        model = trainer.save_model(out / MODEL_SUBDIR, args.save_dtype)
        trainer.log_event({"event": "model", "path": MODEL_SUBDIR, "dtype": args.save_dtype})
        tokenizer = "" if (model / "tokenizer.json").is_file() else \
            " (no tokenizer: the token data names none; copy the one its ids came from into it)"
        print(f"{model}: the trained model, a Hugging Face directory{tokenizer} "
              f"(python -m orion generate --model {model}; transformers reads it too)")
    _plot(trainer, records)
    return 0


def _settings_line(args: argparse.Namespace, trainer: Trainer, given: set[str]) -> str:
    """Every setting of the run once, the defaults marked (the seq default resolved against the model)."""
    cfg = trainer.config
    shown = {"model": args.model, "data": f"{args.data} ({trainer.data.layout})", "steps": cfg.steps, "seq": cfg.seq,
             "batch": cfg.batch, "accum": cfg.accum, "lr": cfg.lr, "min_lr": cfg.lr / 10 if cfg.min_lr is None else
             cfg.min_lr, "warmup": cfg.warmup_steps, "weight_decay": cfg.weight_decay,
             "max_grad_norm": cfg.max_grad_norm, "loss_scale": cfg.loss_scale, "seed": cfg.seed,
             "prefer": cfg.prefer, "weights": cfg.weights, "eval_every": cfg.eval_every,
             "eval_batches": trainer.data.eval_windows(cfg.eval_batches), "checkpoint_every": cfg.checkpoint_every,
             "keep": cfg.keep, "lora": "off" if args.lora is None else
             f"r={args.lora.r},alpha={args.lora.alpha:g},targets={','.join(args.lora.targets)}", "quant": cfg.quant,
             "train_on_prompt": args.train_on_prompt, "max_examples": args.max_examples or "all",
             "val_examples": args.val_examples or "all", "data_bytes": args.data_bytes, "save_dtype": args.save_dtype}
    if args.lora is not None:
        del shown["save_dtype"]
    if trainer.data.layout != "examples":
        for name in ("train_on_prompt", "max_examples", "val_examples"):
            del shown[name]
    if args.data != STDLIB:
        del shown["data_bytes"]
    parts = []
    for name, value in shown.items():
        text = f"{value:g}" if isinstance(value, float) else str(value)
        default = name not in given and name not in ("model", "data", "steps")
        parts.append(f"{name.replace('_', '-')} {text}{' (default)' if default else ''}")
    return "train: " + ", ".join(parts)


def _stdlib_data(model: str, out: Path, max_bytes: int, quiet: bool) -> Path:
    """The run's tokenized standard-library corpus, prepared once (cached in ``out/data``)."""
    from orion.generation.hf_files import read_json_object
    from orion.train.data import prepare

    directory = out / DATA_SUBDIR
    if (directory / "meta.json").is_file():
        return directory
    if model not in SHAPES and not (Path(model) / "config.json").is_file():
        raise TrainError(f"--data stdlib with --model {model}: a trainer checkpoint has no tokenizer, and a new BPE "
                         "would not be the one the base learnt. Fix: pass --data with the base run's data directory "
                         "(RUN_DIR/data)")
    tokenizer = Path(model) / "tokenizer.json" if model not in SHAPES else None
    vocab = SHAPES[model].vocab_size if model in SHAPES else int(read_json_object(Path(model) / "config.json")
                                                                 ["vocab_size"])
    if not quiet:
        how = f"with {tokenizer}" if tokenizer and tokenizer.is_file() else f"training a BPE of {vocab} tokens"
        print(f"preparing the standard-library corpus ({max_bytes:,} bytes) in {directory}, {how}", file=sys.stderr)
    prepare(None, directory, tokenizer=tokenizer if tokenizer and tokenizer.is_file() else None, vocab_size=vocab,
            max_bytes=max_bytes)
    return directory


def _plot(trainer: Trainer, records: list[dict[str, Any]]) -> None:
    """Writes the loss curve next to the log, or says in the log (and on stderr) why it did not."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        from matplotlib import pyplot
    except ImportError:
        reason = "matplotlib is not installed (pip install 'orion-ane[plot]')"
        trainer.log_event({"event": "plot", "written": False, "reason": reason})
        print(f"no loss-curve figure written: {reason}", file=sys.stderr)
        return
    steps = [r for r in records if r["loss"] is not None]
    evals = [r for r in read_log(trainer.log_path) if r.get("event") == "eval" and r["val_loss"] is not None]
    figure, axes = pyplot.subplots(figsize=(7, 4))
    axes.plot([r["step"] for r in steps], [r["loss"] for r in steps], label="train", linewidth=0.8)
    axes.plot([r["step"] for r in evals], [r["val_loss"] for r in evals], "o-", label="validation")
    axes.set(xlabel="optimizer step", ylabel="cross-entropy (nats)", title=str(trainer.out_dir.name))
    axes.legend()
    path = trainer.out_dir / PLOT_FILE
    figure.savefig(path, dpi=120, bbox_inches="tight")
    pyplot.close(figure)
    trainer.log_event({"event": "plot", "written": True, "path": PLOT_FILE})


def _loss_scale(text: str) -> str | float:
    """An argparse type: ``dynamic`` or a positive number."""
    if text == "dynamic":
        return text
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is neither 'dynamic' nor a number") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{value} must be > 0")
    return value


def _lora_spec(text: str) -> LoraSpec:
    """An argparse type: :meth:`LoraSpec.parse`."""
    try:
        return LoraSpec.parse(text)
    except AdapterError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4f}"


if __name__ == "__main__":
    sys.exit(main())
