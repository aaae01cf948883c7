"""``python -m orion``: the command line."""

from __future__ import annotations

import argparse
import sys

from orion.cli import non_negative_int, positive_int, report_errors


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m orion", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="compile and run a GPT-2-sized MLP block, checked against numpy")
    demo.add_argument("--lanes", type=positive_int, default=32, help="token lanes per evaluate (default 32)")
    demo.add_argument("--iterations", type=positive_int, default=50)
    commands.add_parser("constraints", help="print the catalog of known ANE constraints and how Orion handles each")
    generate = commands.add_parser("generate", help="generate text with a model directory (streams tokens)")
    generate.add_argument("--model", required=True,
                          help="Hugging Face model directory with tokenizer.json (its config.json's model_type "
                               "picks the model)")
    generate.add_argument("--prompt", required=True)
    generate.add_argument("--max-new-tokens", type=non_negative_int, default=64)
    generate.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    generate.add_argument("--top-k", type=positive_int, default=None)
    generate.add_argument("--top-p", type=float, default=None)
    generate.add_argument("--seed", type=int, default=None)
    doctor = commands.add_parser("doctor", help="platform, backend and why, ANE framework, compile budget; runs a "
                                 "tiny program end to end")
    doctor.add_argument("--probe", action="store_true", help="also run the probe suite and write its JSON report")
    doctor.add_argument("--out", help="where --probe writes its report (default orion-probe-<backend>.json)")
    doctor.add_argument("--json", action="store_true", help="print the doctor report as JSON")
    args = parser.parse_args(argv)
    if args.command == "generate":
        return report_errors(lambda: _generate(args))
    if args.command == "doctor":
        from orion import doctor as doctor_module

        return report_errors(lambda: doctor_module.main(probe=args.probe, out=args.out, as_json=args.json))
    if args.command == "demo":
        from orion import demo as demo_module

        return report_errors(lambda: demo_module.main(lanes=args.lanes, iterations=args.iterations))
    from orion import constraints

    return constraints.main()


def _generate(args: argparse.Namespace) -> int:
    from orion import models

    model = models.load(args.model)
    sys.stdout.write(args.prompt)
    for piece in model.generate_text(args.prompt, args.max_new_tokens, temperature=args.temperature,
                                     top_k=args.top_k, top_p=args.top_p, seed=args.seed):
        sys.stdout.write(piece)
        sys.stdout.flush()
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
