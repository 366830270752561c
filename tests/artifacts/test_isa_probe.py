"""Inductor's CPU ISA probe, recorded at precompile and answered at load
(``torchkiln.artifacts.isa_probe``), against a stand-in for ``torch._inductor.cpu_vec_isa``: no compiler
runs. The real probe, end to end, is in test_precompile.py's slow inductor test."""

from __future__ import annotations

import functools
import types
from pathlib import Path
from typing import Any

import pytest

from torchkiln.artifacts import isa_probe

BASE_CODE, EXTENSION_CODE = "base test code", "extension test code"


def fake_isa_module(built: dict[str, bool]) -> types.SimpleNamespace:
    """Two ISAs as torch has them: a probe per test code, an extension probe whose success
    is kept on the instance and changes its flags, results cached per process."""
    probes: list[str] = []

    class VecISA:
        _flags = ""

        def build_arch_flags(self) -> str:
            return self._flags

        def check_build(self, code: str) -> bool:
            probes.append(f"{self}:{code}")
            return built.get(str(self), False)

        @functools.cache  # noqa: B019 - as torch does
        def __bool__(self) -> bool:
            return self.check_build(BASE_CODE)

    class Wide(VecISA):
        _flags = "-mwide"
        _is_extension_supported = False

        def __str__(self) -> str:
            return "wide"

        def build_arch_flags(self) -> str:
            return self._flags + (" -mext" if self._is_extension_supported else "")

        @functools.cache  # noqa: B019
        def __bool__(self) -> bool:
            if not self.check_build(BASE_CODE):
                return False
            if self.check_build(EXTENSION_CODE):
                self._is_extension_supported = True
            return True

    class Narrow(VecISA):
        _flags = "-mnarrow"

        def __str__(self) -> str:
            return "narrow"

    supported = [Wide(), Narrow()]

    @functools.cache
    def valid_vec_isa_list() -> list[Any]:
        return [isa for isa in supported if isa]

    return types.SimpleNamespace(
        VecISA=VecISA,
        supported_vec_isa_list=supported,
        valid_vec_isa_list=valid_vec_isa_list,
        probes=probes,
    )


CPU = {"machine": "x86_64", "avx2": True, "avx512": False}
COMPILER = "g++=gcc version 12"


@pytest.fixture
def machine(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """This machine's CPU capabilities and compiler, as the probe module sees them."""
    here = {"cpu": dict(CPU), "compiler": COMPILER}
    monkeypatch.setattr(isa_probe, "cpu_capabilities", lambda: dict(here["cpu"]))
    monkeypatch.setattr(isa_probe, "compiler_version", lambda: here["compiler"])
    monkeypatch.setattr(isa_probe.platform, "machine", lambda: "x86_64")
    return here


def use(monkeypatch: pytest.MonkeyPatch, module: types.SimpleNamespace) -> None:
    monkeypatch.setattr(isa_probe, "_isa_module", lambda: module)


def record_on(
    monkeypatch: pytest.MonkeyPatch, built: dict[str, bool], *, probe_first: bool = False
) -> dict[str, Any]:
    """The record a precompile writes in a process whose probe answers ``built``."""
    module = fake_isa_module(built)
    use(monkeypatch, module)
    if probe_first:  # an earlier compile in the same process already probed
        module.valid_vec_isa_list()
    record: dict[str, Any] = {}
    with isa_probe.recorded_probes(record):
        pass
    return record


def test_precompile_records_every_answer_with_the_machine(
    monkeypatch: pytest.MonkeyPatch, machine: dict[str, Any]
) -> None:
    record = record_on(monkeypatch, {"wide": True, "narrow": True})
    assert record["cpu"] == CPU and record["compiler"] == COMPILER
    keys = sorted(record["probes"])
    assert len(keys) == 3 and all(record["probes"].values())
    # The extension probe ran with the base flags; the narrow ISA with its own.
    assert [k.split("|")[:2] for k in keys] == [
        ["narrow", "-mnarrow"],
        ["wide", "-mwide"],
        ["wide", "-mwide"],
    ]


def test_a_process_that_probed_before_probes_again_as_a_new_one_would(
    monkeypatch: pytest.MonkeyPatch, machine: dict[str, Any]
) -> None:
    fresh = record_on(monkeypatch, {"wide": True, "narrow": True})
    again = record_on(monkeypatch, {"wide": True, "narrow": True}, probe_first=True)
    # Same keys: the extension found earlier does not leak into the base probe's flags.
    assert again["probes"] == fresh["probes"]


def test_loading_answers_the_probe_from_the_record(
    monkeypatch: pytest.MonkeyPatch, machine: dict[str, Any]
) -> None:
    record = record_on(monkeypatch, {"wide": True, "narrow": True})
    loading = fake_isa_module({})  # this process's real probe would fail everything
    use(monkeypatch, loading)
    real_probe = loading.VecISA.check_build
    with isa_probe.answered_probes(record):
        chosen = [str(isa) for isa in loading.valid_vec_isa_list()]
    assert chosen == ["wide", "narrow"]  # the recorded answers, not this probe's
    assert loading.probes == []  # nothing built, no child started
    assert loading.VecISA.check_build is real_probe  # the stand-in is gone after loading


def test_a_question_the_record_lacks_goes_to_the_real_probe(
    monkeypatch: pytest.MonkeyPatch, machine: dict[str, Any]
) -> None:
    record = record_on(monkeypatch, {"wide": True, "narrow": True})
    loading = fake_isa_module({"narrow": True})
    use(monkeypatch, loading)
    with isa_probe.answered_probes(record):
        assert loading.VecISA.check_build(loading.supported_vec_isa_list[1], "other code")
    assert loading.probes == ["narrow:other code"]


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"cpu": dict(CPU, avx512=True)}, "CPU capabilities differ"),
        ({"compiler": "g++=gcc version 13"}, "the C++ compiler"),
    ],
)
def test_another_cpu_or_compiler_probes_as_usual(
    monkeypatch: pytest.MonkeyPatch,
    machine: dict[str, Any],
    change: dict[str, Any],
    reason: str,
) -> None:
    record = record_on(monkeypatch, {"wide": True, "narrow": True})
    machine.update(change)
    assert reason in (isa_probe.probe_mismatch(record) or "")
    loading = fake_isa_module({"narrow": True})
    use(monkeypatch, loading)
    with isa_probe.answered_probes(record):
        chosen = [str(isa) for isa in loading.valid_vec_isa_list()]
    assert chosen == ["narrow"]  # this machine's own answers
    assert "wide:base test code" in loading.probes


