"""``python -m orion serve``: load and compile a model once, then serve it over OpenAI's HTTP API."""

from __future__ import annotations

import argparse
import ipaddress
import socket
import sys
from pathlib import Path

from orion import quant
from orion.cli import HelpFormatter
from orion.generation.speculative import METHODS, Speculation
from orion.serve.engine import SCHEDULERS

try:
    import uvicorn

    from orion.serve.app import Limits, create_app
    from orion.serve.scheduler import BURST_WAIT
except ImportError as exc:  # the optional 'serve' extra
    raise ImportError(f"python -m orion serve needs the 'serve' extra: pip install 'orion-ane[serve]' ({exc})") from exc


def build_parser(prog: str = "python -m orion serve") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description="Serve a model over OpenAI's HTTP API (/v1/completions, "
                                "/v1/chat/completions, /v1/models, /health).",
                                formatter_class=HelpFormatter)
    p.add_argument("--model", required=True, metavar="DIR", help="a model directory orion.models.load reads (config.json, weights, tokenizer.json)")
    p.add_argument("--model-name", help="the name clients pass as 'model' (default: the directory's name)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on; anything but loopback exposes the model "
                   "to the network")
    p.add_argument("--port", type=int, default=8000, help="port to listen on (0: any free port)")
    p.add_argument("--max-queue", type=int, default=64, help="requests that may wait; more get 503 with Retry-After")
    p.add_argument("--max-sequences", type=int, default=4, help="sequences generating at once: the decode programs' lanes, one step "
                                                                  "advances them all (a request for n choices takes n)")
    p.add_argument("--scheduler", choices=SCHEDULERS, default="batched",
                   help="batched: one decode step advances every sequence (lanes of one program); turns: each "
                        "sequence alone, one step each in turn (the server before batching, a baseline)")
    p.add_argument("--burst-wait-ms", type=float, default=BURST_WAIT * 1000,
                   help="batched: an idle server waits this long after a request for the next (and so on, up to "
                        "--max-sequences) so that a burst of requests reads its prompts in one pass (0: start at once)")
    p.add_argument("--max-body-bytes", type=int, default=Limits.max_body_bytes, help="larger request bodies get 413")
    p.add_argument("--body-timeout", type=float, default=Limits.body_timeout,
                   help="seconds for a request body to arrive, else 408")
    p.add_argument("--send-timeout", type=float, default=Limits.send_timeout,
                   help="seconds a streaming client may take to accept one event before it is dropped")
    p.add_argument("--retry-after", type=int, default=1, help="the Retry-After seconds of a 503")
    p.add_argument("--log-level", default="warning", choices=["critical", "error", "warning", "info", "debug"],
                   help="uvicorn's log level (info logs every request)")
    p.add_argument("--quiet", action="store_true", help="no progress while loading and compiling")
    p.add_argument("--prefix-cache-mb", type=int, default=256,
                   help="MiB of computed prompt prefixes kept (least recently used out) so that prompts starting "
                        "the same (a system prompt, a chat history) skip recomputing them; 0: off")
    p.add_argument("--speculative", choices=METHODS, default=None,
                   help="speculative decoding for requests that do not set 'speculative' (a request may turn it on "
                        "or off): prompt-lookup drafts tokens from n-grams of the prompt and the text so far, and the "
                        "model checks them in one run (same output, faster when the reply repeats the prompt)")
    p.add_argument("--draft-tokens", type=int, default=Speculation.num_tokens,
                   help=f"most drafted tokens per check of a speculative request (default {Speculation.num_tokens})")
    quant.add_arguments(p)
    return p


def _check(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """Refuse bad arguments before the (slow) load and compile."""
    from orion import models

    model = Path(args.model)
    if not model.is_dir() and not (model.is_file() and model.suffix in models.file_suffixes()):
        what = f"not a directory or a {'/'.join(models.file_suffixes())} file" if model.exists() else "no such directory"
        parser.error(f"--model {args.model}: {what}")
    if not 0 <= args.port <= 65535:
        parser.error(f"--port {args.port}: use 0..65535")
    if args.draft_tokens < 1:
        parser.error(f"--draft-tokens {args.draft_tokens}: use 1 or more")
    if args.prefix_cache_mb < 0:
        parser.error(f"--prefix-cache-mb {args.prefix_cache_mb}: use 0 (off) or more")
    for name in ("max_queue", "max_sequences", "max_body_bytes", "retry_after"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} {getattr(args, name)}: use 1 or more")
    if not 0 <= args.burst_wait_ms <= 1000:
        parser.error(f"--burst-wait-ms {args.burst_wait_ms}: use 0 to 1000")
    for name in ("body_timeout", "send_timeout"):
        if not getattr(args, name) > 0:
            parser.error(f"--{name.replace('_', '-')} {getattr(args, name)}: use a positive number of seconds")


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def main(argv: list[str] | None = None) -> int:
    """Run the server until Ctrl-C: 0 on a clean stop, 1 when the model or the address cannot be used, 2 for
    bad arguments, 130 when interrupted while loading."""
    parser = build_parser()
    args = parser.parse_args(argv)
    _check(args, parser)
    from orion.errors import OrionError
    from orion.serve.model_engine import ModelEngine

    if not _is_loopback(args.host):
        print(f"warning: listening on {args.host}, not loopback: anyone who can reach this machine can use the model",
              file=sys.stderr)
    try:
        family = socket.AF_INET6 if ":" in args.host else socket.AF_INET
        listener = socket.create_server((args.host, args.port), family=family)
    except OSError as exc:
        print(f"error: cannot listen on {args.host}:{args.port}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    with listener:
        try:
            options = quant.model_options(args.quant, args.probe_report, lambda text: print(text, file=sys.stderr),
                                          imatrix=args.imatrix)
            engine = ModelEngine.from_directory(args.model, model_id=args.model_name, progress=not args.quiet,
                                               max_sequences=args.max_sequences, model_options=options,
                                               scheduler=args.scheduler,
                                               prefix_cache_bytes=args.prefix_cache_mb << 20,
                                               speculative=None if args.speculative is None else
                                               Speculation(args.speculative, num_tokens=args.draft_tokens))
        except (OrionError, ValueError, OSError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            print("interrupted while loading", file=sys.stderr)
            return 130
        limits = Limits(max_body_bytes=args.max_body_bytes, body_timeout=args.body_timeout,
                        send_timeout=args.send_timeout)
        burst_wait = args.burst_wait_ms / 1000 if args.scheduler == "batched" else 0.0  # turns reads prompts apart
        app = create_app(engine, max_waiting=args.max_queue, retry_after=args.retry_after, limits=limits,
                         burst_wait=burst_wait)
        host, port = listener.getsockname()[:2]
        host = f"[{host}]" if ":" in host else host
        server = _ReadyServer(uvicorn.Config(app, log_level=args.log_level),
                              f"ready: serving {engine.model_id!r} at http://{host}:{port}/v1")
        try:
            server.run(sockets=[listener])
        except KeyboardInterrupt:  # uvicorn re-raises Ctrl-C once it has shut down gracefully
            pass
    return 0


class _ReadyServer(uvicorn.Server):
    """A uvicorn server that says "ready" only once it accepts connections."""

    def __init__(self, config: uvicorn.Config, message: str) -> None:
        super().__init__(config)
        self.message = message

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started:
            print(self.message, file=sys.stderr, flush=True)
