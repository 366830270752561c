"""``remote_cache: redis://HOST:PORT``: torch's own remote caches on a Redis server, so that the
kernels a job compiled reach the next job on fresh machines (docs/cache.md, "Remote caches").

Turned on for the compiled model's lifetime (process-wide, as ``cache_dir``; ``decompile`` puts
the previous settings back): inductor's remote FX-graph cache, its autotuning cache and
AOTAutograd's remote cache, all pointed at the URL through ``TORCHINDUCTOR_REDIS_URL``, the
variable torch's Redis client reads each time it connects.

Torch treats an unreachable server as a miss and compiles on, without a word. So
:class:`RemoteCacheWatch` counts the traffic torch records, and asks the server itself when the
report is built: the report says how many lookups hit, missed and were written, and whether the
server answered.
"""

from __future__ import annotations

from typing import Any

import attrs

from torchkiln._internals import inductor
from torchkiln.artifacts.cache import hold_variable
from torchkiln.configuration.value_checks import remote_cache_problem
from torchkiln.engine import settings

__all__ = [
    "RemoteCacheReport",
    "RemoteCacheWatch",
    "apply_remote_cache",
    "ping",
    "remote_cache_problem",
]

URL_ENV = "TORCHINDUCTOR_REDIS_URL"


def apply_remote_cache(url: str) -> RemoteCacheWatch:
    """Turn torch's remote caches on, pointed at ``url``, until the returned watch's
    :meth:`~RemoteCacheWatch.restore`."""
    holds = [hold_variable(URL_ENV, url)]
    for owner, name in inductor.REMOTE_CACHE_SWITCHES:
        read, write = inductor.remote_cache_switch(owner, name)
        holds.append(settings.hold_setting(f"{owner}:{name}", True, read, write))
    return RemoteCacheWatch(url, holds, inductor.remote_cache_counts())


@attrs.define
class RemoteCacheReport:
    """``torchkiln.report(model).remote_cache``."""

    url: str
    counts: dict[str, dict[str, int]]
    """Since compile, by torch's cache class (``RemoteFxGraphCache``, ...)."""
    answered: bool
    problem: str | None
    """Why the server did not answer when the report was built."""

    def lines(self) -> list[str]:
        traffic = (
            "; ".join(
                f"{name}: {c['hit']} hits, {c['miss']} misses, {c['put']} written"
                + (f", {c['exception']} errors" if c["exception"] else "")
                for name, c in sorted(self.counts.items())
            )
            or "no lookups yet"
        )
        head = f"remote cache {self.url}: {traffic}"
        if self.answered:
            return [head]
        return [
            head,
            f"  the server does not answer ({self.problem}): compiles go on without it "
            "(torch counts its lookups as misses)",
        ]


class RemoteCacheWatch:
    def __init__(self, url: str, holds: list[Any], counts_before: dict[str, dict[str, int]]):
        self.url = url
        self._holds = holds
        self._before = counts_before

    def restore(self) -> None:
        for hold in reversed(self._holds):
            hold.release()

    def report(self) -> RemoteCacheReport:
        now = inductor.remote_cache_counts()
        counts = {
            name: {k: v - self._before.get(name, {}).get(k, 0) for k, v in stat.items()}
            for name, stat in now.items()
        }
        problem = ping(self.url)
        return RemoteCacheReport(self.url, counts, problem is None, problem)


def ping(url: str, timeout: float = 1.0) -> str | None:
    """``None`` when the server at ``url`` answers a PING within ``timeout`` seconds, else why
    not."""
    import redis

    try:
        client = redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout)
        client.ping()
        client.close()
    except Exception as error:
        return f"{type(error).__name__}: {str(error)[:200]}"
    return None
