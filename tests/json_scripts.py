"""Running a test's own script in a fresh interpreter, as a restarted job would, and reading the
JSON object it prints last."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any


def run_json_script(
    tmp_path: Path, name: str, source: str, *arguments: str, timeout: float = 900
) -> dict[str, Any]:
    """Write ``source`` to ``tmp_path / name``, run it with ``arguments`` (progress off), and
    return its last line of output as JSON; fails the test, with its stderr, unless it exits 0."""
    script = tmp_path / name
    script.write_text(source)
    process = subprocess.run(
        [sys.executable, str(script), *arguments],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "TORCHKILN_PROGRESS": "off"},
        check=False,
    )
    assert process.returncode == 0, process.stderr[-4000:]
    return json.loads(process.stdout.strip().splitlines()[-1])
