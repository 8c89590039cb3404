"""`realsim bench`: the standard benchmarks of docs/contracts.md as a table (or JSON)."""

from __future__ import annotations

import json
import sys

from realsim_core.errors import RealsimError


def add_parser(subparsers) -> None:
    from realsim_core.bench import BENCHMARKS

    p = subparsers.add_parser(
        "bench", help="run the standard benchmarks",
        description="Standard benchmarks: " + "; ".join(
            f"{b.name}: {b.description}" for b in BENCHMARKS.values()))
    p.add_argument("--only", action="append", metavar="NAME",
                   help=f"run only this benchmark (repeatable): {', '.join(BENCHMARKS)}")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--quick", action="store_true", help="fewer repetitions (smoke test)")
    p.set_defaults(func=run)


def run(args) -> int:
    from realsim_core.bench import machine_info, run_benchmarks

    try:
        results = run_benchmarks(args.only, quick=args.quick)
    except KeyError as exc:
        raise RealsimError(exc.args[0]) from None
    info = machine_info()
    if args.json:
        json.dump({"machine": info, "results": results}, sys.stdout, indent=2)
        print()
        return 0
    print(f"# realsim bench  {info['date']}  {info['machine']}  "
          f"{info['cpu_count']} CPUs  jax {info['jax']} ({info['backend']})")
    for name, metrics in results.items():
        print(f"\n{name}")
        width = max(len(k) for k in metrics)
        for k, v in metrics.items():
            print(f"  {k:<{width}}  {v}")
    return 0
