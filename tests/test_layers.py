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


MAX_FUNCTION_LINES = 60


def test_no_function_in_the_package_is_longer_than_60_lines():
    """A function a reader takes in at once: from its `def` to its last line, docstring included.
    A longer one is split into named steps (a helper, or a small class where they share state)."""
    import ast

    long = []
    for path in sorted((REPO / "semsearch").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name} ({n} lines)")
    assert not long, "\n".join(long)