def test_no_record_or_a_process_that_probed_changes_nothing(
    monkeypatch: pytest.MonkeyPatch, machine: dict[str, Any]
) -> None:
    assert isa_probe.probe_mismatch(None) == "the artifacts hold no probe answers"
    record = record_on(monkeypatch, {"wide": True, "narrow": True})
    loading = fake_isa_module({"narrow": True})
    use(monkeypatch, loading)
    loading.valid_vec_isa_list()  # probed before the load
    real_probe = loading.VecISA.check_build
    with isa_probe.answered_probes(record):
        assert loading.VecISA.check_build is real_probe


def test_artifacts_without_a_record_do_not_touch_inductor(
    monkeypatch: pytest.MonkeyPatch, machine: dict[str, Any]
) -> None:
    """aot_eager or GPU artifacts hold no record: loading them imports nothing of inductor's."""

    def no_inductor() -> None:
        raise AssertionError("the probe module was looked up")

    monkeypatch.setattr(isa_probe, "_isa_module", no_inductor)
    with isa_probe.answered_probes(None):
        pass


def test_the_probe_s_load_markers_do_not_travel_with_the_kernels(tmp_path: Path) -> None:
    """torch 2.14+ marks a test library its child loaded (``<library>.load_ok``) and then
    trusts the mark: a marker from the precompile machine would answer the probe's load check
    on a machine the record does not fit. The writer leaves markers out (and removes them);
    loading skips the ones a directory written before lists."""
    from torchkiln.artifacts.directory import kernel_files, stored_file
    from torchkiln.artifacts.precompiled import copy_kernels

    library, marker = "kernels/ab/cabc.so", "kernels/ab/cabc.so.load_ok"
    for name in (library, marker):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"\x7fELF" if name == library else b"")
    assert not isa_probe.machine_local(library) and isa_probe.machine_local(marker)
    listed_before = [stored_file(tmp_path, library), stored_file(tmp_path, marker)]
    assert [k.file for k in kernel_files(tmp_path)] == [library]
    assert not (tmp_path / marker).exists() and (tmp_path / library).exists()

    (tmp_path / marker).write_bytes(b"")  # an older directory: its manifest lists the marker
    cache = tmp_path / "cache"
    assert copy_kernels(tmp_path, listed_before, cache) == 1
    assert (cache / "ab" / "cabc.so").exists() and not (cache / "ab" / "cabc.so.load_ok").exists()
