"""The `realsim` command line.

Each subcommand lives in `realsim_core.commands.<name>` and exposes
`add_parser(subparsers)` (which sets `func`) ; subcommands whose module does not
exist yet are simply not listed.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys

from realsim_core.errors import RealsimError

# Order is the order shown by `realsim --help`.
_COMMANDS = ("synth", "calibrate", "evaluate", "replay", "bench", "info")


class _Parser(argparse.ArgumentParser):
    """argparse that reports errors as one line (`realsim: error: ...`) and exits 2."""

    def error(self, message: str) -> None:  # noqa: D102
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="realsim",
        description="Real-to-sim calibration for the ALOHA 2 rig "
        "(cameras, joint offsets, objects).",
    )
    from realsim_core import __version__

    parser.add_argument("--version", action="version", version=f"realsim {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for name in _COMMANDS:
        modname = f"realsim_core.commands.{name}"
        if importlib.util.find_spec(modname) is None:
            continue
        importlib.import_module(modname).add_parser(sub)
    return parser


def enable_compilation_cache() -> None:
    """Persist XLA compilations across runs (~/.cache/realsim/jax unless configured).

    Compiling the calibration step takes tens of seconds on a laptop CPU; the cache makes
    every later run of the same shapes start at once. Set JAX_COMPILATION_CACHE_DIR to
    move it, or to an empty string to disable it.
    """
    import os

    path = os.environ.get("JAX_COMPILATION_CACHE_DIR")
    if path == "":
        return
    import jax

    path = path or os.path.join(os.path.expanduser("~"), ".cache", "realsim", "jax")
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 2.0)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command in ("calibrate", "bench", "synth"):
        enable_compilation_cache()
    try:
        rc = args.func(args)
    except RealsimError as exc:
        print(f"realsim {args.command}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"realsim {args.command}: interrupted", file=sys.stderr)
        return 130
    return int(rc or 0)


if __name__ == "__main__":
    sys.exit(main())
