"""The ``torchkiln`` command line (also ``python -m torchkiln``)."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import signal
import sys
import textwrap
from collections.abc import Sequence
from typing import Any

import attrs

from torchkiln.configuration.config_values import describe
from torchkiln.errors import TorchkilnError
from torchkiln.reporting.report_table import plural

# Sub-commands that live with their own feature: (module, function adding the parser).
EXTRA_COMMANDS = (
    ("torchkiln.bench.cli", "add_bench_parser"),
    ("torchkiln.cli.precompile", "add_precompile_parser"),
)
EXTRA_CONFIG_COMMANDS = (("torchkiln.compat.accelerate_cli", "add_import_accelerate_parser"),)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "handler"):
        parser.print_help()
        return 2
    # The working directory is never put on sys.path here: a planted sympy.py would run
    # before the real one. Only a `module:factory` model spec is looked up there, last
    # (torchkiln.examples.load_model).
    try:
        status = int(args.handler(args) or 0)
        # Output shorter than the buffer is written here: a closed pipe must be caught too.
        sys.stdout.flush()
        return status
    except TorchkilnError as error:
        print(f"torchkiln: error: {error}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # `torchkiln ... | head` closed the pipe: stop quietly. Point stdout at /dev/null so
        # the interpreter's final flush does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="torchkiln", description="Regional, in-place torch.compile for large models."
    )
    commands = parser.add_subparsers(title="commands", metavar="COMMAND")
    _add_plugins(commands)
    _add_config(commands)
    _add_plan(commands)
    for module, function in EXTRA_COMMANDS:
        _add_extra(commands, module, function)
    return parser


def _add_extra(subparsers: Any, module: str, function: str) -> None:
    try:
        adder = getattr(importlib.import_module(module), function)
    except (ImportError, AttributeError):
        return  # that feature is not part of this installation
    adder(subparsers)


# --- torchkiln plugins -------------------------------------------------------------------------


def _add_plugins(commands: Any) -> None:
    p = commands.add_parser(
        "plugins",
        help="list plugins, backends, selectors and distributed strategies",
        description="List every plugin and what it declares, with availability.",
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")
    p.set_defaults(handler=_plugins)


def plugins_listing() -> dict[str, Any]:
    from torchkiln.plugin_host.default_manager import get_plugin_manager

    pm = get_plugin_manager().ensure_loaded()
    # Declarations first: a plugin whose declaration hook fails is quarantined there, and
    # must then be listed as FAILED, not as loaded.
    backends, selectors = pm.backends(), pm.selectors()
    strategies = pm.distributed_strategies()

    def availability(spec: Any) -> dict[str, Any]:
        result = spec.probe()
        return {"available": result.available, "reason": result.reason}

    return {
        "plugins": [attrs.asdict(info) for info in pm.plugin_infos()],
        "disabled": sorted(name for name, plugin in pm.list_name_plugin() if plugin is None),
        "failed": [attrs.asdict(f) for f in pm.failed],
        "backends": [
            {
                "name": name,
                "plugin": d.plugin,
                "origin": d.spec.origin,
                "description": d.spec.description,
                "training": d.spec.training,
                "modes": d.spec.modes,
                "options": d.spec.options,
                "devices": d.spec.devices,
                **availability(d.spec),
                # declared without the hook that serves it: refused when a configuration names it
                "unusable": pm.unserved(d),
            }
            for name, d in sorted(backends.items())
        ],
        "selectors": [
            {
                "name": n,
                "plugin": d.plugin,
                "description": d.spec.description,
                "options": d.spec.options,
                "unusable": pm.unserved(d),
            }
            for n, d in sorted(selectors.items())
        ],
        "distributed": [
            {
                "name": n,
                "plugin": d.plugin,
                "description": d.spec.description,
                **availability(d.spec),
                "unusable": pm.unserved(d),
            }
            for n, d in sorted(strategies.items())
        ],
    }


def _plugins(args: argparse.Namespace) -> int:
    listing = plugins_listing()
    if args.json:
        print(json.dumps(listing, indent=2, default=list))
        return 0
    print(
        _table(
            "plugins",
            ["name", "kind", "distribution", "hooks"],
            [
                [
                    p["name"],
                    p["kind"],
                    f"{p['distribution']} {p['version']}" if p["distribution"] else "",
                    ", ".join(p["hooks"]),
                ]
                for p in listing["plugins"]
            ],
        )
    )
    for failure in listing["failed"]:
        print(_wrapped(f"  FAILED {_failure_text(failure)}", "    "))
    if listing["disabled"]:
        print(f"  disabled (TORCHKILN_DISABLED_PLUGINS): {', '.join(listing['disabled'])}")
    declared = [b for b in listing["backends"] if b["origin"] != "torch"]
    print(
        _table(
            "backends",
            ["name", "from", "available", "training", "options", "description / why not"],
            [
                [
                    b["name"],
                    b["plugin"],
                    "yes" if b["available"] else "no",
                    "yes" if b["training"] else "no",
                    _options_text(b["options"]),
                    b["unusable"] or b["reason"] or b["description"],
                ]
                for b in declared
            ],
        )
    )
    torch_only = [b["name"] for b in listing["backends"] if b["origin"] == "torch"]
    if torch_only:
        print(
            _wrapped(
                "  known to torch only (compiled with torch.compile, any options): "
                + ", ".join(torch_only),
                "    ",
            )
        )
    print(
        _table(
            "selectors",
            ["name", "plugin", "options", "description"],
            [
                [
                    s["name"],
                    s["plugin"],
                    _options_text(s["options"]),
                    s["unusable"] or s["description"],
                ]
                for s in listing["selectors"]
            ],
        )
    )
    print(
        _table(
            "distributed strategies",
            ["name", "plugin", "available", "why not"],
            [
                [
                    d["name"],
                    d["plugin"],
                    "yes" if d["available"] else "no",
                    d["unusable"] or d["reason"],
                ]
                for d in listing["distributed"]
            ],
        )
    )
    return 0


LISTING_WIDTH = 120
"""``torchkiln plugins`` fits this many columns: the last column of a table wraps."""
OPTIONS_SHOWN = 28
"""The most characters of an options list a table shows (all of them: ``--json``)."""
MIN_LAST_WIDTH = 48
"""Below this many free columns, a table's last column goes on lines of its own."""


