"""docs/distributed.md: every YAML example is a valid configuration, every command runs a
script that exists, and the Python examples use only public names that exist. (The example
training script itself runs under torchrun and the deepspeed launcher in test_launch.py.)"""

from __future__ import annotations

import importlib
import re
import shlex
from pathlib import Path

import pytest
import yaml

import torchkiln
from torchkiln.engine.resolve import resolve_config

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "distributed.md"
FENCE = re.compile(r"^```(?P<info>[^\n`]*)\n(?P<body>.*?)^```\s*$", re.MULTILINE | re.DOTALL)


def blocks(language: str) -> list[str]:
    return [
        m["body"] for m in FENCE.finditer(PAGE.read_text()) if m["info"].split()[:1] == [language]
    ]


@pytest.mark.parametrize("index", range(len(blocks("yaml"))))
def test_docs_yaml_examples_are_valid_configurations(index, tmp_path):
    text = blocks("yaml")[index]
    path = tmp_path / "torchkiln.yaml"
    path.write_text(text)
    config = resolve_config(str(path), env={}).config
    expected = yaml.safe_load(text)["distributed"]["strategy"]
    assert config.distributed.strategy == expected


def test_docs_environment_example_resolves(tmp_path):
    exports = dict(
        line.removeprefix("export ").split("=", 1)
        for block in blocks("bash")
        for line in block.splitlines()
        if line.startswith("export ")
    )
    assert exports["TORCHKILN_DISTRIBUTED_STRATEGY"] == "fsdp2"
    config = resolve_config(env=exports, cwd=tmp_path).config
    assert config.distributed.strategy == "fsdp2"
    assert config.distributed.fsdp2.activation_checkpointing is True


def test_docs_commands_run_the_example_script():
    scripts = {
        word
        for block in blocks("bash")
        for line in block.replace("\\\n", " ").splitlines()
        if line.startswith(("torchrun", "deepspeed"))
        for word in shlex.split(line)
        if word.endswith(".py")
    }
    assert scripts == {"examples/distributed_train.py"}
    assert (REPO / "examples" / "distributed_train.py").is_file()


def resolve(dotted: str) -> object:
    """``distributed.distributed_result`` -> the object, importing submodules on the way."""
    target: object = torchkiln
    path = "torchkiln"
    for part in dotted.split("."):
        path += "." + part
        if not hasattr(target, part):
            importlib.import_module(path)
        target = getattr(target, part)
    return target


def test_docs_public_names_exist():
    names = set(re.findall(r"torchkiln\.([a-z_]+(?:\.[a-z_]+)*)\(", PAGE.read_text()))
    assert {"compile", "unwrap", "full_state_dict", "distributed.distributed_result"} <= names
    for name in names:
        assert callable(resolve(name)), name
