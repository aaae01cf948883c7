"""``python -m orion``: the command line."""

from __future__ import annotations

import argparse
import re
import sys
import time
import warnings
from pathlib import Path

from orion import quant
from orion.cli import HelpFormatter, non_negative_int, positive_int, report_errors, write_out
from orion.errors import OrionError
from orion.generation.speculative import METHODS, Speculation

DESCRIPTION = """\
Orion compiles transformer language models to Apple's MIL and runs them on the Apple Neural Engine,
or on its software ANE where there is none.

  python -m orion generate --model DIR --prompt "Hello"   stream text from a Hugging Face model directory
  python -m orion chat --model DIR [--system TEXT]        chat in the terminal (multi-turn, streaming)
  python -m orion doctor                                  what this machine can run, and a tiny program end to end
  python -m orion cache info                              the on-disk program cache
  python -m orion serve --model DIR                       an OpenAI-compatible HTTP server (its own --help)
  python -m orion data prepare FILES... --out DIR         tokenize text for training (its own --help)
  python -m orion train --model stories110m --data stdlib --steps 1000 --out RUN   train (its own --help)
  python -m orion train ... --lora r=16,alpha=32,targets=q,v   fine-tune LoRA adapters only (PEFT format out)
  python -m orion lora merge BASE ADAPTER OUT             fold an adapter into its base (a Hugging Face directory)
  python -m orion imatrix --model DIR --text FILE         calibrate --quant lut4/lut6 (then --imatrix FILE)
  python -m orion.bench decode                            the decode benchmark (its own --help)
"""


# Commands with a command line of their own: ``python -m orion NAME ARGS...`` runs ``module.main(ARGS)``.
DELEGATED = {
    "serve": ("orion.serve.cli", "serve a model over OpenAI's HTTP API (needs the 'serve' extra)"),
    "chat": ("orion.repl", "chat with a model in the terminal: multi-turn, streamed, Ctrl-C stops a reply"),
    "data": ("orion.train.data_cli", "prepare token files for training: data prepare TEXT_FILES... --out DIR"),
    "train": ("orion.train.cli", "train a model (stories110m, gpt2, tiny-*, or a directory) with checkpoints"),
    "lora": ("orion.lora.cli", "LoRA adapters: lora merge BASE ADAPTER OUT (a merged Hugging Face directory)"),
    "imatrix": ("orion.importance_cli", "an importance matrix for --quant lut4/lut6 from calibration text "
                                        "(llama.cpp's imatrix)"),
}


