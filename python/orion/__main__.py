"""``python -m orion``: the command line."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m orion", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="compile and run a GPT-2-sized MLP block, checked against numpy")
    demo.add_argument("--lanes", type=int, default=32, help="token lanes per evaluate (default 32)")
    demo.add_argument("--iterations", type=int, default=50)
    commands.add_parser("constraints", help="print the catalog of known ANE constraints and how Orion handles each")
    doctor = commands.add_parser("doctor", help="platform, backend and why, ANE framework, compile budget; runs a "
                                 "tiny program end to end")
    doctor.add_argument("--probe", action="store_true", help="also run the probe suite and write its JSON report")
    doctor.add_argument("--out", help="where --probe writes its report (default orion-probe-<backend>.json)")
    doctor.add_argument("--json", action="store_true", help="print the doctor report as JSON")
    args = parser.parse_args(argv)
    if args.command == "doctor":
        from orion import doctor as doctor_module

        return doctor_module.main(probe=args.probe, out=args.out, as_json=args.json)
    if args.command == "demo":
        from orion import demo as demo_module

        return demo_module.main(lanes=args.lanes, iterations=args.iterations)
    from orion import constraints

    return constraints.main()


if __name__ == "__main__":
    sys.exit(main())
