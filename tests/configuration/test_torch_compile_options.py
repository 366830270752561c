"""``options`` keys that torch.compile itself takes (``guard_filter_fn``): a function, so only
from Python, for every backend."""

from __future__ import annotations

import pytest

from torchkiln import ConfigError
from torchkiln.engine.resolve import resolve_config


def keep_all_guards(entries: list[object]) -> list[bool]:
    return [True for _ in entries]


@pytest.mark.parametrize("backend", ["inductor", "eager"])
def test_a_guard_filter_from_python_is_accepted(backend: str, tmp_path) -> None:
    resolved = resolve_config(
        options={"guard_filter_fn": keep_all_guards}, backend=backend, env={}, cwd=tmp_path
    )
    assert resolved.config.options["guard_filter_fn"] is keep_all_guards


def test_a_guard_filter_that_is_not_a_function_is_refused(tmp_path) -> None:
    with pytest.raises(ConfigError) as raised:
        resolve_config(options={"guard_filter_fn": "skip_all"}, env={}, cwd=tmp_path)
    assert "$.options.guard_filter_fn" in str(raised.value)
    assert "takes a function" in str(raised.value)


def test_a_guard_filter_from_the_environment_is_refused(tmp_path) -> None:
    env = {"TORCHKILN_OPTIONS": '{"guard_filter_fn": "x"}'}
    with pytest.raises(ConfigError) as raised:
        resolve_config(env=env, cwd=tmp_path)
    message = str(raised.value)
    assert "$.options.guard_filter_fn" in message
    assert "not take it from a file or the environment" in message