def _options_text(options: Sequence[str] | None) -> str:
    """``None`` (any key accepted) shows as ``any``; no accepted key as ``-``; a list longer
    than :data:`OPTIONS_SHOWN` characters as its first keys and how many more
    (``scheduler (+2 more)``)."""
    if options is None:
        return "any"
    text = ", ".join(options)
    if len(text) <= OPTIONS_SHOWN:
        return text or "-"
    shown: list[str] = []
    for key in options:
        more = f" (+{len(options) - len(shown) - 1} more)"
        if shown and len(", ".join([*shown, key])) + len(more) > OPTIONS_SHOWN:
            break
        shown.append(key)
    return f"{', '.join(shown)} (+{len(options) - len(shown)} more)"


def _failure_text(failure: dict[str, Any]) -> str:
    dist = f" ({failure['distribution']} {failure['version']})" if failure["distribution"] else ""
    if failure.get("hook"):
        return f"{failure['name']}{dist}: quarantined, its {failure['hook']}() {failure['error']}"
    return f"{failure['name']}{dist}: failed to load: {failure['error']}"


def _wrapped(text: str, indent: str, width: int = LISTING_WIDTH) -> str:
    return "\n".join(
        textwrap.wrap(text, width, subsequent_indent=indent, break_on_hyphens=False) or [text]
    )


def _table(title: str, header: list[str], rows: list[list[str]]) -> str:
    """Left-aligned columns; the last one wraps so that no line is wider than
    :data:`LISTING_WIDTH` (continuation lines start under it, or, when fewer than
    :data:`MIN_LAST_WIDTH` columns are left beside the others, it goes below each row)."""
    rows = [header, *rows]
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(header) - 1)]
    start = 2 + sum(w + 2 for w in widths)
    below = LISTING_WIDTH - start < MIN_LAST_WIDTH
    if below:
        start = 6
    lines = [f"\n{title}:"]
    for row in rows:
        first = "  " + "  ".join(str(c).ljust(w) for c, w in zip(row, widths))
        parts = textwrap.wrap(
            str(row[-1]), LISTING_WIDTH - start, break_on_hyphens=False, break_long_words=False
        )
        if below or not parts:
            lines.append(first.rstrip())
            lines += [" " * start + part for part in parts]
        else:
            lines.append(first + "  " + parts[0])
            lines += [" " * start + part for part in parts[1:]]
    return "\n".join(lines)


# --- torchkiln config --------------------------------------------------------------------------


