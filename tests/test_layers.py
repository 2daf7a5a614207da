"""The layering contract (pyproject.toml [tool.importlinter]): no upward import, no import cycle.
Checked by import-linter's own command, as .ci/run also runs it."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO


def test_import_contracts_hold():
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    if exe is None:
        pytest.skip("import-linter is not installed (pip install -e '.[test]')")
    p = subprocess.run([exe, "--no-cache"], cwd=REPO, capture_output=True, text=True)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-2000:]
    assert "0 broken" in p.stdout
