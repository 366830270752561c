"""Range checks on structured configuration values, whatever their source.

Types are checked while structuring (:mod:`torchkiln.configuration.config_validation`); this module checks
what a type cannot say: numbers finite and in range, a cache directory that can be one, and
DeepSpeed settings that would import a module named in a file.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from urllib.parse import urlsplit

from torchkiln.configuration.config import CompileConfig
from torchkiln.configuration.config_sources import dollar
from torchkiln.configuration.config_values import INT64_MAX, describe
from torchkiln.configuration.option_safety import is_untrusted
from torchkiln.errors import ConfigProblem

# DeepSpeed imports every name in this list (``torch_autocast.lower_precision_safe_modules``).
_DEEPSPEED_IMPORTS = ("torch_autocast", "lower_precision_safe_modules")


def value_problems(config: CompileConfig, sources: Mapping[str, str]) -> list[ConfigProblem]:
    problems: list[ConfigProblem] = []

    def add(path: str, message: str | None) -> None:
        if message:
            problems.append(ConfigProblem(dollar(path), message, sources.get(path, "")))

    add("distributed.ddp.bucket_cap_mb", _positive_size(config.distributed.ddp.bucket_cap_mb))
    add("regions.min_repeats", _whole_at_most(config.regions.min_repeats))
    add(
        "distributed.fsdp2.replicate_degree",
        _whole_at_most(config.distributed.fsdp2.replicate_degree),
    )
    add("cache_dir", _cache_dir(config.cache_dir))
    add("store", _cache_dir(config.store, "store"))
    deepspeed = config.distributed.deepspeed.config
    if isinstance(deepspeed, Mapping) and is_untrusted(
        sources.get("distributed.deepspeed.config", "")
    ):
        section = deepspeed.get(_DEEPSPEED_IMPORTS[0])
        if isinstance(section, Mapping) and section.get(_DEEPSPEED_IMPORTS[1]) is not None:
            add(
                "distributed.deepspeed.config",
                f"{'.'.join(_DEEPSPEED_IMPORTS)} makes DeepSpeed import the modules it names, "
                "so torchkiln does not take it from a file or the environment; pass the "
                "DeepSpeed configuration from Python instead (docs/configuration.md, "
                "'Options that can run code')",
            )
    return problems


def _positive_size(value: float | None) -> str | None:
    if value is None:
        return None
    if not math.isfinite(value) or value <= 0 or value > 2**40:
        return f"{describe(value)} is not a size in MiB; give a finite number above 0"
    return None


def _whole_at_most(value: int) -> str | None:
    if value > INT64_MAX:
        return f"{describe(value)} is too large; at most {INT64_MAX}"
    return None


def _cache_dir(value: str | None, field: str = "cache_dir") -> str | None:
    if value is None:
        return None
    if not value.strip():
        what, null = (
            ("inductor's cache", "torch's default")
            if field == "cache_dir"
            else ("what torchkiln compiles", "none")
        )
        return (
            f"an empty {field} would put {what} in the working directory; give a "
            f"directory path, or null for {null}"
        )
    try:
        is_file = os.path.exists(value) and not os.path.isdir(value)
    except (OSError, ValueError) as error:  # ValueError: a NUL character
        return f"{describe(value)} is not a usable path: {error}"
    if "\x00" in value:
        return f"{describe(value)} contains a NUL character"
    if is_file:
        return f"{describe(value)} exists and is not a directory; give a directory path"
    return None


REMOTE_CACHE_SCHEMES = ("redis", "rediss", "unix")


def remote_cache_problem(url: str) -> str | None:
    """What is wrong with ``url`` as a ``remote_cache`` value, or ``None``."""
    scheme = urlsplit(url).scheme
    if scheme not in REMOTE_CACHE_SCHEMES:
        return f"{url!r} is not a Redis URL (allowed schemes: {', '.join(REMOTE_CACHE_SCHEMES)}; e.g. redis://127.0.0.1:6379)"
    try:
        import redis  # noqa: F401
    except ImportError:
        return "the Redis client is not installed (pip install 'torchkiln[redis]')"
    return None
