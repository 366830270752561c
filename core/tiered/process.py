"""Starting and watching the builder process from the user's process."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from torchkiln.tiered.builder import REQUEST, RESULT, SYS_PATH
from torchkiln.tiered.hollow import dumps_hollow


class BuilderProcess:
    """One builder: its private work directory, the child process, its result."""

    def __init__(self, request: dict[str, Any], threads: int):
        self.workdir = Path(tempfile.mkdtemp(prefix="torchkiln-tiered-"))  # mode 0700
        (self.workdir / SYS_PATH).write_text(json.dumps(sys.path), encoding="utf-8")
        (self.workdir / REQUEST).write_bytes(dumps_hollow(request))
        env = dict(os.environ)
        for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "TORCHINDUCTOR_COMPILE_THREADS"):
            env[name] = str(threads)
        self.log = open(self.workdir / "builder.log", "wb")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "torchkiln.tiered.builder", str(self.workdir)],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        self.result: dict[str, Any] | None = None

    def poll(self) -> dict[str, Any] | None:
        """The builder's result once it has exited, else ``None`` (never blocks)."""
        if self.result is not None:
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

    def wait(self, timeout: float | None = None) -> dict[str, Any] | None:
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
        return self.poll()

    def stop(self) -> None:
        """Kill the builder if it still runs and remove its work directory."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self.log.close()
        shutil.rmtree(self.workdir, ignore_errors=True)
