"""Inductor's CPU vector-ISA probe, recorded at precompile and answered at load.

Before inductor (CPU) loads or compiles its first kernel in a process, it decides which
vector instruction set to build for (``torch._inductor.cpu_vec_isa.valid_vec_isa_list``):
for every candidate the CPU advertises (AVX-512 VNNI, AVX-512, AVX2, ...) it compiles a tiny
test library (``VecISA.check_build``, kept in the inductor cache) and starts a Python child
that ``dlopen``s it, plus one more build-and-load per extension (AVX-512 BF16, VNNI, AMX).
On a 2-core machine that is six children, 1.5-2 s, paid once per process: the largest part
of a precompiled first call.

The probe answers one question: *can this compiler build code with these flags, and can the
result be loaded?* The answer decides the ISA, and with it the compile flags that are part
of every kernel's cache key; it does not guard the kernels themselves.

At precompile, :func:`recorded_probes` records every ``check_build`` answer (the ISA, the
flags, a hash of the test code) together with the CPU's capabilities and the compiler's
version; a process that had already probed re-probes so that nothing is missing, and the test
libraries land in ``DIR/kernels`` with the kernels. The marker torch 2.14+ writes beside a test
library once a child has loaded it (:func:`machine_local`) does not: it is the answer of the
machine that wrote it, and it would let the probe skip the load check on any machine.

At load, :func:`answered_probes` answers ``check_build`` from that record, without building or
starting a child, only when this machine has the same CPU capabilities and the same compiler
version (and the same torch, which the artifact directory's key already checks). Then the
answers are the ones the probe would give here, and inductor picks the same ISA and finds the
precompiled kernels by their keys. A question the record does not hold goes to the real
probe. On any difference, or when this process has already probed, nothing is changed: the
probe runs (or has run) as usual.

Torch keeps the answers for the rest of the process (``functools.cache``), as it does after
its own probe; the substitute itself is removed when loading ends.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import platform
from collections.abc import Callable, Iterator
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


def already_probed() -> bool:
    """Whether this process has decided its ISA (then there is nothing to record or save)."""
    module = _isa_module()
    return module is None or inductor.vec_isa_decided(module)


@contextlib.contextmanager
def recorded_probes(record: dict[str, Any]) -> Iterator[None]:
    """Fill ``record`` with every probe answer inductor needs while this context is open.

    Call it with the artifact's kernel directory as the inductor cache directory: a process
    that already probed probes again, so the test libraries are written there too.
    """
    module = _isa_module()
    if module is None or platform.machine() not in ("x86_64", "AMD64"):
        yield
        return
    if already_probed():
        # torch's in-process answers: the next use probes again (same answers: same machine,
        # same compiler), this time in the current cache directory
        inductor.forget_vec_isa_probe(module)
    probe = inductor.vec_isa_probe(module)
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
    if not record:  # not inductor on CPU: nothing to answer, and no inductor import
        yield
        return
    module = _isa_module()
    if module is None or already_probed():
        yield
        return
    reason = probe_mismatch(record)
    if reason is not None:
        logger.info("torchkiln: inductor's CPU ISA probe runs as usual: %s", reason)
        yield
        return
    answers: dict[str, bool] = record["probes"]
    probe = inductor.vec_isa_probe(module)

    def answering(isa: Any, code: str) -> bool:
        known = answers.get(probe_key(isa, code))
        return bool(probe(isa, code)) if known is None else known

    with inductor.vec_isa_probe_replaced(module, answering):
        yield
