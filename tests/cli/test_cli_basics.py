"""The ``torchkiln`` console script: modules from the working directory, pipes, plurals."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from torchkiln.cli import commands as cli

SCRIPT = Path(sys.executable).with_name("torchkiln")


@pytest.fixture
def console_script() -> Path:
    if not SCRIPT.exists():
        pytest.skip("the torchkiln console script is not installed next to this interpreter")
    return SCRIPT


def test_plan_finds_a_factory_module_in_the_working_directory(
    tmp_path: Path, console_script: Path
) -> None:
    (tmp_path / "mymodels.py").write_text(
        textwrap.dedent(
            """
            from torch import nn

            def build():
                return nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4), nn.ReLU())
            """
        )
    )
    result = subprocess.run(
        [str(console_script), "plan", "mymodels:build", "--regions", "whole"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert "1 region in 1 group: 1 compile unit expected" in result.stdout


def test_output_cut_short_by_head_ends_without_a_traceback(console_script: Path) -> None:
    # As `torchkiln plugins | head -n 0`: the reader is gone before anything is written.
    process = subprocess.Popen(
        [str(console_script), "plugins"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={"TORCHKILN_DISABLE_PLUGIN_AUTOLOAD": "1", "PATH": "/usr/bin:/bin"},
    )
    assert process.stdout is not None and process.stderr is not None
    process.stdout.close()
    stderr = process.stderr.read().decode()
    assert process.wait(timeout=300) == 141  # 128 + SIGPIPE, as a shell reports it
    assert "Traceback" not in stderr and "BrokenPipe" not in stderr, stderr


@pytest.mark.parametrize(("count", "text"), [(0, "0 regions"), (1, "1 region"), (2, "2 regions")])
def test_plural(count: int, text: str) -> None:
    assert cli.plural(count, "region") == text
