"""Running the measurement scripts in ``examples/`` as a user would, in a fresh interpreter."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def run_example(
    name: str, *arguments: str, timeout: float = 900
) -> subprocess.CompletedProcess[str]:
    """``python examples/<name> <arguments>``; fails the test, with its stderr, unless it exits 0."""
    process = subprocess.run(
        [sys.executable, str(EXAMPLES / name), *arguments],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert process.returncode == 0, process.stderr[-4000:]
    return process
