"""``torchkiln precompile -o DIR`` never destroys what it did not write, and never loses the
previous entries: a non-empty directory that is not a store is refused untouched (issue 23,
D2); each entry is published with one rename and never changed, so a failed or interrupted
precompile leaves the directory as it was (D3); a directory that cannot be written is a clear
error, exit status 2 (T1)."""

from __future__ import annotations

import shutil
import signal
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from precompile_models import Stack, inputs, stack

import torchkiln
from torchkiln import cli
from torchkiln.artifacts.directory import MANIFEST, ArtifactError
from torchkiln.jobs.precompile import STORE_NAMES


def _snapshot(directory: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(directory)): p.read_bytes() for p in directory.rglob("*") if p.is_file()
    }


def _siblings(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.parent.iterdir() if p.name != directory.name)


def _precompile(model: torch.nn.Module, directory: Path) -> torchkiln.PrecompileResult:
    return torchkiln.precompile(model, inputs(), directory, backend="aot_eager")


@pytest.mark.needs_feature("precompiled artifacts")
def test_a_web_project_directory_is_refused_untouched(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "index.html").write_text("<html></html>")
    (site / MANIFEST).write_text('{"name": "my app", "start_url": "/"}')
    (site / "groups").mkdir()
    (site / "groups" / "admins.txt").write_text("alice")
    before = _snapshot(site)
    with pytest.raises(ArtifactError, match=r"is not empty and is not a torchkiln store"):
        _precompile(stack(), site)
    assert _snapshot(site) == before
    assert _siblings(site) == []  # no staging directory left behind


@pytest.mark.needs_feature("precompiled artifacts")
def test_a_store_with_a_foreign_file_is_refused(artifacts: Path, tmp_path: Path) -> None:
    copy = tmp_path / "artifacts"
    shutil.copytree(artifacts, copy)
    (copy / "notes.txt").write_text("mine")
    with pytest.raises(ArtifactError, match=r"notes\.txt"):
        _precompile(stack(), copy)
    assert (copy / "notes.txt").read_text() == "mine"


@pytest.mark.needs_feature("precompiled artifacts")
@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    names=st.lists(
        st.text(alphabet="abcdefghij._-", min_size=1, max_size=8).filter(
            lambda n: n not in {".", ".."} and n not in STORE_NAMES
        ),
        min_size=1,
        max_size=4,
        unique=True,
    ),
    manifest=st.one_of(st.none(), st.sampled_from(['{"format": 2}', "[]", "{", '"x"'])),
)
def test_any_directory_precompile_did_not_write_is_refused(
    tmp_path_factory: pytest.TempPathFactory, names: list[str], manifest: str | None
) -> None:
    """Refused before anything is compiled (cheap enough for a property)."""
    directory = tmp_path_factory.mktemp("foreign") / "out"
    directory.mkdir()
    for name in names:
        (directory / name).write_text(name)
    if manifest is not None:
        (directory / MANIFEST).write_text(manifest)
    before = _snapshot(directory)
    with pytest.raises(ArtifactError, match="not a torchkiln store"):
        _precompile(stack(), directory)
    assert _snapshot(directory) == before
    assert _siblings(directory) == []


@pytest.mark.needs_feature("precompiled artifacts")
def test_an_empty_directory_is_filled_and_a_store_added_to(tmp_path: Path) -> None:
    directory = tmp_path / "empty"
    directory.mkdir()
    first = torchkiln.precompile(
        stack(), inputs(), directory, backend="aot_eager", kinds=["inference"]
    )
    assert first.path == str(directory) and first.entries == 1
    second = _precompile(stack(), directory)
    assert (second.groups[0].kind, second.groups[0].path) == ("inference", first.groups[0].path)
    assert second.groups[0].compile_seconds == 0.0  # found, kept as it was
    assert second.entries == 3 and min(e.compile_seconds for e in second.groups[1:]) > 0
    assert sorted(p.name for p in directory.iterdir()) == ["entries"]
    assert _siblings(directory) == []


class Raises(Stack):
    """Fails on its first call, as a model with a bug would (nothing gets compiled)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise ValueError("the model has a bug")


class Interrupted(Stack):
    """Ctrl-C during the first call: a real SIGINT, delivered to this process."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        signal.raise_signal(signal.SIGINT)
        return x


@pytest.mark.needs_feature("precompiled artifacts")
@pytest.mark.parametrize(
    ("model", "raised"),
    [(Raises, ValueError), (Interrupted, KeyboardInterrupt)],
    ids=["model-raises", "sigint"],
)
def test_a_failed_precompile_keeps_the_previous_artifacts(
    artifacts: Path, tmp_path: Path, model: type[Stack], raised: type[BaseException]
) -> None:
    copy = tmp_path / "artifacts"
    shutil.copytree(artifacts, copy)
    before = _snapshot(copy)
    torch.manual_seed(0)
    # Python's own Ctrl-C handler: a library an earlier test in this worker imported (a
    # trainer's signal connector, say) may have left another one installed.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(raised):
            _precompile(model(), copy)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert _snapshot(copy) == before
    assert _siblings(copy) == []
    loaded = torchkiln.compile(stack(), backend="aot_eager", artifacts=str(copy), progress="off")
    with torch.no_grad():
        torch.testing.assert_close(loaded(inputs()), stack()(inputs()))


@pytest.mark.needs_feature("precompiled artifacts")
@pytest.mark.parametrize("where", ["read-only", "under-a-file"])
def test_an_output_that_cannot_be_written_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], where: str
) -> None:
    """T1: exit status 2 and one line naming the directory, no traceback. ``/sys`` is
    read-only in containers and root-only elsewhere: it cannot be written either way."""
    (tmp_path / "file").write_text("x")
    output = "/sys/torchkiln-artifacts" if where == "read-only" else str(tmp_path / "file" / "out")
    code = cli.main(
        ["precompile", "precompile_models:stack", "-o", output, "--backend", "aot_eager"]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert f"torchkiln: error: artifacts directory '{output}' cannot be written" in err
    assert "Traceback" not in err
