"""Property suite: any YAML text, environment or keyword arguments end in a configuration or one
``ConfigError`` (and for the command line, exit 0 or 2); never another exception.

Four kinds of generated input, each run by one property:

- ``yaml``: files from YAML tokens and punctuation, dumps of config-shaped data (then
  mutated), and raw bytes, read by :func:`resolve_config`;
- ``env``: ``TORCHKILN_*`` variables (every field's variable, the shorthands, unknown names,
  ``TORCHKILN_CONFIG``) with generated text, JSON and numbers;
- ``kwargs``: the ``config`` argument (a mapping, a path, anything) and keyword arguments
  named like fields (and not), with Python values of any kind;
- ``cli``: generated files and environments through ``torchkiln config validate`` / ``show``
  / ``show --json``, in process: the return code must be 0 or 2 and nothing may escape.

The normal run (``tox -e tests``) tries :data:`QUICK` inputs; ``tox -e slow`` runs
:data:`AT_SCALE`, 5,200 in all, and prints the counts (``pytest -m slow -s -k properties``).
Both are derandomized, so a run is repeatable and cannot flake.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import yaml

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from torchkiln import ConfigError, cli  # noqa: E402
from torchkiln.configuration.config_sources import env_fields, leaf_fields  # noqa: E402
from torchkiln.engine.resolve import ResolvedConfig, resolve_config  # noqa: E402
from torchkiln.testing import isolated_plugin_manager  # noqa: E402

QUICK = {"yaml": 200, "env": 120, "kwargs": 120, "cli": 60}
AT_SCALE = {"yaml": 2000, "env": 1200, "kwargs": 1200, "cli": 800}
assert sum(AT_SCALE.values()) >= 5000

PM = isolated_plugin_manager()
WORKDIR = Path(tempfile.mkdtemp(prefix="torchkiln-properties-"))  # never holds torchkiln.yaml
FIELDS = [path for path, _ in leaf_fields()]
TOP_LEVEL = sorted({path.split(".")[0] for path in FIELDS})
ENV_NAMES = sorted(env_fields())

# --- generated values ---------------------------------------------------------------------------

words = st.sampled_from(
    [
        "inductor",
        "eager",
        "aot_eager",
        "no",
        "whole",
        "repeated",
        "classes",
        "paths",
        "ddp",
        "fsdp2",
        "deepspeed",
        "none",
        "raise",
        "leaves",
        "auto",
        "on",
        "off",
        "max-autotune",
        "default",
        "bfloat16",
        "",
        " ",
        "cpp.cxx",
        "/dev/zero",
        "max_autotune",
        "2024-01-31",
        "~",
        "null",
        "True",
        ".nan",
        "1e999",
        "0x1F",
        "1:20",
        "é",
        "\u2028",
    ]
)
numbers = st.one_of(
    st.integers(),
    st.integers(min_value=2**60, max_value=2**70),
    st.integers(4000, 6000).map(lambda digits: 10**digits),  # beyond int('...') limits
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0, -1, 1, 2, 2**63, -(2**63) - 1]),
)
scalars = st.one_of(st.none(), st.booleans(), numbers, words, st.text(max_size=20))
keys = st.one_of(
    st.sampled_from(
        TOP_LEVEL
        + [p.rsplit(".", 1)[-1] for p in FIELDS]
        + ["cpp.cxx", "max_autotune", "max_autotun", "capture_scalar_outputs", "strategy"]
    ),
    st.text(max_size=12),
)


def nested(inner: Any) -> Any:
    return st.one_of(st.lists(inner, max_size=4), st.dictionaries(keys, inner, max_size=4))


json_like = st.recursive(scalars, nested, max_leaves=12)
config_shaped = st.dictionaries(
    st.sampled_from([*TOP_LEVEL, "bakend", "regions", "distributed"]),
    st.one_of(
        json_like,
        st.dictionaries(keys, json_like, max_size=4),
        st.fixed_dictionaries(
            {"ddp": st.dictionaries(st.sampled_from(["bucket_cap_mb", "static_graph"]), scalars)}
        ),
    ),
    max_size=5,
)

# --- YAML text ----------------------------------------------------------------------------------

YAML_TOKENS = [
    "backend",
    "regions",
    "distributed",
    "options",
    "strategy",
    "ddp",
    "bucket_cap_mb",
    "cache_dir",
    "cpp.cxx",
    "min_repeats",
    ":",
    ": ",
    "\n",
    "  ",
    "    ",
    "- ",
    "&a ",
    "*a",
    "&b ",
    "*b",
    "<<: ",
    "? ",
    "!!binary ",
    "!!set ",
    "!!omap ",
    "!!timestamp ",
    "!!str ",
    "!!int ",
    "!!python/object/apply:os.system ",
    "!custom ",
    "[",
    "]",
    "{",
    "}",
    ", ",
    "'",
    '"',
    "#",
    "|",
    ">",
    "~",
    ".nan",
    ".inf",
    "-.inf",
    "2024-01-31",
    "12:30:00",
    "0x1F",
    "0o17",
    "1_000",
    "9" * 30,
    "1e999",
    "on",
    "yes",
    "no",
    "null",
    "true",
    "---",
    "...",
    "%YAML 1.1",
    "\t",
    "\\",
    "é",
    "\u2028",
    "\x85",
    "\ufeff",
]
yaml_from_tokens = st.lists(st.sampled_from(YAML_TOKENS), max_size=40).map("".join)
yaml_from_chars = st.text(
    alphabet=st.sampled_from(list(" \n:-[]{},&*!?|>'\"#%@`.~0123456789abco")), max_size=80
)


def dump(data: Any) -> str:
    try:
        return yaml.safe_dump(data, default_flow_style=False, allow_unicode=True)
    except (yaml.YAMLError, ValueError, OverflowError):
        return "backend: eager\n"


yaml_dumps = config_shaped.map(dump)


@st.composite
def mutated_dump(draw: Any) -> str:
    text = draw(yaml_dumps)
    for _ in range(draw(st.integers(0, 3))):
        at = draw(st.integers(0, len(text)))
        text = text[:at] + draw(st.sampled_from(YAML_TOKENS)) + text[at:]
    return text


yaml_files = st.one_of(
    yaml_from_tokens.map(str.encode),
    yaml_from_chars.map(str.encode),
    yaml_dumps.map(str.encode),
    mutated_dump().map(str.encode),
    st.binary(max_size=60),
    st.builds(lambda n: ("options: " + "[" * n + "]" * n).encode(), st.integers(20, 3000)),
    st.builds(
        lambda depth, fan: _alias_chain(depth, fan).encode(), st.integers(1, 9), st.integers(1, 12)
    ),
)


def _alias_chain(depth: int, fan: int) -> str:
    lines = ["a0: &a0 [x]"]
    for level in range(1, depth + 1):
        refs = ", ".join([f"*a{level - 1}"] * fan)
        lines.append(f"a{level}: &a{level} [{refs}]")
    return "options:\n" + "".join(f"  {line}\n" for line in lines)


# --- environment and keyword arguments ----------------------------------------------------------


def text_of(value: Any) -> str:
    """``str`` / ``json.dumps``, and 5,000 digits for an int beyond Python's conversion limit."""
    try:
        return value if isinstance(value, str) else json.dumps(value, allow_nan=True)
    except ValueError:
        return "7" * 5000


