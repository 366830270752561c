"""The bench names the CPU it ran on precisely enough to tell two machines apart."""

from __future__ import annotations

from torchkiln.bench.results import cpu_model

SAPPHIRE = """processor\t: 0
vendor_id\t: GenuineIntel
cpu family\t: 6
model\t\t: 207
model name\t: Intel(R) Xeon(R) Processor
flags\t\t: fpu sse avx2 avx512f avx512bw amx_tile amx_bf16

processor\t: 1
model name\t: Something Else
"""


def test_a_generic_model_name_gets_family_model_and_vector_extensions() -> None:
    assert (
        cpu_model(SAPPHIRE)
        == "Intel(R) Xeon(R) Processor (cpu family 6, model 207, avx2, avx512, amx)"
    )


def test_extensions_the_cpu_lacks_are_not_named() -> None:
    older = SAPPHIRE.replace(" avx512f avx512bw amx_tile amx_bf16", "")
    assert cpu_model(older) == "Intel(R) Xeon(R) Processor (cpu family 6, model 207, avx2)"


def test_a_cpuinfo_without_a_model_name_falls_back_to_platform(monkeypatch) -> None:
    monkeypatch.setattr("platform.processor", lambda: "aarch64-ish")
    assert cpu_model("processor\t: 0\nBogoMIPS\t: 50.00\n") == "aarch64-ish"
