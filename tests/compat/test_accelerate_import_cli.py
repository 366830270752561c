"""``torchkiln config import-accelerate FILE``: the printed YAML loads back through torchkiln's
own configuration loader and means what the Accelerate file meant."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest

from torchkiln.cli.commands import main
from torchkiln.engine.resolve import resolve_config

FULL = """\
compute_environment: LOCAL_MACHINE
distributed_type: MULTI_GPU
dynamo_config:
  dynamo_backend: INDUCTOR
  dynamo_mode: max-autotune
  dynamo_use_dynamic: false
  dynamo_use_fullgraph: true
  dynamo_use_regional_compilation: true
mixed_precision: bf16
num_processes: 2
"""

EXPECTED_FULL = """\
# torchkiln configuration imported from Accelerate's accelerate.yaml ({path})
# dynamo_use_dynamic: false leaves dynamic unset (torch's automatic dynamic shapes); write `dynamic: false` to force static shapes
# distributed_type MULTI_GPU: to let torchkiln wrap the model instead of Accelerate, add `distributed: ddp`
# not compile settings, not imported: compute_environment, distributed_type, mixed_precision, num_processes
backend: inductor
mode: max-autotune
fullgraph: true
regions:
  strategy: repeated
  rest: leaves
"""


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["config", "import-accelerate", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def write(tmp_path: Path, text: str, name: str = "accelerate.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_prints_the_equivalent_yaml(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = write(tmp_path, FULL)
    code, out, _ = run(capsys, str(path))
    assert code == 0
    assert out == EXPECTED_FULL.format(path=path)


def test_output_round_trips_through_the_config_loader(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write(tmp_path, FULL)
    output = tmp_path / "torchkiln.yaml"
    code, out, _ = run(capsys, str(path), "--output", str(output))
    assert code == 0 and out == f"wrote {output}\n"
    loaded = resolve_config(output)
    config = loaded.config
    assert (config.backend, config.mode, config.fullgraph, config.dynamic) == (
        "inductor",
        "max-autotune",
        True,
        None,
    )
    assert (config.regions.strategy, config.regions.rest) == ("repeated", "leaves")
    assert loaded.sources["backend"] == f"file:{output}"
    # The plugin reading the Accelerate file directly lands on the same configuration.
    monkeypatch.setenv("TORCHKILN_ACCELERATE_CONFIG", str(path))
    via_plugin = resolve_config(config={}).config
    assert attrs.asdict(via_plugin) == attrs.asdict(config)


@pytest.mark.parametrize(
    ("text", "backend"),
    [
        ("dynamo_config:\n  dynamo_backend: aot_eager\n", "aot_eager"),
        ("dynamo_backend: EAGER\n", "eager"),  # the older top-level form
        ("dynamo_backend: 'NO'\n", "no"),
        ("distributed_type: 'NO'\n", "no"),  # no dynamo section: Accelerate's default, off
    ],
)
def test_backends_round_trip(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, text: str, backend: str
) -> None:
    code, out, _ = run(capsys, str(write(tmp_path, text)))
    assert code == 0
    output = write(tmp_path, out, "torchkiln.yaml")
    assert resolve_config(output).config.backend == backend


def test_dynamo_off_says_so_and_what_it_ignored(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    text = "dynamo_config:\n  dynamo_backend: 'NO'\n  dynamo_use_fullgraph: true\n"
    _, out, _ = run(capsys, str(write(tmp_path, text)))
    assert "# dynamo is off in this file (backend NO): torchkiln compiles nothing\n" in out
    assert "# ignored with dynamo off, as in Accelerate: fullgraph\n" in out
    assert out.endswith("backend: 'no'\n")  # quoted: a bare `no` is YAML's false


def test_backend_without_equivalent_fails_with_the_reason(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = write(tmp_path, "dynamo_config:\n  dynamo_backend: OFI\n")
    code, out, err = run(capsys, str(path))
    assert code == 2 and out == ""
    assert (
        f"$.backend (from file:{path}): Accelerate's dynamo backend 'OFI' has no torchkiln backend"
        in err
    )


def test_missing_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = run(capsys, str(tmp_path / "missing.yaml"))
    assert code == 2 and "cannot read the Accelerate config file" in err