env_values = st.one_of(
    st.text(max_size=30),
    words,
    numbers.map(text_of),
    json_like.map(text_of),
    st.builds(lambda n: "[" * n, st.integers(30, 3000)),
    st.builds(lambda n: '{"a": ' * n + "1" + "}" * n, st.integers(30, 200)),
)
env_names = st.one_of(
    st.sampled_from(ENV_NAMES),
    st.sampled_from(["TORCHKILN_BAKEND", "TORCHKILN_", "TORCHKILN_OPTIONS_X"]),
)
environments = st.one_of(
    st.dictionaries(env_names, env_values.map(lambda s: s.replace("\x00", "")), max_size=5),
    st.fixed_dictionaries(
        {"TORCHKILN_CONFIG": st.sampled_from(["/dev/zero", "/nonexistent.yaml", "/", "."])}
    ),
)


class Weird:
    def __repr__(self) -> str:
        raise RuntimeError("no repr")


def nested_list(depth: int) -> list[Any]:
    """A list nested ``depth`` deep, far past Python's recursion limit."""
    value: list[Any] = []
    for _ in range(depth):
        value = [value]
    return value


def containing_itself(key: str) -> dict[str, Any]:
    value: dict[str, Any] = {}
    value[key] = value
    return value


python_values = st.one_of(
    json_like,
    st.sampled_from([b"bytes", {1, 2}, frozenset(), (1, "a"), 1j, Weird(), object(), math.nan]),
    st.builds(lambda n: [[[]]] * n, st.integers(0, 5)),
    st.integers(2000, 20000).map(nested_list),
    st.sampled_from(["max_autotune", "strategy", "x"]).map(containing_itself),
    st.dictionaries(st.one_of(st.integers(), st.text(max_size=5)), json_like, max_size=3),
)
kwargs_strategy = st.tuples(
    # the positional ``config``: nothing, a mapping layer, a path, or any Python value
    st.one_of(
        st.none(),
        config_shaped,
        st.sampled_from(["/dev/zero", "/nonexistent.yaml", "/", b"bytes-path"]),
        python_values,
    ),
    st.dictionaries(
        st.one_of(st.sampled_from(TOP_LEVEL), st.sampled_from(["bakend", "plugins_", "x"])),
        python_values,
        max_size=4,
    ),
)

