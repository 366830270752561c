"""``remote_cache: redis://...`` against a real ``redis-server`` (Debian's package) that each
test starts on 127.0.0.1 and stops: compiled graphs written by one process are read by
another with a cold local cache, and a server that stops mid-run leaves the compile going and
the report saying so. The server's own key count is the witness of what was written."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import torchkiln
from torchkiln._internals import inductor
from torchkiln.artifacts.remote_cache import URL_ENV, remote_cache_problem
from torchkiln.examples import toy

SERVER = shutil.which("redis-server")
if SERVER is None and os.environ.get("CI"):
    raise RuntimeError("CI runs the remote-cache tests: .ci/run installs Debian's redis-server")
needs_server = pytest.mark.skipif(SERVER is None, reason="no redis-server on this machine")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def redis_url(tmp_path: Path) -> Iterator[str]:
    import redis

    port = _free_port()
    server = subprocess.Popen(
        [SERVER or "redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no", "--dir", str(tmp_path)],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"redis://127.0.0.1:{port}"
    deadline = time.monotonic() + 20
    while True:
        try:
            redis.Redis.from_url(url).ping()
            break
        except redis.exceptions.ConnectionError:
            if time.monotonic() > deadline:
                server.kill()
                raise
            time.sleep(0.05)
    yield url
    server.terminate()
    server.wait(timeout=20)


SCRIPT = textwrap.dedent(
    """
    import json, sys, torch, torchkiln
    from torchkiln.examples import llama
    url, cache, stop = sys.argv[1], sys.argv[2], sys.argv[3] == "stop"
    torch.manual_seed(0)
    model = llama(depth=2, hidden_size=32, heads=4, kv_heads=2, intermediate_size=64,
                  vocab_size=128).eval()
    torchkiln.compile(model, backend="inductor", remote_cache=url, cache_dir=cache,
                      progress="off")
    ids = torch.randint(0, 128, (1, 8))
    with torch.no_grad():
        out = model(ids).logits
        if stop:
            import redis
            redis.Redis.from_url(url).shutdown(nosave=True)
            out = model(torch.randint(0, 128, (2, 12))).logits  # a new shape: another compile
    report = torchkiln.report(model)
    torchkiln.decompile(model)
    with torch.no_grad():
        expected = model(torch.randint(0, 128, (2, 12)) if stop else ids).logits
    print(json.dumps({"lines": report.remote_cache.lines(), "counts": report.remote_cache.counts,
                      "answered": report.remote_cache.answered,
                      "finite": bool(torch.isfinite(out).all()), "shape": list(out.shape)}))
    """
)


def run(url: str, cache: Path, stop: bool = False) -> dict:
    process = subprocess.run(
        [sys.executable, "-c", SCRIPT, url, str(cache), "stop" if stop else "go"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert process.returncode == 0, process.stderr[-4000:]
    return json.loads(process.stdout.strip().splitlines()[-1])


@needs_server
@pytest.mark.slow
def test_what_one_process_compiled_another_reads_from_the_server(
    redis_url: str, tmp_path: Path
) -> None:
    import redis

    first = run(redis_url, tmp_path / "cache-a")
    keys = redis.Redis.from_url(redis_url).dbsize()
    second = run(redis_url, tmp_path / "cache-b")  # a cold local cache
    fx_first, fx_second = (
        first["counts"]["RemoteFxGraphCache"],
        second["counts"]["RemoteFxGraphCache"],
    )
    assert fx_first["put"] >= 1 and fx_first["hit"] == 0 and keys >= fx_first["put"]
    assert fx_second["hit"] >= 1 and fx_second["put"] == 0
    assert first["answered"] and second["answered"]
    assert first["lines"][0].startswith(f"remote cache {redis_url}: ")


@needs_server
@pytest.mark.slow
def test_a_server_that_stops_mid_run_leaves_the_compile_going_and_is_reported(
    redis_url: str, tmp_path: Path
) -> None:
    result = run(redis_url, tmp_path / "cache", stop=True)
    assert result["finite"] and result["shape"] == [2, 12, 128]
    assert result["answered"] is False
    assert result["lines"][1].startswith("  the server does not answer (ConnectionError")
    assert result["lines"][1].endswith(
        "compiles go on without it (torch counts its lookups as misses)"
    )


def test_remote_cache_holds_torch_settings_for_the_model_lifetime(monkeypatch) -> None:
    monkeypatch.delenv(URL_ENV, raising=False)
    switches = [inductor.remote_cache_switch(o, n) for o, n in inductor.REMOTE_CACHE_SWITCHES]
    before = [read() for read, _ in switches]
    model = torchkiln.compile(toy(2), backend="eager", remote_cache="redis://127.0.0.1:1")
    assert os.environ[URL_ENV] == "redis://127.0.0.1:1"
    assert [read() for read, _ in switches] == [True, True, True]
    torchkiln.decompile(model)
    assert URL_ENV not in os.environ
    assert [read() for read, _ in switches] == before


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        (
            "http://cache:6379",
            "'http://cache:6379' is not a Redis URL (allowed schemes: redis, rediss, unix",
        ),
        ("127.0.0.1:6379", "'127.0.0.1:6379' is not a Redis URL"),
    ],
)
def test_a_url_that_is_not_redis_is_refused(url: str, problem: str) -> None:
    assert remote_cache_problem(url).startswith(problem)
    with pytest.raises(torchkiln.ConfigError, match=r"\$\.remote_cache"):
        torchkiln.compile(toy(2), backend="eager", remote_cache=url)
