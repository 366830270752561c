"""Inductor's private parts that torchkiln reads or sets (``torch._inductor``, ``torch.cpu``'s
CPU-feature checks).

Every function imports ``torch._inductor`` in its body: importing this module imports no torch.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any


def config() -> Any:
    """Inductor's settings module, ``torch._inductor.config`` (``get_config_copy()``,
    ``get_type(name)`` where this torch has it, the settings as attributes).

    ``torch.compile(options=...)`` takes these names, and only this module lists them and their
    types. Verified: torch 2.11, 2.13, 2.14, 2.15.
    """
    from torch._inductor import config as inductor_config

    return inductor_config


def clear_caches() -> None:
    """Drop inductor's in-process memos of paths derived from its cache directory.

    Calls ``torch._inductor.utils.clear_caches``, as torch's own ``temporary_cache_dir()`` does
    when it switches directories; no public API does it. Verified: torch 2.11, 2.13, 2.14,
    2.15.
    """
    from torch._inductor.utils import clear_caches as clear

    clear()


def default_cache_dir() -> str:
    """The cache directory inductor uses when ``TORCHINDUCTOR_CACHE_DIR`` is unset.

    Calls ``torch._inductor.runtime.cache_dir_utils.default_cache_dir``: the default (per user,
    under the temporary directory) is computed only there. Verified: torch 2.11, 2.13, 2.14,
    2.15.
    """
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir as default

    return str(default())


def template_parser() -> Any:
    """``KernelTemplate._template_from_string`` as the class holds it (a ``staticmethod``), or
    ``None`` where this torch has no ``KernelTemplate`` or keeps the parser otherwise.

    Reads ``torch._inductor.codegen.common.KernelTemplate.__dict__["_template_from_string"]``,
    the Jinja parser every kernel template calls when it is built; there is no public hook to
    defer that parse. Verified: torch 2.11, 2.13, 2.14, 2.15.
    """
    from torch._inductor.codegen import common

    owner: Any = getattr(common, "KernelTemplate", None)
    return vars(owner).get("_template_from_string") if owner is not None else None


def set_template_parser(parser: Any) -> None:
    """Make ``parser`` (a ``staticmethod``) the Jinja parser of inductor's kernel templates,
    ``KernelTemplate._template_from_string``; see :func:`template_parser`, whose value puts
    torch's back. Verified: torch 2.11, 2.13, 2.14, 2.15.
    """
    from torch._inductor.codegen import common

    owner: Any = common.KernelTemplate
    owner._template_from_string = parser


def cpu_vec_isa() -> Any | None:
    """``torch._inductor.cpu_vec_isa``: inductor's CPU vector-ISA probe (``VecISA.check_build``,
    ``valid_vec_isa_list``, ``supported_vec_isa_list``); ``None`` for a torch without inductor
    (an ``ImportError``).

    torch decides the ISA there, once per process, with no public way to read, record or
    answer the probe. Verified: torch 2.11, 2.13, 2.14, 2.15.
    """
    try:
        from torch._inductor import cpu_vec_isa as module
    except ImportError:  # pragma: no cover - a torch without inductor
        return None
    return module


def cpu_capability(name: str) -> bool | None:
    """Whether this CPU has the feature ``name`` (``"avx2"``, ``"avx512_bf16"``, ``"amx_tile"``,
    ...), as inductor's ISA probe asks it; ``None`` where this torch has no check for it.

    Calls ``torch.cpu._is_<name>_supported()``: torch exposes the checks only under these
    private names. Verified: torch 2.11, 2.13, 2.14, 2.15.
    """
    import torch

    check = getattr(torch.cpu, f"_is_{name}_supported", None)
    return bool(check()) if callable(check) else None


def forget_vec_isa_probe(module: Any) -> None:
    """Drop the answers of the ISA probe in ``module`` (:func:`cpu_vec_isa`), so that the next
    use probes again, as in a new process.

    Clears ``valid_vec_isa_list``'s cache and every cached method of ``VecISA`` and its
    subclasses, and deletes the ``_is_<extension>_supported`` attributes an extension probe
    sets on the instances of ``supported_vec_isa_list`` (they change the flags, and so the keys,
    of the next probes). torch has no public reset for the probe. Verified: torch 2.11, 2.13,
    2.14, 2.15.
    """
    module.valid_vec_isa_list.cache_clear()
    for cls in [module.VecISA, *_subclasses(module.VecISA)]:
        for attribute in vars(cls).values():
            if callable(getattr(attribute, "cache_clear", None)):
                attribute.cache_clear()
    for isa in getattr(module, "supported_vec_isa_list", ()):
        for name in [n for n in vars(isa) if n.startswith("_is_") and n.endswith("_supported")]:
            delattr(isa, name)


def vec_isa_probe(module: Any) -> Any | None:
    """The ISA probe ``VecISA.check_build(isa, code) -> bool`` of ``module``
    (:func:`cpu_vec_isa`), or ``None`` where this torch's module lacks the probe or the cached
    ``valid_vec_isa_list`` that decides with it. Verified: torch 2.11, 2.13, 2.14, 2.15."""
    probe = getattr(getattr(module, "VecISA", None), "check_build", None)
    listing = getattr(module, "valid_vec_isa_list", None)
    return probe if probe is not None and hasattr(listing, "cache_info") else None


def vec_isa_decided(module: Any) -> bool:
    """Whether this process has decided its ISA (``valid_vec_isa_list``'s cache holds its
    answer). Verified: torch 2.11, 2.13, 2.14, 2.15."""
    return bool(module.valid_vec_isa_list.cache_info().currsize > 0)


def decide_vec_isa(module: Any) -> None:
    """Decide the ISA now (every probe it needs runs), as inductor's first CPU compile does:
    calls ``valid_vec_isa_list()``. Verified: torch 2.11, 2.13, 2.14, 2.15."""
    module.valid_vec_isa_list()


@contextlib.contextmanager
def vec_isa_probe_replaced(module: Any, replacement: Any) -> Iterator[None]:
    """``VecISA.check_build`` replaced by ``replacement(isa, code) -> bool`` in this context:
    the one place inductor asks whether an ISA builds and loads, which torch offers no way to
    record or answer. Put back on exit. Verified: torch 2.11, 2.13, 2.14, 2.15."""
    original = module.VecISA.__dict__["check_build"]
    module.VecISA.check_build = replacement
    try:
        yield
    finally:
        module.VecISA.check_build = original


def vec_isa_flags(isa: Any) -> str:
    """The compiler flags ``isa`` (a ``VecISA``) builds with now (an extension probe may change
    them). Verified: torch 2.11, 2.13, 2.14, 2.15."""
    return str(isa.build_arch_flags())


def templates_built() -> bool:
    """Whether inductor has built its kernel templates in this process: they are built when
    ``torch._inductor.select_algorithm`` is imported (for ``extern_kernels``), so this asks
    ``sys.modules`` (importing nothing). Verified: torch 2.11, 2.13, 2.14, 2.15."""
    import sys

    return "torch._inductor.select_algorithm" in sys.modules


def is_vec_isa_load_marker(name: str) -> bool:
    """Whether the inductor cache file ``name`` is a load marker of the ISA probe.

    Since torch 2.14, ``VecISA.check_build``, once a child process has ``dlopen``ed a probe
    test library, writes an empty ``<library>.load_ok`` beside it in the inductor cache; a
    later probe that finds the library and its marker answers ``True`` without starting a
    child. The marker is the answer of the machine that wrote it (whether this CPU, OS and
    torch install can load the library; torch 2.15 retries after ``import torch`` because
    some wheels load only then), unlike the library, which only the compiler, flags and torch
    version decide (its cache key). torch 2.11 and 2.13 write no marker and always start the
    child; nothing in their caches matches. The file name is set only in ``check_build``'s
    body: no API names it. Verified: torch 2.11, 2.13, 2.14, 2.15.
    """
    return name.endswith(".load_ok")


def _subclasses(cls: type) -> list[type]:
    found: list[type] = []
    subclass: type
    for subclass in cls.__subclasses__():
        found += [subclass, *_subclasses(subclass)]
    return found


def cpp_compiler_version() -> tuple[str, str]:
    """Inductor's C++ compiler and its version text (one ``-v`` call, cached by torch).

    Calls ``torch._inductor.cpp_builder.get_cpp_compiler`` and ``get_compiler_version_info``:
    the compiler inductor picks (``CXX``, its configuration, the defaults) is only decided
    there. Verified: torch 2.11, 2.13, 2.14, 2.15.
    """
    from torch._inductor.cpp_builder import get_compiler_version_info, get_cpp_compiler

    compiler = get_cpp_compiler()
    return str(compiler), str(get_compiler_version_info(compiler))


REMOTE_CACHE_SWITCHES = (
    ("inductor", "fx_graph_remote_cache"),
    ("inductor", "autotune_remote_cache"),
    ("functorch", "enable_remote_autograd_cache"),
)
"""The settings that turn on torch's remote caches: inductor's FX-graph cache (compiled graphs),
its autotuning cache, and AOTAutograd's cache (the joint forward-backward graphs)."""


