"""How the ranks of a job talk while they share a compile: one gloo process group of torchkiln's
own, so its timeout is ``job.timeout`` whatever the job's own group uses (NCCL included), and
every wait names the rank it waits for.

Two operations, each a collective every rank of the job enters in the same order:

- :meth:`JobExchange.gather`: every rank's object, after a monitored barrier (gloo's, which
  names the ranks that did not arrive in time);
- :meth:`JobExchange.broadcast`: bytes from one rank to all, polled so that a long compile on
  the sending rank shows progress on the others and ends, at ``job.timeout``, in a
  :class:`~torchkiln.errors.JobError` naming the sender.

A job of one process (no process group, or a world of one) has an exchange that does nothing:
a store (``job.store``) still serves a restarted single process.
"""

from __future__ import annotations

import contextlib
import logging
import pickle
import sys
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import torch

from torchkiln.errors import JobError

logger = logging.getLogger("torchkiln")

POLL_SECONDS = 0.005
NOTE_EVERY_SECONDS = 15.0
"""How often a waiting rank says what it waits for (on stderr, when progress is on)."""


def job_world() -> tuple[int, int]:
    """``(rank, world size)`` of the job this process belongs to; ``(0, 1)`` outside one."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


class JobExchange:
    """The collectives torchkiln runs between the ranks of one job."""

    def __init__(self, timeout: float, progress: bool):
        self.rank, self.world = job_world()
        self.timeout = timeout
        self.progress = progress
        self.group: Any = None
        self.transfer_seconds = 0.0
        """The last broadcast's data transfer alone (after its size arrived)."""
        if self.world > 1:
            import torch.distributed as dist

            # A gloo group of torchkiln's own: CPU tensors whatever the job's backend, and a
            # timeout a little above job.timeout, so that the polling below fires first and
            # names the rank.
            self.group = dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout + 30))

    def gather(self, obj: Any, what: str) -> list[Any]:
        """Every rank's ``obj``, in rank order, once every rank has reached ``what``."""
        if self.world == 1:
            return [obj]
        import torch.distributed as dist

        started = time.monotonic()
        try:
            with self._noting(f"waiting for every rank to reach {what}", started):
                dist.monitored_barrier(
                    group=self.group, timeout=timedelta(seconds=self.timeout), wait_all_ranks=True
                )
        except RuntimeError as error:
            raise JobError(
                f"rank {self.rank}: not every rank of the job reached {what} within "
                f"{self.timeout:.0f} s (job.timeout): {_first_line(error)}"
            ) from error
        gathered: list[Any] = [None] * self.world
        dist.all_gather_object(gathered, obj, group=self.group)
        logger.debug("torchkiln: gathered %s in %.3f s", what, time.monotonic() - started)
        return gathered

    def broadcast(self, data: bytes | None, source: int, what: str) -> bytes:
        """``data`` from rank ``source`` (ignored elsewhere) on every rank."""
        if self.world == 1:
            assert data is not None
            return data
        import torch.distributed as dist

        sending = self.rank == source
        size = torch.tensor([len(data) if sending and data is not None else 0], dtype=torch.int64)
        started = time.monotonic()
        self._wait(
            dist.broadcast(size, source, group=self.group, async_op=True), source, what, started
        )
        if int(size.item()) == 0:  # every rank knows the size now: nothing more to send
            return b""
        if sending:
            assert data is not None
            buffer = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        else:
            buffer = torch.empty(int(size.item()), dtype=torch.uint8)
        transfer = time.monotonic()
        self._wait(
            dist.broadcast(buffer, source, group=self.group, async_op=True), source, what, started
        )
        self.transfer_seconds = time.monotonic() - transfer
        return data if sending and data is not None else buffer.numpy().tobytes()

    def broadcast_object(self, obj: Any, source: int, what: str) -> Any:
        """A picklable object from rank ``source``: the ranks of one job trust each other (an
        artifact is code either way; docs/jobs.md, "Trust")."""
        data = pickle.dumps(obj) if self.rank == source else None
        received = self.broadcast(data, source, what)
        return obj if self.rank == source else pickle.loads(received)

    def _wait(self, work: Any, source: int, what: str, started: float) -> None:
        deadline = started + self.timeout
        note_at = time.monotonic() + NOTE_EVERY_SECONDS
        while not work.is_completed():
            now = time.monotonic()
            if now > deadline:
                raise JobError(
                    f"rank {self.rank}: rank {source} did not send {what} within "
                    f"{self.timeout:.0f} s (job.timeout)"
                )
            if now > note_at and self.rank != source:
                self._note(f"waiting for rank {source}: {what} ({now - started:.0f} s)")
                note_at = now + NOTE_EVERY_SECONDS
            time.sleep(POLL_SECONDS)
        try:
            work.wait()
        except RuntimeError as error:
            raise JobError(
                f"rank {self.rank}: rank {source} failed or left while this rank waited for "
                f"{what}: {_first_line(error)}"
            ) from error

    @contextlib.contextmanager
    def _noting(self, text: str, started: float) -> Iterator[None]:
        """Say ``text`` every :data:`NOTE_EVERY_SECONDS` while the block runs. gloo's monitored
        barrier blocks this thread, so a thread of its own says it; that thread only prints
        (Dynamo and inductor never run there)."""
        done = threading.Event()

        def note() -> None:
            while not done.wait(NOTE_EVERY_SECONDS):
                self._note(f"{text} ({time.monotonic() - started:.0f} s)")

        thread = threading.Thread(target=note, name="torchkiln-job-notes", daemon=True)
        thread.start()
        try:
            yield
        finally:
            done.set()
            thread.join()

    def _note(self, text: str) -> None:
        logger.info("torchkiln: rank %d: %s", self.rank, text)
        if self.progress:
            print(f"torchkiln: rank {self.rank}: {text}", file=sys.stderr, flush=True)


def _first_line(error: BaseException) -> str:
    first = next((line for line in str(error).splitlines() if line.strip()), type(error).__name__)
    return first[:400]
