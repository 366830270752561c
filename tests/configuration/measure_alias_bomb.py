"""Measure how torchkiln refuses the 526-byte alias bomb (``alias_bomb.yaml``): time and memory.

    python tests/configuration/measure_alias_bomb.py

Each reader runs in a fresh process (so peak RSS is its own): the YAML reader alone, the full
``resolve_config`` (plugins, validation), and ``torchkiln config validate``. Printed per row:
wall and CPU seconds of the refusal itself, the tracemalloc peak of Python allocations during
it, and how much the process's peak RSS grew during it. The issue's bound: <= 1 s, <= 100 MB.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

BOMB = Path(__file__).with_name("alias_bomb.yaml")
READERS = ("yaml_reader", "resolve_config", "cli")


def measure(reader: str) -> dict[str, float | str]:
    """Run in the child: import first (not measured), then time and trace the refusal."""
    import torchkiln
    from torchkiln.cli import commands as cli
    from torchkiln.configuration.yaml_reader import read_yaml_file
    from torchkiln.engine.resolve import resolve_config

    pm = torchkiln.PluginManager(entry_points=False, env={})
    pm.ensure_loaded()

    def run() -> str:
        if reader == "yaml_reader":
            read_yaml_file(BOMB)
        elif reader == "resolve_config":
            resolve_config(BOMB, plugins=pm, env={})
        else:
            return f"exit {cli.main(['config', 'validate', str(BOMB)])}"
        return "accepted (!)"

    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    cpu_before = time.process_time()
    tracemalloc.start()
    wall_before = time.perf_counter()
    try:
        outcome = run()
    except torchkiln.ConfigError as error:
        outcome = f"ConfigError ({len(str(error))} chars)"
    wall = time.perf_counter() - wall_before
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    cpu = time.process_time() - cpu_before
    rss_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {
        "reader": reader,
        "outcome": outcome,
        "wall_s": wall,
        "cpu_s": cpu,
        "traced_peak_mb": peak / 2**20,
        "rss_growth_mb": (rss_after - rss_before) / 1024,  # ru_maxrss is KiB on Linux
    }


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        print(json.dumps(measure(sys.argv[2])))
        return
    print(f"{BOMB.name}: {BOMB.stat().st_size} bytes")
    print(
        f"{'reader':<16} {'outcome':<28} {'wall s':>8} {'cpu s':>8} {'traced MB':>10} {'RSS+ MB':>8}"
    )
    for reader in READERS:
        done = subprocess.run(
            [sys.executable, __file__, "--child", reader],
            capture_output=True,
            text=True,
            check=True,
            timeout=600,
        )
        row = json.loads(done.stdout.strip().splitlines()[-1])
        print(
            f"{row['reader']:<16} {row['outcome']:<28} {row['wall_s']:>8.4f} {row['cpu_s']:>8.4f} "
            f"{row['traced_peak_mb']:>10.3f} {row['rss_growth_mb']:>8.1f}"
        )


if __name__ == "__main__":
    main()
