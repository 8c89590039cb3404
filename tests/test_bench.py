"""`realsim bench`: registry, CLI options, error line for an unknown benchmark."""

from __future__ import annotations

import json

import pytest

from realsim_core import bench
from realsim_core.cli import main


@pytest.fixture
def tiny_benchmark(monkeypatch):
    monkeypatch.setitem(bench.BENCHMARKS, "tiny",
                        bench.Benchmark("tiny", "a test entry", lambda quick: {"x_ms": 1.0}))


def test_registry_has_render_std():
    assert "render-std" in bench.BENCHMARKS


def test_render_std_scene_matches_contract():
    params, intr, pose = bench.render_std_scene()
    assert params["means"].shape == (20000, 3)
    r = ((params["means"] - [0, 0, 0.6]) ** 2).sum(1) ** 0.5
    assert abs(r - 0.3).max() < 1e-5 and (params["scales"] == 0.003).all()
    assert (intr.width, intr.height, intr.fx) == (424, 240, 0.9 * 424)
    assert (params["opacities"] == 0.8).all() and params["colors"].shape == (20000, 1, 3)


def test_cli_only_json(tiny_benchmark, capsys):
    assert main(["bench", "--only", "tiny", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["results"] == {"tiny": {"x_ms": 1.0}} and "cpu_count" in out["machine"]


def test_cli_table_and_unknown(tiny_benchmark, capsys):
    assert main(["bench", "--only", "tiny"]) == 0
    assert "x_ms" in capsys.readouterr().out
    assert main(["bench", "--only", "nope"]) == 1
    err = capsys.readouterr().err
    assert "unknown benchmark" in err and err.count("\n") == 1
