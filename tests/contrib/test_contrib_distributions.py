"""The contrib distributions, installed for real: a fresh virtual environment gets torch (pinned),
openvino, torchkiln and both contrib distributions from pip; then ``torchkiln plugins`` must list
them as available, their own test suites must pass there, ``TORCHKILN_DISABLED_PLUGINS`` must
hide them and uninstalling must remove them.

Slow: the environment costs about 1.5 minutes to build (openvino is ~180 MB from PyPI; torch
comes from the local wheel), once per test session.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import attrs
import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent.parent
CONTRIB = ROOT / "contrib"
DISTRIBUTIONS = {"openvino": "torchkiln-openvino", "params": "torchkiln-param-selector"}
_IGNORED = shutil.ignore_patterns("build", "dist", "*.egg-info", "__pycache__", ".pytest_cache")


@attrs.frozen
class Venv:
    path: Path
    sources: Path
    """Copies of the distributions' sources (pip builds in the source tree; not in ours)."""

    def bin(self, name: str) -> str:
        return str(self.path / "bin" / name)

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHKILN_")}
        env.pop("PYTHONPATH", None)
        # The vendor's venv has its own pins (constraints.txt: torch 2.13.0, the CPU build on
        # disk), whatever release the tox env running this test pins through PIP_CONSTRAINT.
        env.pop("PIP_CONSTRAINT", None)
        return {**env, **extra}

    def run(
        self, *args: str, cwd: Path | None = None, **extra_env: str
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            list(args),
            capture_output=True,
            text=True,
            cwd=cwd,
            env=self.env(**extra_env),
            timeout=900,
        )

    def pip(self, *args: str) -> None:
        result = self.run(self.bin("python"), "-m", "pip", *args)
        assert result.returncode == 0, (
            f"pip {' '.join(args)} failed:\n{result.stdout[-3000:]}{result.stderr[-3000:]}"
        )

    def plugins_json(self, **extra_env: str) -> dict:
        result = self.run(self.bin("torchkiln"), "plugins", "--json", **extra_env)
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout)


def _copy_sources(target: Path) -> Path:
    (target / "torchkiln").mkdir(parents=True)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, target / "torchkiln" / name)
    for name in ("core", "plugins"):
        shutil.copytree(ROOT / name, target / "torchkiln" / name, ignore=_IGNORED)
    for distribution in DISTRIBUTIONS.values():
        shutil.copytree(CONTRIB / distribution, target / distribution, ignore=_IGNORED)
    return target


@pytest.fixture(scope="session")
def venv(tmp_path_factory) -> Venv:
    base = tmp_path_factory.mktemp("contrib")
    sources = _copy_sources(base / "src")
    subprocess.run([sys.executable, "-m", "venv", str(base / "venv")], check=True, timeout=300)
    environment = Venv(base / "venv", sources)
    environment.pip(
        "install", "-q", "-c", str(ROOT / "constraints.txt"), "torch==2.13.0", "openvino", "pytest",
        str(sources / "torchkiln"), *(str(sources / d) for d in DISTRIBUTIONS.values()),
    )  # fmt: skip
    return environment


def _plugin(listing: dict, name: str) -> dict | None:
    return next((p for p in listing["plugins"] if p["name"] == name), None)


def _named(items: list[dict], name: str) -> dict | None:
    return next((item for item in items if item["name"] == name), None)


def test_torchkiln_plugins_lists_both_distributions_as_available(venv):
    listing = venv.plugins_json()
    assert listing["failed"] == []
    openvino_plugin = _plugin(listing, "openvino")
    assert openvino_plugin is not None
    assert openvino_plugin["kind"] == "entry-point"
    assert openvino_plugin["target"] == "torchkiln_openvino"
    assert openvino_plugin["distribution"] == "torchkiln-openvino"
    assert openvino_plugin["version"] == "0.1.0"
    backend = _named(listing["backends"], "openvino")
    assert backend["plugin"] == "openvino"
    assert backend["origin"] == "plugin"
    assert backend["available"] is True, backend["reason"]
    assert backend["training"] is False
    assert _plugin(listing, "params")["distribution"] == "torchkiln-param-selector"
    assert _named(listing["selectors"], "params")["plugin"] == "params"
    assert _named(listing["selectors"], "params")["options"] == ["min_params"]


@pytest.mark.parametrize("distribution", sorted(DISTRIBUTIONS.values()))
def test_the_distributions_own_tests_pass_where_it_is_installed(venv, distribution):
    result = venv.run(
        venv.bin("pytest"), "-q", "-p", "no:cacheprovider", cwd=CONTRIB / distribution
    )
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
    assert " passed" in result.stdout.splitlines()[-1]


def test_disabled_plugins_variable_hides_them(venv):
    listing = venv.plugins_json(TORCHKILN_DISABLED_PLUGINS="openvino,params")
    assert _plugin(listing, "openvino") is None
    assert _plugin(listing, "params") is None
    assert _named(listing["selectors"], "params") is None
    # OpenVINO itself still registers its torch backend through torch's own entry point, so
    # the name stays listed, as one only torch knows (no probe, no option checks).
    assert _named(listing["backends"], "openvino")["origin"] == "torch"


def test_uninstalling_removes_them(venv):
    try:
        venv.pip("uninstall", "-y", *DISTRIBUTIONS.values())
        listing = venv.plugins_json()
        assert _plugin(listing, "openvino") is None
        assert _named(listing["selectors"], "params") is None
        assert _named(listing["backends"], "openvino")["origin"] == "torch"
    finally:  # leave the session's environment as the other tests expect it
        venv.pip(
            "install", "-q", "--no-deps", *(str(venv.sources / d) for d in DISTRIBUTIONS.values())
        )
    assert _plugin(venv.plugins_json(), "openvino") is not None
