"""Contracts of ``torchkiln._internals.inductor``: each adapter function works on this torch.

One test per function; a torch release that renames or changes what one reads fails here, with
the function's name. Nothing here compiles a kernel.
"""

from __future__ import annotations

import os
import platform

import pytest

from torchkiln._internals import inductor, versions
from torchkiln.artifacts.isa_probe import CAPABILITIES


def test_config() -> None:
    config = inductor.config()
    settings = config.get_config_copy()
    assert isinstance(settings, dict) and "max_autotune" in settings
    assert config.get_type("max_autotune") is bool  # the declared types option checks read


def test_clear_caches() -> None:
    import torch._inductor.utils

    assert callable(torch._inductor.utils.clear_caches)  # not the no-op for a torch without it
    assert inductor.clear_caches() is None


def test_default_cache_dir() -> None:
    found = inductor.default_cache_dir()
    assert isinstance(found, str) and os.path.isabs(found)
    assert "torchinductor" in os.path.basename(found)


def test_template_parser() -> None:
    from torch._inductor.codegen.common import KernelTemplate

    parser = inductor.template_parser()
    assert isinstance(parser, staticmethod)  # else deferred templates leave torch alone
    assert parser.__func__ is KernelTemplate._template_from_string


def test_set_template_parser() -> None:
    from torch._inductor.codegen.common import KernelTemplate

    original = inductor.template_parser()
    replacement = staticmethod(lambda source: source)
    inductor.set_template_parser(replacement)
    try:
        assert inductor.template_parser() is replacement
        assert KernelTemplate._template_from_string("text") == "text"
    finally:
        inductor.set_template_parser(original)
    assert inductor.template_parser() is original


def test_cpu_vec_isa() -> None:
    module = inductor.cpu_vec_isa()
    assert module is not None
    assert callable(module.VecISA.check_build)
    assert hasattr(module.valid_vec_isa_list, "cache_info")  # a functools cache
    assert all(isinstance(isa, module.VecISA) for isa in module.supported_vec_isa_list)


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="x86 CPU features")
def test_cpu_capability() -> None:
    found = {name: inductor.cpu_capability(name) for name in CAPABILITIES}
    assert all(isinstance(value, bool) for value in found.values()), found
    assert inductor.cpu_capability("no_such_feature") is None


def test_forget_vec_isa_probe() -> None:
    """An extension probe's answer (kept on the instance) goes back to the class default."""
    module = inductor.cpu_vec_isa()
    assert module is not None
    extended = [
        (isa, name)
        for isa in module.supported_vec_isa_list
        for name in vars(type(isa))
        if name.startswith("_is_") and name.endswith("_supported")
    ]
    assert extended, "no VecISA keeps an extension probe's answer as _is_<name>_supported"
    isa, name = extended[0]
    default = getattr(type(isa), name)
    setattr(isa, name, not default)
    inductor.forget_vec_isa_probe(module)
    assert name not in vars(isa) and getattr(isa, name) == default
    assert module.valid_vec_isa_list.cache_info().currsize == 0


def test_is_vec_isa_load_marker() -> None:
    """Every file ``check_build`` writes beside a probe test library (``output_path + "..."``)
    is recognised: torch 2.14+ write ``.load_ok`` once a child has loaded it, 2.11 and 2.13
    none."""
    import ast
    import inspect
    import textwrap

    import torch

    module = inductor.cpu_vec_isa()
    assert module is not None
    tree = ast.parse(textwrap.dedent(inspect.getsource(module.VecISA.check_build)))
    suffixes = [
        node.right.value
        for node in ast.walk(tree)
        if isinstance(node, ast.BinOp)
        and isinstance(node.op, ast.Add)
        and isinstance(node.left, ast.Name)
        and node.left.id == "output_path"
        and isinstance(node.right, ast.Constant)
        and isinstance(node.right.value, str)
    ]
    release = versions.release_tuple(torch.__version__)
    assert release is not None
    assert bool(suffixes) == (release >= (2, 14)), suffixes
    assert all(inductor.is_vec_isa_load_marker(f"ab/cabc.so{suffix}") for suffix in suffixes)
    assert not inductor.is_vec_isa_load_marker("ab/cabc.so")


def test_cpp_compiler_version() -> None:
    compiler, version = inductor.cpp_compiler_version()
    assert compiler and isinstance(compiler, str)
    assert version and isinstance(version, str)


@pytest.mark.parametrize(("owner", "name"), inductor.REMOTE_CACHE_SWITCHES)
def test_remote_cache_switch(owner: str, name: str) -> None:
    read, write = inductor.remote_cache_switch(owner, name)
    before = read()
    assert before in (None, False, True)  # off Meta's builds: unset or off
    write(True)
    try:
        assert read() is True
    finally:
        write(before)
    assert read() == before


def test_remote_cache_counts() -> None:
    from torch._inductor.remote_cache import cache_stats  # the contract's subject

    counts = inductor.remote_cache_counts()
    assert isinstance(counts, dict)
    cache_stats.put("TorchkilnContractProbe")
    after = inductor.remote_cache_counts()["TorchkilnContractProbe"]
    assert after == {"hit": 0, "miss": 0, "put": after["put"], "exception": 0} and after["put"] >= 1


def test_mode_options() -> None:
    assert inductor.mode_options("default") == {}
    settings = inductor.config().get_config_copy()
    for mode in ("reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"):
        for dynamic in (None, False, True):
            options = inductor.mode_options(mode, dynamic)
            assert options, mode  # every non-default mode sets something
            unknown = set(options) - set(settings)
            assert not unknown, (mode, unknown)  # names torch.compile(options=...) takes
    assert inductor.mode_options("max-autotune-no-cudagraphs")["max_autotune"] is True
    assert "triton.cudagraphs" not in inductor.mode_options("max-autotune-no-cudagraphs")


def test_vec_isa_probe() -> None:
    module = inductor.cpu_vec_isa()
    assert inductor.vec_isa_probe(module) is module.VecISA.check_build
    assert inductor.vec_isa_probe(object()) is None  # a module without the probe


def test_vec_isa_decided_and_decide_vec_isa() -> None:
    module = inductor.cpu_vec_isa()
    inductor.forget_vec_isa_probe(module)
    assert not inductor.vec_isa_decided(module)
    inductor.decide_vec_isa(module)
    assert inductor.vec_isa_decided(module)


def test_vec_isa_probe_replaced() -> None:
    module = inductor.cpu_vec_isa()
    inductor.forget_vec_isa_probe(module)
    asked: list[str] = []

    def refuse(isa, code):  # type: ignore[no-untyped-def]
        asked.append(str(isa))
        return False

    original = module.VecISA.__dict__["check_build"]
    with inductor.vec_isa_probe_replaced(module, refuse):
        decided = module.valid_vec_isa_list()
    assert module.VecISA.__dict__["check_build"] is original
    inductor.forget_vec_isa_probe(module)  # the refused answers must not stay
    if platform.machine() in ("x86_64", "AMD64"):
        assert asked and decided == []  # every ISA was asked through the replacement, refused


def test_vec_isa_flags() -> None:
    module = inductor.cpu_vec_isa()
    for isa in module.supported_vec_isa_list:
        assert isinstance(inductor.vec_isa_flags(isa), str)


def test_templates_built() -> None:
    import torch._inductor.select_algorithm  # noqa: F401

    assert inductor.templates_built()
