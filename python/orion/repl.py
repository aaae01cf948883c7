"""``python -m orion chat --model DIR [--system TEXT]``: talk with a model in the terminal.

Each turn renders the whole conversation through the model's chat template and streams the reply.
Ctrl-C during a reply stops that reply (what was said so far stays in the history) and returns to the
prompt; Ctrl-C at the prompt clears the line; Ctrl-D (end of input) or ``/exit`` leaves. ``/reset``
forgets the conversation (the system message stays).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from orion import quant
from orion.cli import HelpFormatter, positive_int, report_errors, write_out
from orion.errors import OrionError

PROMPT = "> "


def build_parser(prog: str = "python -m orion chat") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, formatter_class=HelpFormatter, description=__doc__.split("\n\n", 1)[1])
    p.add_argument("--model", required=True, metavar="DIR", help="a model directory with a chat template "
                   "(tokenizer_config.json's chat_template)")
    p.add_argument("--system", default=None, metavar="TEXT", help="a system message that opens the conversation")
    p.add_argument("--max-new-tokens", type=positive_int, default=512, help="most tokens in one reply")
    p.add_argument("--temperature", type=float, default=None,
                   help="0 = greedy (None: generation_config.json's, else greedy)")
    p.add_argument("--top-k", type=positive_int, default=None, help="sample from the k most likely tokens")
    p.add_argument("--top-p", type=float, default=None, help="nucleus sampling: the smallest set reaching p")
    p.add_argument("--min-p", type=float, default=None, help="drop tokens below min_p x the top probability")
    p.add_argument("--repetition-penalty", type=float, default=None,
                   help="divide the logits of tokens already seen (1 = none)")
    p.add_argument("--seed", type=int, default=None, help="random seed for sampling")
    p.add_argument("--quiet", action="store_true", help="no progress lines while loading")
    quant.add_arguments(p)
    return p


def _read_line() -> str | None:
    """One line from the user (None at end of input); Ctrl-C at the prompt gives a fresh prompt."""
    while True:
        try:
            return input(PROMPT)
        except EOFError:
            return None
        except KeyboardInterrupt:
            print(file=sys.stderr)


def _reply(model: Any, history: list[dict[str, str]], args: argparse.Namespace) -> str:
    """Stream the model's reply to ``history``; returns its text (cut short by Ctrl-C)."""
    run = model.generate_text(history, args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
                              top_p=args.top_p, seed=args.seed, min_p=args.min_p,
                              repetition_penalty=args.repetition_penalty)
    try:
        for piece in run:
            write_out(piece)
    except KeyboardInterrupt:
        write_out("\n")
        print("[stopped]", file=sys.stderr, flush=True)
        return run.text
    write_out("\n")
    if run.context_full:
        print(f"[the context ({model.dims.context} tokens) is full: /reset to start again]", file=sys.stderr)
    return run.text


def chat(args: argparse.Namespace) -> int:
    from orion import models
    from orion.generation.sampling import check_sampling
    from orion.generation.tokenizer import load_tokenizer

    check_sampling(0.0 if args.temperature is None else args.temperature, args.top_k, args.top_p, args.min_p,
                   args.repetition_penalty)
    directory = Path(args.model)
    models.registry.model_class(directory)  # the directory, its config.json and model_type
    opening = [{"role": "system", "content": args.system}] if args.system else []
    load_tokenizer(directory).apply_chat_template([*opening, {"role": "user", "content": "hi"}])  # a chat format?
    note = (lambda text: None) if args.quiet else (lambda text: print(text, file=sys.stderr, flush=True))
    model = models.load(directory, progress=not args.quiet,
                        **quant.model_options(args.quant, args.probe_report, note, imatrix=args.imatrix))
    try:  # line editing and history where the platform has it
        import readline  # noqa: F401
    except ImportError:
        pass
    print(f"chatting with {directory.name}: Ctrl-C stops a reply, Ctrl-D or /exit leaves, /reset starts over",
          file=sys.stderr, flush=True)
    history = list(opening)
    while True:
        line = _read_line()
        if line is None or line.strip() == "/exit":
            write_out("\n" if line is None else "")
            return 0
        if line.strip() == "/reset":
            history = list(opening)
            continue
        if not line.strip():
            continue
        history.append({"role": "user", "content": line})
        try:
            history.append({"role": "assistant", "content": _reply(model, history, args)})
        except OrionError as err:  # e.g. the conversation outgrew the context: this turn is dropped
            history.pop()
            print(f"error: {err}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return report_errors(lambda: chat(args))
