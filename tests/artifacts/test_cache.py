"""The persistent compile cache: the cache directory setting, and portable cache artifacts
saved in one process and loaded in another."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from torchkiln import TorchkilnError
from torchkiln.artifacts.cache import (
    CACHE_DIR_ENV,
    apply_cache_dir,
    cache_dir_environment,
    current_cache_dir,
    load_cache_artifacts,
    save_cache_artifacts,
)


@pytest.fixture(autouse=True)
def keep_cache_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Whatever a test does to TORCHINDUCTOR_CACHE_DIR is undone afterwards."""
    previous = os.environ.get(CACHE_DIR_ENV)
    yield
    if previous is None:
        os.environ.pop(CACHE_DIR_ENV, None)
    else:
        os.environ[CACHE_DIR_ENV] = previous


def test_apply_sets_the_directory_inductor_reads_and_restore_puts_it_back(tmp_path: Path) -> None:
    from torch._inductor.codecache import FxGraphCache
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    os.environ[CACHE_DIR_ENV] = str(tmp_path / "before")
    setting = apply_cache_dir(tmp_path / "mine")
    mine = str((tmp_path / "mine").resolve())
    assert setting.path == mine and (tmp_path / "mine").is_dir()
    assert cache_dir() == mine == current_cache_dir()
    assert FxGraphCache._get_tmp_dir() == os.path.join(mine, "fxgraph")
    setting.restore()
    assert os.environ[CACHE_DIR_ENV] == str(tmp_path / "before")
    setting.restore()  # idempotent
    assert os.environ[CACHE_DIR_ENV] == str(tmp_path / "before")


def test_restore_unsets_a_variable_that_was_unset(tmp_path: Path) -> None:
    os.environ.pop(CACHE_DIR_ENV, None)
    with apply_cache_dir(tmp_path / "scoped") as setting:
        assert os.environ[CACHE_DIR_ENV] == setting.path
    assert CACHE_DIR_ENV not in os.environ


def test_restore_leaves_a_later_change_alone(tmp_path: Path) -> None:
    setting = apply_cache_dir(tmp_path / "a")
    os.environ[CACHE_DIR_ENV] = str(tmp_path / "someone-else")
    setting.restore()
    assert os.environ[CACHE_DIR_ENV] == str(tmp_path / "someone-else")


def test_a_file_is_not_a_cache_directory(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(TorchkilnError, match="exists and is not a directory"):
        apply_cache_dir(blocker)


def test_environment_for_child_processes(tmp_path: Path) -> None:
    assert cache_dir_environment(tmp_path / "c") == {CACHE_DIR_ENV: str((tmp_path / "c").resolve())}


def test_save_refuses_when_nothing_was_compiled(tmp_path: Path) -> None:
    from torch.compiler._cache import CacheArtifactManager

    with (
        CacheArtifactManager.with_fresh_cache(),
        pytest.raises(TorchkilnError, match="nothing has been compiled"),
    ):
        save_cache_artifacts(tmp_path / "a.bin")
    assert not (tmp_path / "a.bin").exists()


def test_load_names_a_missing_or_unreadable_file(tmp_path: Path) -> None:
    with pytest.raises(TorchkilnError, match="does not exist"):
        load_cache_artifacts(tmp_path / "missing.bin")
    junk = tmp_path / "junk.bin"
    junk.write_bytes(b"not cache artifacts")
    with pytest.raises(TorchkilnError, match="holds nothing torch"):
        load_cache_artifacts(junk)


# One small inductor compile per process: 'save' compiles and writes the artifacts, 'load'
# loads them into an empty cache directory first, 'disk' only reuses a directory.
SCRIPT = textwrap.dedent(
    """
    import json, sys
    import torch
    from torch._dynamo.utils import counters
    from torchkiln.artifacts.cache import apply_cache_dir, load_cache_artifacts, save_cache_artifacts

    mode, cache_dir, artifacts = sys.argv[1:4]
    apply_cache_dir(cache_dir)
    if mode == "load":
        info = load_cache_artifacts(artifacts)
        print("loaded", len(info.inductor_artifacts), file=sys.stderr)

    def f(x):
        return torch.sin(x) * 2 + torch.cos(x)

    x = torch.arange(8, dtype=torch.float32)
    out = torch.compile(f, backend="inductor")(x)
    assert torch.allclose(out, f(x))
    if mode == "save":
        save_cache_artifacts(artifacts)
    print(json.dumps({
        "hits": counters["inductor"]["fxgraph_cache_hit"],
        "misses": counters["inductor"]["fxgraph_cache_miss"],
    }))
    """
)


def _run(tmp_path: Path, mode: str, cache_dir: Path, artifacts: Path) -> dict[str, int]:
    script = tmp_path / "compile_once.py"
    script.write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if k != CACHE_DIR_ENV}
    done = subprocess.run(
        [sys.executable, str(script), mode, str(cache_dir), str(artifacts)],
        capture_output=True, text=True, env=env, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # three processes, one inductor compile each (20-70 s on 2 cores)
def test_artifacts_and_directory_survive_across_processes(tmp_path: Path) -> None:
    artifacts = tmp_path / "artifacts" / "mega.bin"
    first_dir, second_dir = tmp_path / "first", tmp_path / "second"
    assert _run(tmp_path, "save", first_dir, artifacts) == {"hits": 0, "misses": 1}
    assert artifacts.stat().st_size > 0
    assert any((first_dir / "fxgraph").rglob("*")), "inductor wrote its FX graph cache there"
    # A fresh, empty directory: the loaded artifacts make the compile a cache hit.
    assert _run(tmp_path, "load", second_dir, artifacts) == {"hits": 1, "misses": 0}
    # The first directory alone (no artifacts) also makes it a hit: the cache persisted.
    assert _run(tmp_path, "disk", first_dir, artifacts) == {"hits": 1, "misses": 0}


def test_the_docs_example_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/cache.md's first Python example, as written (eager backend, so it is quick)."""
    text = (Path(__file__).parents[2] / "docs" / "cache.md").read_text()
    example = text.split("```python\n", 1)[1].split("```", 1)[0]
    monkeypatch.chdir(tmp_path)
    torch._dynamo.reset()
    exec(compile(example, "docs/cache.md", "exec"), {})
    assert (tmp_path / "compile-cache").is_dir()


def test_compile_applies_cache_dir_and_decompile_restores_it(tmp_path: Path) -> None:
    import torchkiln
    from torchkiln.examples import toy

    os.environ[CACHE_DIR_ENV] = str(tmp_path / "before")
    model = torchkiln.compile(
        toy(depth=2), backend="eager", cache_dir=str(tmp_path / "kiln"), progress="off"
    )
    assert os.environ[CACHE_DIR_ENV] == str((tmp_path / "kiln").resolve())
    torchkiln.decompile(model)
    assert os.environ[CACHE_DIR_ENV] == str(tmp_path / "before")
