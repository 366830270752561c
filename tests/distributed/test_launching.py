"""The launch helper's single retry: only after the teardown abort, at most once."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from launching import TEARDOWN_ABORT, launch


def flaky_command(marker: Path, message: str, failures: int) -> list[str]:
    """A process that fails with ``message`` on its first ``failures`` runs, then succeeds."""
    code = (
        "import pathlib, sys\n"
        f"marker = pathlib.Path({str(marker)!r})\n"
        "runs = int(marker.read_text()) if marker.exists() else 0\n"
        "marker.write_text(str(runs + 1))\n"
        f"if runs < {failures}:\n"
        f"    sys.stderr.write({message!r})\n"
        "    sys.exit(1)\n"
        "print('done')\n"
    )
    return [sys.executable, "-c", code]


def test_a_teardown_abort_is_retried_once_with_a_warning(tmp_path):
    marker = tmp_path / "runs"
    with pytest.warns(UserWarning, match="teardown abort"):
        process = launch(lambda: flaky_command(marker, TEARDOWN_ABORT, 1), cwd=tmp_path)
    assert process.returncode == 0
    assert process.stdout == "done\n"
    assert marker.read_text() == "2"


def test_a_second_teardown_abort_fails(tmp_path):
    marker = tmp_path / "runs"
    with pytest.warns(UserWarning, match="teardown abort"):
        process = launch(lambda: flaky_command(marker, TEARDOWN_ABORT, 2), cwd=tmp_path)
    assert process.returncode == 1
    assert marker.read_text() == "2"


def test_any_other_failure_is_not_retried(tmp_path):
    marker = tmp_path / "runs"
    process = launch(lambda: flaky_command(marker, "RuntimeError: boom", 1), cwd=tmp_path)
    assert process.returncode == 1
    assert "boom" in process.stderr
    assert marker.read_text() == "1"