# --- the checks ---------------------------------------------------------------------------------


def ends_well(call: Callable[[], Any]) -> None:
    """``call`` returns a configuration or raises one ConfigError with field paths."""
    try:
        result = call()
    except ConfigError as error:
        assert error.problems
        assert all(p.path.startswith("$") for p in error.problems)
        assert len(str(error)) < 20_000, "messages must not expand values"
        return
    assert isinstance(result, ResolvedConfig)


def check_yaml(data: bytes) -> None:
    path = WORKDIR / "generated.yaml"
    path.write_bytes(data)
    ends_well(lambda: resolve_config(path, plugins=PM, env={}, cwd=WORKDIR))


def check_env(env: dict[str, str]) -> None:
    ends_well(lambda: resolve_config(plugins=PM, env=env, cwd=WORKDIR))


def check_kwargs(given_input: tuple[Any, dict[str, Any]]) -> None:
    config, kwargs = given_input
    ends_well(lambda: resolve_config(config, plugins=PM, env={}, cwd=WORKDIR, **kwargs))


@st.composite
def cli_inputs(draw: Any) -> tuple[bytes, dict[str, str], list[str]]:
    command = draw(
        st.sampled_from([["validate"], ["show", "--file"], ["show", "--json", "--file"]])
    )
    return draw(yaml_files), draw(st.dictionaries(env_names, env_values, max_size=2)), command


def check_cli(given_input: tuple[bytes, dict[str, str], list[str]]) -> None:
    data, env, command = given_input
    path = WORKDIR / "cli.yaml"
    path.write_bytes(data)
    env = {name: value.replace("\x00", "") for name, value in env.items()}
    out, err = io.StringIO(), io.StringIO()
    with (
        mock.patch.dict(os.environ, env),
        contextlib.redirect_stdout(out),
        contextlib.redirect_stderr(err),
    ):
        code = cli.main(["config", *command, str(path)])
    assert code in (0, 2), (code, err.getvalue())
    if code == 2:
        assert err.getvalue().startswith("torchkiln: error: invalid torchkiln configuration")
    else:
        assert err.getvalue() == ""


KINDS: dict[str, tuple[Any, Callable[[Any], None]]] = {
    "yaml": (yaml_files, check_yaml),
    "env": (environments, check_env),
    "kwargs": (kwargs_strategy, check_kwargs),
    "cli": (cli_inputs(), check_cli),
}


def run_property(kind: str, examples: int) -> int:
    """Run one property over ``examples`` generated inputs; return how many were tried."""
    strategy, check = KINDS[kind]
    tried = [0]

    @settings(
        max_examples=examples,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(strategy)
    def prop(value: Any) -> None:
        tried[0] += 1
        check(value)

    prop()
    return tried[0]


@pytest.fixture
def cli_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    # The command line builds the process plugin manager: the built-ins only, on every machine.
    monkeypatch.setenv("TORCHKILN_DISABLE_PLUGIN_AUTOLOAD", "1")
    monkeypatch.chdir(WORKDIR)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("kind", sorted(QUICK))
def test_any_input_ends_in_a_config_or_a_config_error(kind: str, cli_environment: None) -> None:
    assert run_property(kind, QUICK[kind]) == QUICK[kind]


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("kind", sorted(AT_SCALE))
def test_any_input_ends_in_a_config_or_a_config_error_at_scale(
    kind: str, cli_environment: None, capsys: pytest.CaptureFixture[str]
) -> None:
    tried = run_property(kind, AT_SCALE[kind])
    with capsys.disabled():
        print(f"\nconfiguration properties, {kind}: {tried} generated inputs, 0 tracebacks")
    assert tried == AT_SCALE[kind]
