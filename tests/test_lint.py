"""ruff (pyflakes, pycodestyle, isort, pep257 subset) over the whole repository.

The ruff equivalent of the four ament linter tests (flake8/pep257/copyright/xmllint); the
XML files are checked for well-formedness below.
"""

import shutil
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(shutil.which("ruff") is None, reason="ruff missing (make test installs it)")
def test_ruff_clean():
    res = subprocess.run(["ruff", "check", "--no-cache", str(REPO)], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr


def test_xml_files_are_well_formed():
    files = [p for p in REPO.rglob("*.xml") if not {"build", "install", ".venv"} & set(p.parts)]
    assert any(p.name == "package.xml" for p in files)
    for path in files:
        ET.parse(path)  # raises on malformed XML
