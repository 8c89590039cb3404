"""The `realsim` command line: help, one-line errors, exit codes."""

import importlib.util
import subprocess
import sys

from realsim_core import cli


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "realsim_core", *args], capture_output=True, text=True, timeout=120
    )


def test_help_lists_existing_subcommands():
    res = run("--help")
    assert res.returncode == 0
    existing = [
        c for c in cli._COMMANDS if importlib.util.find_spec(f"realsim_core.commands.{c}")
    ]
    for name in existing:
        assert name in res.stdout
    missing = [c for c in cli._COMMANDS if c not in existing]
    for name in missing:  # not advertised until it exists
        assert f"    {name} " not in res.stdout


def test_unknown_arguments_give_one_clear_line():
    for args in (["--bogus"], ["no-such-command"]):
        res = run(*args)
        assert res.returncode == 2
        lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1, res.stderr
        assert lines[0].startswith("realsim: error:")
        assert "Traceback" not in res.stderr


def test_realsim_error_is_one_line_without_traceback(monkeypatch, capsys):
    from realsim_core.errors import RealsimError

    def boom(_args):
        raise RealsimError("rig file /x/rig.yaml: cameras.cam_high.mount: unknown body 'nope'")

    def parser_with_boom():
        parser = cli._Parser(prog="realsim")
        sub = parser.add_subparsers(dest="command", parser_class=cli._Parser)
        sub.add_parser("boom").set_defaults(func=boom)
        return parser

    monkeypatch.setattr(cli, "build_parser", parser_with_boom)
    assert cli.main(["boom"]) == 1
    err = capsys.readouterr().err
    assert err == (
        "realsim boom: error: rig file /x/rig.yaml: cameras.cam_high.mount: unknown body 'nope'\n"
    )