def remote_cache_switch(owner: str, name: str) -> tuple[Any, Any]:
    """``(read, write)`` for one of :data:`REMOTE_CACHE_SWITCHES`.

    Reads and sets ``torch._inductor.config.<name>`` or ``torch._functorch.config.<name>``: off
    Meta's own builds these default to off, and only the config modules switch them on in
    process (the ``TORCHINDUCTOR_*_REMOTE_CACHE`` variables are read once, at import).
    Verified: torch 2.11, 2.13, 2.14, 2.15.
    """
    import functools
    import importlib

    path = f"torch.{'_inductor' if owner == 'inductor' else '_functorch'}.config"
    module = importlib.import_module(path)
    if not hasattr(module, name):
        raise AttributeError(f"{path} has no {name}")
    return functools.partial(getattr, module, name), functools.partial(setattr, module, name)


def remote_cache_counts() -> dict[str, dict[str, int]]:
    """Torch's counts of remote-cache traffic in this process, by cache class name
    (``RemoteFxGraphCache``, ...): ``{"hit", "miss", "put", "exception"}`` each.

    Reads ``torch._inductor.remote_cache.cache_stats._stats``, the only record of it (torch
    logs it at exit). Verified: torch 2.11, 2.13, 2.14, 2.15.
    """
    from torch._inductor.remote_cache import cache_stats

    return {
        name: {"hit": stat.hit, "miss": stat.miss, "put": stat.put, "exception": stat.exception}
        for name, stat in cache_stats._stats.items()
    }


def mode_options(mode: str, dynamic: bool | None = None) -> dict[str, Any]:
    """The inductor settings ``torch.compile(mode=mode, dynamic=dynamic)`` applies, as the
    ``options`` dict that applies the same ones.

    Calls ``torch._inductor.list_mode_options(mode, dynamic)``, which is what torch's own
    inductor wrapper applies for a mode (``_TorchCompileInductorWrapper.apply_mode``) and what
    ``torch.compile``'s docstring points to; no public API lists a mode's settings. Needed
    where ``options`` must carry a key of ``torch.compile``'s own (``guard_filter_fn``)
    beside a mode, which ``torch.compile`` refuses. ``"default"`` is ``{}``.
    Verified: torch 2.13, 2.14.
    """
    from torch._inductor import list_mode_options

    return dict(list_mode_options(mode, dynamic))
