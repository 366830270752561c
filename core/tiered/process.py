"""Starting and watching the builder process from the user's process."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from torchkiln.tiered.builder import GO, PRELOAD, REQUEST, RESULT, SYS_PATH
from torchkiln.tiered.weightless import dumps_weightless

IDLE_CHECK_SECONDS = 0.25
IDLE_CPU_SHARE = 0.1
"""Below this share of one core over a check, the user's process counts as idle."""


class BuilderProcess:
    """One builder: its private work directory, the child process, its result.

    The child starts at once and imports what it will need (``preload``: module names), then
    waits; :meth:`start` gives it the request.
    """

    def __init__(self, threads: int, preload: list[str] | None = None):
        self.workdir = Path(tempfile.mkdtemp(prefix="torchkiln-tiered-"))  # mode 0700
        (self.workdir / SYS_PATH).write_text(json.dumps(sys.path), encoding="utf-8")
        (self.workdir / PRELOAD).write_text(json.dumps(preload or []), encoding="utf-8")
        env = dict(os.environ)
        for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "TORCHINDUCTOR_COMPILE_THREADS"):
            env[name] = str(threads)
        self.log = open(self.workdir / "builder.log", "wb")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "torchkiln.tiered.builder", str(self.workdir)],
            env=env,
            stdin=subprocess.PIPE,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            # a group of its own, in the user's session: pause() stops the C++ compilers it
            # starts too, and if the user's process dies while the builder is paused, the
            # orphaned group gets SIGHUP and SIGCONT from the kernel instead of staying stopped
            process_group=0,
        )
        self.result: dict[str, Any] | None = None
        self.started = False
        self.paused = False
        self.resumed_idle = False
        """Whether a pause ended early because this process idled (the step is not measured)."""
        self._lock = threading.Lock()
        self._idle_watch = threading.Event()
        self.nice = 0
        """The niceness :meth:`lower_priority` set (the builder adds ``tiered.nice`` itself)."""

    def start(self, request: dict[str, Any]) -> None:
        """Write the request and tell the waiting child to build it."""
        (self.workdir / REQUEST).write_bytes(dumps_weightless(request))
        self.started = True
        assert self.process.stdin is not None
        try:
            self.process.stdin.write(GO)
            self.process.stdin.close()
        except BrokenPipeError:  # the child died while waiting: poll() reads its log
            pass

    def poll(self) -> dict[str, Any] | None:
        """The builder's result once it has exited, else ``None`` (never blocks)."""
        if self.result is not None or not self.started:
            return self.result
        if self.process.poll() is None:
            return None
        path = self.workdir / RESULT
        if path.exists():
            self.result = json.loads(path.read_text(encoding="utf-8"))
        else:
            tail = (self.workdir / "builder.log").read_bytes()[-2000:].decode(errors="replace")
            self.result = {
                "ok": False,
                "error": f"the builder exited with status {self.process.returncode}: {tail}",
            }
        self.log.close()
        return self.result

    def pause(self, paused: bool) -> None:
        """Stop (``True``) or continue (``False``) the builder and every process it started;
        see :mod:`torchkiln.tiered.governor` for when. While it is stopped, a watcher resumes it
        as soon as this process idles (:meth:`_resume_when_idle`)."""
        if paused == self.paused or self.process.poll() is not None:
            return
        with self._lock:
            self._idle_watch.set()  # a watcher of an earlier pause ends
            try:
                os.killpg(self.process.pid, signal.SIGSTOP if paused else signal.SIGCONT)
            except ProcessLookupError:  # it exited meanwhile: poll() reads its result
                return
            self.paused = paused
            if paused:
                self._idle_watch = threading.Event()
                threading.Thread(
                    target=self._resume_when_idle,
                    args=(self._idle_watch,),
                    name="torchkiln-builder-idle",
                    daemon=True,
                ).start()

    def _resume_when_idle(self, done: threading.Event) -> None:
        """Continue the paused builder once this process idles (less than a tenth of a core over
        a quarter second: no steps to slow); that step is not measured (:attr:`resumed_idle`).
        This thread only sends a signal: no compile work runs on it (Dynamo is not thread-safe)."""
        cpu, wall = time.process_time(), time.monotonic()
        while not done.wait(IDLE_CHECK_SECONDS):
            cpu_now, wall_now = time.process_time(), time.monotonic()
            idle = (cpu_now - cpu) < IDLE_CPU_SHARE * (wall_now - wall)
            cpu, wall = cpu_now, wall_now
            if not idle:
                continue
            with self._lock:
                if done.is_set() or not self.paused:
                    return
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.process.pid, signal.SIGCONT)
                self.paused, self.resumed_idle = False, True
            return

    def lower_priority(self, nice: int) -> None:
        """Give the builder and every process it started (and will start) niceness ``nice``
        (only ever lowered: raising it back needs privileges a user may not have)."""
        if nice <= self.nice or self.process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.setpriority(os.PRIO_PGRP, self.process.pid, nice)
            self.nice = nice

    def wait(self, timeout: float | None = None) -> dict[str, Any] | None:
        if not self.started:
            return None
        self.pause(False)  # a paused builder would never finish
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
        return self.poll()

    def stop(self) -> None:
        """Kill the builder (and the compilers it started) if it still runs and remove its work
        directory."""
        self._idle_watch.set()
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):  # SIGKILL ends a stopped one too
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        if self.process.stdin is not None and not self.process.stdin.closed:
            self.process.stdin.close()
        self.log.close()
        shutil.rmtree(self.workdir, ignore_errors=True)
