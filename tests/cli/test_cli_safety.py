"""The command line runs nothing the user did not name, and turns bad requests into one clear
line and exit status 2, never a traceback or an allocation that cannot succeed (issue 23: C1,
T2, T3, and ``config validate`` on a file that is not a configuration)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from torchkiln import cli

SCRIPT = Path(sys.executable).with_name("torchkiln")

PLANTED = """
import pathlib
pathlib.Path({marker!r}).write_text("ran")
raise ImportError("planted module")
"""


@pytest.fixture
def console_script() -> Path:
    if not SCRIPT.exists():
        pytest.skip("the torchkiln console script is not installed next to this interpreter")
    return SCRIPT


@pytest.fixture
def cloned_repository(tmp_path: Path) -> Path:
    """A working directory with modules named like torch's dependencies, each of which writes
    ``pwned-<name>`` when imported, a model module of the user's own and a valid config."""
    for name in ("sympy", "numpy", "typing_extensions", "filelock", "jinja2"):
        marker = tmp_path / f"pwned-{name}"
        (tmp_path / f"{name}.py").write_text(PLANTED.format(marker=str(marker)))
    (tmp_path / "mymodels.py").write_text(
        textwrap.dedent(
            """
            from torch import nn

            def build():
                return nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4))
            """
        )
    )
    (tmp_path / "torchkiln.yaml").write_text("backend: eager\n")
    return tmp_path


def _run(script: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run(
        [str(script), *args], cwd=cwd, capture_output=True, text=True, timeout=300, env=environment
    )


@pytest.mark.parametrize(
    "command",
    [["config", "validate", "torchkiln.yaml"], ["plan", "mymodels:build", "--regions", "whole"]],
    ids=["config-validate", "plan-own-module"],
)
def test_no_command_runs_a_module_planted_in_the_working_directory(
    console_script: Path, cloned_repository: Path, command: list[str]
) -> None:
    """C1: the user's own ``mymodels`` is still found there, after the installed packages."""
    done = _run(console_script, cloned_repository, *command)
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in cloned_repository.glob("pwned-*")) == []
    if command[0] == "plan":
        assert "1 region in 1 group" in done.stdout


def test_the_working_directory_is_off_sys_path_after_a_spec_is_loaded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "mymodels_c1.py").write_text(
        "from torch import nn\n\ndef build():\n    return nn.Linear(2, 2)\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    before = list(sys.path)
    from torchkiln.examples import load_model

    assert type(load_model("mymodels_c1:build")).__name__ == "Linear"
    assert sys.path == before


def _cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code = cli.main(list(args))
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return code, err


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("../../evil:build", "nor 'package.module:factory' (dotted Python names)"),
        ("/etc/passwd:x", "dotted Python names"),
        ("mymodels:../build", "dotted Python names"),
        ("builtins:input", r"input() raised OSError"),
        ("json:loads", "loads() raised TypeError"),
        ("no_such_module_xyz:build", "cannot import 'no_such_module_xyz'"),
    ],
)
def test_bad_model_specs_are_one_clear_line(
    capsys: pytest.CaptureFixture[str], spec: str, message: str
) -> None:
    """T2. ``builtins:input`` reads stdin, which pytest closes (EOF in a pipe)."""
    code, err = _cli(capsys, "plan", spec)
    assert code == 2 and message in err, err


def test_an_unknown_device_is_one_clear_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, err = _cli(capsys, "precompile", "toy:2", "-o", str(tmp_path / "a"), "--device", "nope")
    assert code == 2 and "--device 'nope': not a usable device here" in err, err
    assert not (tmp_path / "a").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["plan", "toy:99999999999"], "depth 99999999999 must be a whole number from 1 to 1024"),
        (["plan", "toy:0"], "depth 0 must be a whole number from 1 to 1024"),
        (
            ["precompile", "toy:2", "-o", "unused", "--seq", "99999999999"],
            "99999999999 tokens; at most 16777216 per call",
        ),
        (["precompile", "gpt2:1", "-o", "unused", "--seq", "4096"], "at most 512 positions"),
    ],
)
def test_sizes_that_cannot_fit_are_refused_before_allocating(
    capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    """T3: refused within seconds (the huge toy used to allocate for 31 s, then crash)."""
    if "gpt2" in args[1]:
        pytest.importorskip("transformers")
    started = time.perf_counter()
    code, err = _cli(capsys, *args)
    assert code == 2 and message in err, err
    assert time.perf_counter() - started < 20


def test_a_model_larger_than_memory_is_refused_before_it_is_built(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sized on the meta device from depths 1 and 2; here the machine has 64 MiB."""
    import torchkiln.examples as examples

    pages = {"SC_PAGE_SIZE": 4096, "SC_PHYS_PAGES": 64 * 2**20 // 4096}
    monkeypatch.setattr(examples.os, "sysconf", lambda name: pages[name])
    built: list[int] = []
    real_toy = examples.EXAMPLES["toy"]

    def toy(depth: int = 4) -> object:
        built.append(depth)
        return real_toy(depth)

    monkeypatch.setitem(examples.EXAMPLES, "toy", toy)
    code, err = _cli(capsys, "plan", "toy:1000")
    assert code == 2 and "its weights need about 0.1 GiB, more than this machine's" in err
    assert built == [1, 2]  # only the two meta-device probes, never the 1000 blocks


def test_validating_a_file_that_is_not_a_configuration_prints_none_of_it(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    shadow = tmp_path / "shadow"
    shadow.write_text("r00tuser:$6$s3cr3tHash:19000:0:99999:7:::\ndaemon:*:19000:0:99999:7:::\n")
    broken = tmp_path / "broken"
    broken.write_text("token: [s3cr3tHash\n")
    for path in (shadow, broken):
        code, err = _cli(capsys, "config", "validate", str(path))
        assert code == 2
        assert "s3cr3tHash" not in err and "r00tuser" not in err, err
    assert "not a torchkiln configuration" in _cli(capsys, "config", "validate", str(shadow))[1]
    typo = tmp_path / "typo.yaml"
    typo.write_text("bakend: eager\n")  # a torchkiln file with a typo keeps its hint
    assert "did you mean 'backend'" in _cli(capsys, "config", "validate", str(typo))[1]