class UsageError(OrionError, ValueError):
    """Command-line arguments that cannot work together."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m orion", description=DESCRIPTION, formatter_class=HelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    demo = commands.add_parser("demo", help="compile and run a GPT-2-sized MLP block, checked against numpy",
                               formatter_class=HelpFormatter)
    demo.add_argument("--lanes", type=positive_int, default=32, help="token lanes per evaluate")
    demo.add_argument("--iterations", type=positive_int, default=50, help="timed evaluates")
    commands.add_parser("constraints", help="print the catalog of known ANE constraints and how Orion handles each",
                        formatter_class=HelpFormatter)
    _add_generate(commands)
    doctor = commands.add_parser("doctor", formatter_class=HelpFormatter,
                                 help="platform, backend and why, threads and SIMD, caches; runs a tiny program")
    doctor.add_argument("--probe", action="store_true", help="also run the probe suite and write its JSON report")
    doctor.add_argument("--out", default=None,
                        help="where --probe writes its report (None: orion-probe-<backend>.json)")
    doctor.add_argument("--json", action="store_true", help="print the doctor report as JSON")
    cache = commands.add_parser("cache", help="the on-disk program cache (ORION_CACHE_DIR): info or clear",
                                formatter_class=HelpFormatter)
    cache.add_argument("action", choices=("info", "clear"), help="info: location, entries, size and cap; "
                       "clear: delete every entry")
    for name, (_, summary) in DELEGATED.items():
        commands.add_parser(name, help=summary, add_help=False)
    return parser


def _add_generate(commands: argparse._SubParsersAction) -> None:
    generate = commands.add_parser(
        "generate", formatter_class=HelpFormatter, help="generate text with a model directory (streams it)",
        description="Stream the model's continuation of a prompt to stdout. The prompt comes from --prompt,\n"
                    "--prompt-file, or stdin (--prompt - or a pipe); progress and warnings go to stderr.")
    generate.add_argument("--model", required=True,
                          help="Hugging Face model directory: config.json (its model_type picks the model), "
                               "model.safetensors, tokenizer.json [, tokenizer_config.json, generation_config.json]")
    source = generate.add_mutually_exclusive_group()
    source.add_argument("--prompt", default=None, help="the prompt text ('-' reads stdin; '' starts from BOS)")
    source.add_argument("--prompt-file", default=None, help="read the prompt from this UTF-8 file")
    generate.add_argument("--chat", action="store_true",
                          help="send the prompt as one user message through the model's chat template")
    generate.add_argument("--max-new-tokens", type=non_negative_int, default=None,
                          help="most new tokens (None: generation_config.json's, else 64)")
    generate.add_argument("--temperature", type=float, default=None,
                          help="0 = greedy (None: generation_config.json's, else greedy)")
    generate.add_argument("--top-k", type=positive_int, default=None, help="sample from the k most likely tokens")
    generate.add_argument("--top-p", type=float, default=None, help="nucleus sampling: the smallest set reaching p")
    generate.add_argument("--min-p", type=float, default=None, help="drop tokens below min_p x the top probability")
    generate.add_argument("--repetition-penalty", type=float, default=None,
                          help="divide the logits of tokens already seen (1 = none)")
    generate.add_argument("--seed", type=int, default=None, help="random seed for sampling")
    generate.add_argument("--stop", action="append", default=None, metavar="TEXT",
                          help="stop before this text (repeatable; \\n and \\t mean newline and tab); the model's "
                               "end-of-sequence tokens stop too (unless --ignore-eos)")
    generate.add_argument("--ignore-eos", action="store_true",
                          help="go on past the model's end-of-sequence tokens (to --max-new-tokens)")
    generate.add_argument("--speculative", choices=METHODS, default=None,
                          help="speculative decoding: prompt-lookup drafts tokens from n-grams of the prompt and "
                               "the text so far and checks them in one run (the same text, faster when it repeats "
                               "the prompt)")
    generate.add_argument("--draft-tokens", type=positive_int, default=Speculation.num_tokens,
                          help="most drafted tokens per check (with --speculative)")
    generate.add_argument("--ngram", type=positive_int, default=Speculation.max_ngram,
                          help="longest n-gram looked up (with --speculative)")
    generate.add_argument("--min-ngram", type=positive_int, default=None,
                          help=f"shortest n-gram match that drafts; a shorter one decodes plainly (with "
                               f"--speculative; default {Speculation.min_ngram}, or --ngram if that is shorter)")
    quant.add_arguments(generate)
    generate.add_argument("--no-echo", action="store_true", help="print only the generated text, not the prompt")
    generate.add_argument("--quiet", action="store_true", help="no progress lines or warnings on stderr")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in DELEGATED:
        import importlib

        return importlib.import_module(DELEGATED[argv[0]][0]).main(argv[1:])
    args = build_parser().parse_args(argv)
    if args.command == "generate":
        return report_errors(lambda: _generate(args))
    if args.command == "doctor":
        from orion import doctor as doctor_module

        return report_errors(lambda: doctor_module.main(probe=args.probe, out=args.out, as_json=args.json))
    if args.command == "cache":
        from orion import program_cache

        return report_errors(lambda: program_cache.main(args.action))
    if args.command == "demo":
        from orion import demo as demo_module

        return report_errors(lambda: demo_module.main(lanes=args.lanes, iterations=args.iterations))
    from orion import constraints

    return report_errors(constraints.main)


def _read_prompt(args: argparse.Namespace) -> str:
    if args.prompt_file is not None:
        path = Path(args.prompt_file)
        try:
            return path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(f"--prompt-file {path}: cannot read it as UTF-8 text ({exc})") from None
    if args.prompt == "-" or (args.prompt is None and not sys.stdin.isatty()):
        return sys.stdin.read()
    if args.prompt is None:
        raise UsageError("give the prompt with --prompt TEXT, --prompt-file PATH, or on stdin (--prompt -)")
    return args.prompt


def _unescape(stops: list[str] | None) -> list[str] | None:
    """``\\n``, ``\\t`` and ``\\\\`` in ``--stop`` values, as typed in a shell, become the characters."""
    table = {"n": "\n", "t": "\t", "\\": "\\"}
    return None if stops is None else [re.sub(r"\\([nt\\])", lambda m: table[m.group(1)], s) for s in stops]


def _generate(args: argparse.Namespace) -> int:
    """Checks everything that can be checked before compiling, then compiles and streams."""
    from orion import models
    from orion.generation.loop import ContextFull
    from orion.generation.sampling import check_sampling

    if args.quiet:
        warnings.simplefilter("ignore")
    check_sampling(0.0 if args.temperature is None else args.temperature, args.top_k, args.top_p, args.min_p,
                   args.repetition_penalty)
    speculation = None if args.speculative is None else \
        Speculation(args.speculative, num_tokens=args.draft_tokens, max_ngram=args.ngram,
                    min_ngram=args.min_ngram or min(Speculation.min_ngram, args.ngram))
    directory = Path(args.model)
    models.registry.model_class(directory)  # the directory, its config.json and model_type (or a .gguf file)
    tokenizer = models.load_tokenizer(directory)
    prompt_text = _read_prompt(args)
    prompt = [{"role": "user", "content": prompt_text}] if args.chat else prompt_text
    text = tokenizer.apply_chat_template(prompt) if args.chat else prompt_text  # no chat_template: fail now
    count, context = len(tokenizer.encode(text, add_special_tokens=not args.chat)), models.context_length(directory)
    if context is not None and count > context:
        raise ContextFull(f"the prompt has {count} tokens, more than the model's context length {context}: "
                          f"shorten it")
    note = (lambda text: None) if args.quiet else (lambda text: print(text, file=sys.stderr, flush=True))
    model = models.load(directory, progress=not args.quiet,
                        **quant.model_options(args.quant, args.probe_report, note, imatrix=args.imatrix))
    run = model.generate_text(prompt, args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
                              top_p=args.top_p, seed=args.seed, stop=_unescape(args.stop), min_p=args.min_p,
                              repetition_penalty=args.repetition_penalty, ignore_eos=args.ignore_eos,
                              speculative=speculation)
    echo = not args.no_echo and not args.chat
    start = time.perf_counter()
    first = None
    for piece in run:
        if first is None:
            first = time.perf_counter()
        if echo:  # after the first step: the prompt's programs are compiled, their progress is done
            write_out(prompt_text)
            echo = False
        write_out(piece)
    end = time.perf_counter()
    if echo:
        write_out(prompt_text)
    write_out("\n")
    if run.context_full and not args.quiet:
        print(f"stopped: the context length ({model.dims.context} tokens) is full (finish_reason 'length')",
              file=sys.stderr)
    if not args.quiet:
        print(timing_line(len(model.prompt_ids(prompt)), len(run.token_ids), start, first, end, run.finish_reason),
              file=sys.stderr, flush=True)
        if run.speculation is not None:
            stats = run.speculation
            print(f"speculative: {stats.checks} checks, {stats.accepted} of {stats.drafted} drafted tokens accepted "
                  f"({stats.acceptance_rate:.0%})", file=sys.stderr, flush=True)
    return 0


def timing_line(prompt_tokens: int, completion_tokens: int, start: float, first: float | None, end: float,
                finish_reason: str | None) -> str:
    """What llama-cli reports after a generation: token counts, time to first token (prefill, and any
    compile it needed) and the decode rate after the first token."""
    ttft = "-" if first is None else f"{first - start:.3f} s"
    rate = f"{(completion_tokens - 1) / (end - first):.1f} tok/s" if first is not None and completion_tokens > 1 \
        and end > first else "- tok/s"
    return (f"{prompt_tokens} prompt tokens, {completion_tokens} completion tokens, time to first token {ttft}, "
            f"{rate} (finish_reason {finish_reason})")


if __name__ == "__main__":
    sys.exit(main())
