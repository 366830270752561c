"""``torchkiln config import-accelerate FILE``: an Accelerate config file's dynamo settings as
torchkiln YAML (printed, or written with ``--output``)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import attrs
import yaml

from torchkiln.compat.accelerate_settings import (
    YAML_KEYS,
    AccelerateDynamo,
    DynamoBackend,
    load_mapping,
    read_yaml,
    to_overrides,
)

# Accelerate's distributed_type, as the torchkiln strategy that does the same job.
DISTRIBUTED_HINTS = {
    **dict.fromkeys(
        ("MULTI_GPU", "MULTI_CPU", "MULTI_XPU", "MULTI_NPU", "MULTI_MLU", "MULTI_HPU"), "ddp"
    ),
    "FSDP": "fsdp2",
    "DEEPSPEED": "deepspeed",
}


def add_import_accelerate_parser(config_subparsers: Any) -> None:
    """Add ``import-accelerate`` under ``torchkiln config``."""
    parser = config_subparsers.add_parser(
        "import-accelerate",
        help="print an Accelerate config file's dynamo settings as torchkiln YAML",
        description=(
            "Translate the dynamo settings of an `accelerate config` YAML file (dynamo_config, "
            "or the older top-level dynamo_backend) into a torchkiln configuration file."
        ),
    )
    parser.add_argument("file", help="the Accelerate config file (default_config.yaml)")
    parser.add_argument("-o", "--output", help="write the YAML here instead of printing it")
    parser.set_defaults(handler=_import_accelerate)


def _import_accelerate(args: argparse.Namespace) -> int:
    text = import_accelerate_yaml(args.file)
    if args.output:
        Path(args.output).write_text(text, encoding="utf-8")
        print(f"wrote {args.output}")
    else:
        print(text, end="")
    return 0


def import_accelerate_yaml(path: str | Path) -> str:
    """The torchkiln YAML equivalent to the dynamo settings of the Accelerate file ``path``.

    :raises ConfigError: the file is unreadable, or a dynamo value is bad or has no torchkiln
        equivalent (an Accelerate backend torchkiln has no backend for).
    """
    settings = read_yaml(path)
    if settings.backend is None:  # no dynamo section: Accelerate's default, dynamo off
        settings = attrs.evolve(settings, backend=DynamoBackend.NO)
    overrides = to_overrides(settings)
    notes = [f"torchkiln configuration imported from Accelerate's {Path(path).name} ({path})"]
    notes += _dropped_notes(settings)
    notes += _other_keys_note(path)
    header = "".join(f"# {line}\n" for line in notes)
    return header + yaml.safe_dump(overrides, sort_keys=False, default_flow_style=False)


def _dropped_notes(settings: AccelerateDynamo) -> list[str]:
    notes = []
    if settings.backend is DynamoBackend.NO:
        notes.append("dynamo is off in this file (backend NO): torchkiln compiles nothing")
        given = [f for f in ("mode", "fullgraph", "dynamic", "regional") if f in settings.origins]
        if given:
            notes.append(f"ignored with dynamo off, as in Accelerate: {', '.join(given)}")
        return notes
    if settings.mode is not None and settings.mode.lower() == "default":
        notes.append("dynamo_mode: default is torch.compile's default mode (mode left unset)")
    if settings.dynamic is False:
        notes.append(
            "dynamo_use_dynamic: false leaves dynamic unset (torch's automatic dynamic shapes); "
            "write `dynamic: false` to force static shapes"
        )
    return notes


def _other_keys_note(path: str | Path) -> list[str]:
    document = load_mapping(Path(path), f"file:{path}")  # read_yaml accepted it already
    notes = []
    distributed = str(document.get("distributed_type", "")).upper()
    if distributed in DISTRIBUTED_HINTS:
        notes.append(
            f"distributed_type {distributed}: to let torchkiln wrap the model instead of "
            f"Accelerate, add `distributed: {DISTRIBUTED_HINTS[distributed]}`"
        )
    skipped = sorted(k for k in document if k not in {"dynamo_config", *YAML_KEYS})
    if skipped:
        notes.append(f"not compile settings, not imported: {', '.join(skipped)}")
    return notes
