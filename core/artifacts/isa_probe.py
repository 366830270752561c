"""Inductor's CPU vector-ISA probe, recorded at precompile and answered at load.

Before inductor (CPU) compiles or loads its first kernel in a process, it picks the vector
instruction set by building a test library per candidate and loading each in a Python child
process: the largest part of a precompiled first call. The answer decides the compile flags
that are part of every kernel's cache key; it does not guard the kernels themselves.

:func:`recorded_probes` records every ``check_build`` answer at precompile, with the CPU's
capabilities and the compiler's version. :func:`answered_probes` answers ``check_build`` from
that record at load, without building or starting a child, only when this machine has the
same CPU capabilities and compiler version; otherwise the probe runs as usual.
docs/precompile.md says what is recorded and why ``TORCHINDUCTOR_VEC_ISA_OK`` is not enough.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import platform
from collections.abc import Iterator
from typing import Any

from torchkiln._internals import inductor

logger = logging.getLogger("torchkiln")

CAPABILITIES = ("avx2", "avx512", "avx512_bf16", "vnni", "amx_tile", "amx_fp16")
"""``torch.cpu._is_<name>_supported()``: the CPU features the probe's candidates depend on."""


def _isa_module() -> Any | None:
    """``torch._inductor.cpu_vec_isa`` when it has the probe this module knows, else None."""
    cpu_vec_isa = inductor.cpu_vec_isa()
    if cpu_vec_isa is None or inductor.vec_isa_probe(cpu_vec_isa) is None:
        return None
    return cpu_vec_isa


def cpu_capabilities() -> dict[str, Any]:
    found: dict[str, Any] = {"machine": platform.machine()}
    for name in CAPABILITIES:
        found[name] = inductor.cpu_capability(name)
    return found


def compiler_version() -> str:
    """Inductor's C++ compiler and its version text (one ``-v`` call, cached by torch)."""
    compiler, version = inductor.cpp_compiler_version()
    return f"{compiler}={version}"


def machine_local(name: str) -> bool:
    """Whether the inductor cache file ``name`` holds this machine's probe answer rather than
    something the compiler made: torch 2.14+'s load marker of a probe test library
    (:func:`torchkiln._internals.inductor.is_vec_isa_load_marker`).

    Such a file is neither listed in an artifact's ``kernels`` nor copied from one: where the
    record does not fit, the probe then loads its test libraries here (one child each) as in
    a new process, instead of answering from the precompile machine's markers.
    """
    return inductor.is_vec_isa_load_marker(name)


def probe_key(isa: Any, code: str) -> str:
    """One probe: the ISA, the flags it builds with now, and the test code."""
    digest = hashlib.sha256(code.encode()).hexdigest()[:16]
    return f"{isa}|{inductor.vec_isa_flags(isa)}|{digest}"


@contextlib.contextmanager
def recorded_probes(
    record: dict[str, Any], backend: str = "inductor", device: str = "cpu"
) -> Iterator[None]:
    """Fill ``record`` with every probe answer inductor needs while this context is open
    (inductor on the CPU only: nothing is recorded for another ``backend`` or ``device``).

    Call it with the artifact's kernel directory as the inductor cache directory: a process
    that already probed probes again, so the test libraries are written there too.
    """
    module = _isa_module() if (backend, device) == ("inductor", "cpu") else None
    if module is None or platform.machine() not in ("x86_64", "AMD64"):
        yield
        return
    if inductor.vec_isa_decided(module):
        # torch's in-process answers: the next use probes again (same answers: same machine,
        # same compiler), this time in the current cache directory
        inductor.forget_vec_isa_probe(module)
    probe = inductor.vec_isa_probe(module)
    assert probe is not None  # _isa_module found it
    answers: dict[str, bool] = {}

    def recording(isa: Any, code: str) -> bool:
        key = probe_key(isa, code)  # before the probe: it may change the flags it reports
        answers[key] = bool(probe(isa, code))
        return answers[key]

    with inductor.vec_isa_probe_replaced(module, recording):
        yield
        inductor.decide_vec_isa(module)  # the whole decision, even if nothing compiled needed it
    record.update(cpu=cpu_capabilities(), compiler=compiler_version(), probes=answers)


def probe_mismatch(record: dict[str, Any] | None) -> str | None:
    """Why ``record`` cannot answer this machine's probe (None: it can)."""
    if not record or not record.get("probes"):
        return "the artifacts hold no probe answers"
    cpu = cpu_capabilities()
    if record.get("cpu") != cpu:
        return f"CPU capabilities differ (precompiled on {record.get('cpu')}, here {cpu})"
    if record.get("compiler") != compiler_version():
        return "the C++ compiler (or its version) differs"
    return None


@contextlib.contextmanager
def answered_probes(record: dict[str, Any] | None) -> Iterator[None]:
    """While loading: answer inductor's ISA probe from ``record`` when it fits this machine."""
    module = _isa_module() if record else None  # no record (not inductor on CPU): no import
    if module is None or inductor.vec_isa_decided(module):
        yield
        return
    reason = probe_mismatch(record)
    if reason is not None:
        logger.info("torchkiln: inductor's CPU ISA probe runs as usual: %s", reason)
        yield
        return
    assert record is not None  # a module was looked up only for a record
    answers: dict[str, bool] = record["probes"]
    probe = inductor.vec_isa_probe(module)
    assert probe is not None  # _isa_module found it

    def answering(isa: Any, code: str) -> bool:
        known = answers.get(probe_key(isa, code))
        return bool(probe(isa, code)) if known is None else known

    with inductor.vec_isa_probe_replaced(module, answering):
        yield