def _add_config(commands: Any) -> None:
    p = commands.add_parser(
        "config",
        help="show or validate configuration",
        description="Show the effective configuration or validate a file.",
    )
    sub = p.add_subparsers(title="config commands", metavar="COMMAND")
    show = sub.add_parser(
        "show",
        help="print the effective configuration and where each value came from",
        description="Defaults < YAML file < TORCHKILN_* environment; each value's source is shown.",
    )
    show.add_argument("--file", help="YAML file (default: $TORCHKILN_CONFIG or ./torchkiln.yaml)")
    show.add_argument("--json", action="store_true", help="print JSON")
    show.set_defaults(handler=_config_show)
    validate = sub.add_parser(
        "validate",
        help="check a YAML file; non-zero exit with every problem",
        description="Validate a torchkiln YAML file (with the current environment).",
    )
    validate.add_argument("file", help="YAML file to check")
    validate.set_defaults(handler=_config_validate)
    for module, function in EXTRA_CONFIG_COMMANDS:
        _add_extra(sub, module, function)
    p.set_defaults(handler=lambda args: (p.print_help(), 2)[1])


def _config_show(args: argparse.Namespace) -> int:
    from torchkiln.engine.resolve import resolve_config

    resolved = resolve_config(args.file)
    values = attrs.asdict(resolved.config)
    if args.json:
        _print(
            json.dumps(
                {
                    "config": values,
                    "sources": dict(resolved.sources),
                    "file": str(resolved.file) if resolved.file else None,
                },
                indent=2,
                default=describe,
            )
        )
        return 0
    _print(f"# file: {resolved.file or 'none'}")
    for path, source in resolved.sources.items():
        value: Any = values
        for part in path.split("."):
            value = value[part]
        _print(f"{path} = {json.dumps(value, default=describe)}  # {source}")
    return 0


def _config_validate(args: argparse.Namespace) -> int:
    from torchkiln.engine.resolve import resolve_config

    resolve_config(args.file)
    _print(f"{args.file}: valid")
    return 0


def _print(text: str) -> None:
    """Print ``text``; a path or value with characters the terminal cannot encode (an
    undecodable byte in a file name, say) is escaped rather than crashing the command."""
    encoding = getattr(sys.stdout, "encoding", None) or "utf-8"
    print(text.encode(encoding, "backslashreplace").decode(encoding))


# --- torchkiln plan ----------------------------------------------------------------------------


def _add_plan(commands: Any) -> None:
    p = commands.add_parser(
        "plan",
        help="print the region plan of a model as a tree",
        description="MODEL is a built-in example (llama, gpt2, toy; NAME:DEPTH picks the depth) "
        "or package.module:factory.",
    )
    p.add_argument(
        "model", help="llama[:DEPTH], gpt2[:DEPTH], toy[:DEPTH] or package.module:factory"
    )
    p.add_argument("--regions", help="selector (default from configuration: auto)")
    p.add_argument("--config", help="YAML file")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.set_defaults(handler=_plan)


def _plan(args: argparse.Namespace) -> int:
    import torchkiln
    from torchkiln.examples import load_model

    model = load_model(args.model)
    options = {"regions": args.regions} if args.regions else {}
    plan = torchkiln.plan(model, args.config, **options)
    print(json.dumps(plan.to_dict(), indent=2) if args.json else render_plan_tree(model, plan))
    return 0


def render_plan_tree(model: Any, plan: Any) -> str:
    """The module tree down to the regions, each line marked compiled / eager / nested."""
    region_group = {r.path: g.name for g in plan.groups for r in g.regions}
    nested_group = {r.path: g.name for g in plan.nested for r in g.regions}
    eager = {e.path: e.reason for e in plan.eager}
    lines = [f"{type(model).__name__}  [{plan.reason}]"]
    if "" in region_group:
        lines[0] += f"  <- compiled as one region (group {region_group['']})"

    def visit(module: Any, prefix: str, indent: str) -> None:
        for name, child in module.named_children():
            path = f"{prefix}{name}"
            label = f"{indent}{name}: {type(child).__name__}"
            if path in region_group:
                lines.append(f"{label}  <- compiled (group {region_group[path]})")
                if any(p.startswith(path + ".") for p in nested_group):
                    visit(child, path + ".", indent + "  ")
            elif path in nested_group:
                lines.append(f"{label}  <- nested region (group {nested_group[path]})")
            elif path in eager:
                lines.append(f"{label}  (eager: {eager[path]})")
            elif any(p.startswith(path + ".") for p in (*region_group, *nested_group)):
                lines.append(label)
                visit(child, path + ".", indent + "  ")

    visit(model, "", "  ")
    units = len(plan.groups)
    lines.append(
        f"\n{plural(plan.region_count, 'region')} in {plural(units, 'group')}: "
        f"{plural(units, 'compile unit')} expected"
        + (f", {plural(len(plan.nested), 'nested block group')}" if plan.nested else "")
    )
    for group in plan.groups:
        lines.append(f"  {group.name}: {plural(len(group.regions), 'region')} — {group.reason}")
    return "\n".join(lines)
