"""Per-region progress while the first (compiling) calls run, from each region's first-call
step (``start`` before, ``done`` after), so nothing here stays on the forward path::

    compiling 1/2 groups: LlamaDecoderLayer (model.layers.0) ...
    compiled 2 groups (17 regions) in 14.2 s

On a terminal the line is rewritten in place; on a plain stream (``progress="on"``) one line
is written when each group starts compiling and one when it finishes.
"""

from __future__ import annotations

import sys
from typing import Protocol, TextIO

from torchkiln.configuration.config import CompileConfig
from torchkiln.plugin_host.region_plan import Region, RegionPlan

_CLEAR_LINE = "\r\x1b[K"


class ProgressObserver(Protocol):
    def start(self, region: Region, group_index: int, group_count: int) -> None: ...
    def done(self, region: Region, seconds: float, compiled: bool) -> None: ...


class NullProgress:
    """Shows nothing."""

    def start(self, region: Region, group_index: int, group_count: int) -> None:
        pass

    def done(self, region: Region, seconds: float, compiled: bool) -> None:
        pass


def _describe(region: Region) -> str:
    return f"{type(region.module).__name__} ({region.display_path})"


def _plural(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


class StreamProgress:
    """Writes progress lines to ``stream``; rewrites one line in place when ``live``."""

    def __init__(self, stream: TextIO, region_count: int, *, live: bool):
        self.stream = stream
        self.region_count = region_count
        self.live = live
        self.finished = 0
        self.seconds = 0.0
        self.groups_started: set[int] = set()
        self.groups_done: set[int] = set()
        self.group_count = 0
        self._current_group: dict[int, int] = {}
        """id(region.module) -> group index, to say which group a ``done`` belongs to."""

    def start(self, region: Region, group_index: int, group_count: int) -> None:
        self.group_count = group_count
        self._current_group[id(region.module)] = group_index
        first_of_group = group_index not in self.groups_started
        self.groups_started.add(group_index)
        position = f"{group_index + 1}/{group_count}"
        if self.live:
            verb = "compiling" if first_of_group else "reusing"
            self._write(f"{_CLEAR_LINE}{verb} {position} groups: {_describe(region)} ...")
        elif first_of_group:
            self._write(f"compiling {position} groups: {_describe(region)} ...\n")

    def done(self, region: Region, seconds: float, compiled: bool) -> None:
        self.finished += 1
        self.seconds += seconds
        group_index = self._current_group.pop(id(region.module), None)
        if group_index is not None and group_index not in self.groups_done:
            self.groups_done.add(group_index)
            if not self.live:
                # Later regions of a group reuse its compiled code: one line per group is enough.
                verb = "compiled" if compiled else "ran eagerly"
                where = f"group {group_index + 1}/{self.group_count}: "
                self._write(f"{verb} {where}{_describe(region)} in {seconds:.1f} s\n")
        if self.finished == self.region_count:
            summary = (
                f"compiled {_plural(len(self.groups_started), 'group')} "
                f"({_plural(self.region_count, 'region')}) in {self.seconds:.1f} s"
            )
            self._write(f"{_CLEAR_LINE if self.live else ''}{summary}\n")

    def _write(self, text: str) -> None:
        self.stream.write(text)
        self.stream.flush()


def _is_terminal(stream: TextIO) -> bool:
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty())
    except ValueError:  # closed stream
        return False


def make_progress(
    config: CompileConfig, plan: RegionPlan, *, stream: TextIO | None = None
) -> ProgressObserver:
    """Return the progress display for one compiled model.

    ``config.progress``: ``auto`` shows progress only when ``stream`` (standard error by
    default) is a terminal, ``on`` always, ``off`` never. Nothing is shown when nothing will
    be compiled (``config.enabled`` false, or an empty plan).
    """
    target = stream if stream is not None else sys.stderr
    if config.progress == "off" or not config.enabled or plan.region_count == 0:
        return NullProgress()
    terminal = _is_terminal(target)
    if config.progress == "auto" and not terminal:
        return NullProgress()
    return StreamProgress(target, plan.region_count, live=terminal)
