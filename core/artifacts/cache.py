"""Persistent compile cache: where compiled artifacts live, and how to carry them elsewhere.

Two mechanisms, both torch's own:

1. **The cache directory** of inductor's FX-graph and AOTAutograd caches, which torch reads
   from ``TORCHINDUCTOR_CACHE_DIR``. The variable is process-wide, hence the explicit
   ``cache_dir`` option: :func:`apply_cache_dir` sets it, clears inductor's memoised paths,
   and returns a handle that restores the previous value.
2. **Portable cache artifacts**: :func:`save_cache_artifacts` / :func:`load_cache_artifacts`
   carry torch's cache entries in a file to another process, whose first compile then hits.

``docs/cache.md`` says how it works and how to share one directory between ranks and machines.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

import attrs

from torchkiln._internals import inductor
from torchkiln.engine import settings
from torchkiln.errors import TorchkilnError
from torchkiln.files import write_atomic

CACHE_DIR_ENV = "TORCHINDUCTOR_CACHE_DIR"
"""The environment variable inductor (and AOTAutograd, and Dynamo's PGO) read for the cache
location."""


def hold_variable(
    name: str, value: str, after_write: Callable[[], Any] = lambda: None
) -> settings.Hold:
    """Set the environment variable ``name`` to ``value`` until the returned hold is released
    (:func:`torchkiln.engine.settings.hold_setting`); ``after_write`` runs after each write."""

    def write(new: str | None) -> None:
        if new is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = new
        after_write()

    return settings.hold_setting(f"env:{name}", value, lambda: os.environ.get(name), write)


@attrs.define
class CacheDirSetting:
    """The cache directory in force since :func:`apply_cache_dir`, and what it replaced.

    Use it as a context manager, or call :meth:`restore` when done. Several settings can be
    alive at once (two compiled models with their own ``cache_dir``): the most recent live one
    is in force, and releasing them in any order ends with the value from before the first.
    """

    path: str
    """The absolute cache directory now in force."""
    hold: settings.Hold = attrs.field(repr=False)

    def restore(self) -> None:
        """Give the directory up (idempotent): the previous holder's directory, or the value
        from before any, is back in force, unless someone else changed the variable since."""
        self.hold.release()

    def __enter__(self) -> CacheDirSetting:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.restore()


def check_cache_dir(path: str | os.PathLike[str]) -> Path:
    """The absolute directory for ``path``, or :class:`TorchkilnError` when it cannot be one
    (an existing file, or a location that cannot be created). Creates nothing."""
    directory = Path(path).expanduser().resolve()
    for parent in (directory, *directory.parents):
        if parent.exists():
            if not parent.is_dir():
                raise TorchkilnError(
                    f"cache_dir {str(path)!r} cannot be a directory: {str(parent)!r} exists and "
                    "is not a directory"
                )
            if not os.access(parent, os.W_OK | os.X_OK):
                raise TorchkilnError(
                    f"cache_dir {str(path)!r} cannot be created or written: {str(parent)!r} is "
                    "not writable"
                )
            break
    return directory


def apply_cache_dir(path: str | os.PathLike[str]) -> CacheDirSetting:
    """Point inductor's FX-graph and AOTAutograd caches at ``path`` (created if missing).

    :return: a :class:`CacheDirSetting`; its ``restore()`` (or leaving it as a context
        manager) puts the previous directory back.
    :raises TorchkilnError: when ``path`` exists and is not a directory, or cannot be created.
    """
    directory = check_cache_dir(path)
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError) as error:
        raise TorchkilnError(f"cache_dir {str(path)!r} exists and is not a directory") from error
    except OSError as error:
        raise TorchkilnError(f"cache_dir {str(path)!r} cannot be created: {error}") from error
    # paths derived from the cache dir are memoised in process: cleared at each change
    held = hold_variable(CACHE_DIR_ENV, str(directory), inductor.clear_caches)
    return CacheDirSetting(path=str(directory), hold=held)


def current_cache_dir() -> str:
    """The directory inductor uses now (the environment variable, else torch's default)."""
    return os.path.abspath(os.environ.get(CACHE_DIR_ENV) or inductor.default_cache_dir())


def cache_dir_environment(path: str | os.PathLike[str]) -> dict[str, str]:
    """Environment entries that make a child process (a bench worker, a launched rank) use
    ``path`` as its compile cache from its first compile on."""
    return {CACHE_DIR_ENV: str(Path(path).expanduser().resolve())}


def save_cache_artifacts(path: str | os.PathLike[str]) -> Any:
    """Write torch's portable cache artifacts of this process to ``path``.

    The artifacts are every compile-cache entry this process created or loaded so far, so
    call it after the compiled model's first calls (forward, and backward when training).

    :return: torch's ``CacheInfo`` (which artifacts were saved, by kind).
    :raises TorchkilnError: when nothing has been compiled in this process yet.
    """
    import torch

    result = torch.compiler.save_cache_artifacts()
    if result is None:
        raise TorchkilnError(
            "no compile cache artifacts to save: nothing has been compiled in this process "
            "yet (run the compiled model first, forward and backward if you train)"
        )
    blob, info = result
    target = Path(path).expanduser()
    target.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(target, blob)  # another rank may be reading it
    return info


def load_cache_artifacts(path: str | os.PathLike[str]) -> Any:
    """Load portable cache artifacts written by :func:`save_cache_artifacts` into this
    process's compile caches, so the next compile of the same graphs is a cache hit.

    Call it before the first compiled call.

    :return: torch's ``CacheInfo`` of what was loaded.
    :raises TorchkilnError: when ``path`` does not exist, cannot be read, or holds nothing this
        torch version can load.
    """
    import torch

    source = Path(path).expanduser()
    try:
        blob = source.read_bytes()
    except FileNotFoundError as error:
        raise TorchkilnError(f"cache artifacts file {str(path)!r} does not exist") from error
    except OSError as error:
        raise TorchkilnError(
            f"cache artifacts file {str(path)!r} cannot be read: {error}"
        ) from error
    info = torch.compiler.load_cache_artifacts(blob)
    if info is None:
        raise TorchkilnError(
            f"cache artifacts file {str(path)!r} holds nothing torch {torch.__version__} can "
            "load (not written by save_cache_artifacts, or by another torch version)"
        )
    return info
