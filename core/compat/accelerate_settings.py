"""Accelerate's dynamo settings, read as Accelerate writes them, mapped onto ``CompileConfig``.

The ``ACCELERATE_DYNAMO_*`` variables and the ``dynamo_config`` section of the file ``accelerate
config`` writes are read into :class:`AccelerateDynamo`, then turned into
``resolve_compile_config``'s nested override mapping. It never imports Accelerate. Where it
departs from Accelerate (a false ``dynamic`` is left unset, ``mode: default`` is ``None``),
docs/migrating-from-accelerate.md says why.
"""

from __future__ import annotations

import enum
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from torchkiln.configuration.yaml_reader import parse_yaml, read_config_text
from torchkiln.errors import ConfigError, ConfigProblem

ENV_PREFIX = "ACCELERATE_DYNAMO_"
ENV_BACKEND = ENV_PREFIX + "BACKEND"
ENV_MODE = ENV_PREFIX + "MODE"
ENV_FULLGRAPH = ENV_PREFIX + "USE_FULLGRAPH"
ENV_DYNAMIC = ENV_PREFIX + "USE_DYNAMIC"
ENV_REGIONAL = ENV_PREFIX + "USE_REGIONAL_COMPILATION"
ENV_NAMES = (ENV_BACKEND, ENV_MODE, ENV_FULLGRAPH, ENV_DYNAMIC, ENV_REGIONAL)

TRUE_WORDS = ("y", "yes", "t", "true", "on", "1")
FALSE_WORDS = ("n", "no", "f", "false", "off", "0")

# Keys of an accelerate config file's ``dynamo_config`` section, by the field they set.
# ``accelerate launch`` also accepts them without the ``dynamo_`` prefix.
YAML_KEYS = {
    "dynamo_backend": "backend",
    "dynamo_mode": "mode",
    "dynamo_use_fullgraph": "fullgraph",
    "dynamo_use_dynamic": "dynamic",
    "dynamo_use_regional_compilation": "regional",
}


class DynamoBackend(enum.StrEnum):
    """Accelerate's dynamo backend names (all sixteen members, same values).

    Lookup is case-insensitive: ``DynamoBackend("inductor") is DynamoBackend.INDUCTOR``.
    """

    NO = "NO"
    EAGER = "EAGER"
    AOT_EAGER = "AOT_EAGER"
    INDUCTOR = "INDUCTOR"
    AOT_TS_NVFUSER = "AOT_TS_NVFUSER"
    NVPRIMS_NVFUSER = "NVPRIMS_NVFUSER"
    CUDAGRAPHS = "CUDAGRAPHS"
    OFI = "OFI"
    FX2TRT = "FX2TRT"
    ONNXRT = "ONNXRT"
    TENSORRT = "TENSORRT"
    AOT_TORCHXLA_TRACE_ONCE = "AOT_TORCHXLA_TRACE_ONCE"
    TORCHXLA_TRACE_ONCE = "TORCHXLA_TRACE_ONCE"
    TVM = "TVM"
    HPU_BACKEND = "HPU_BACKEND"
    NEURON = "NEURON"

    @classmethod
    def _missing_(cls, value: object) -> DynamoBackend | None:
        if isinstance(value, str):
            return cls.__members__.get(value.strip().upper())
        return None

    @classmethod
    def list(cls) -> list[str]:
        """Every member's value, in declaration order (as Accelerate's ``BaseEnum.list``)."""
        return [member.value for member in cls]


@attrs.frozen
class BackendMapping:
    """Where one Accelerate backend name lands in torchkiln."""

    torchkiln: str | None
    """The torchkiln backend name, or ``None`` when torchkiln has none for it."""
    note: str = ""
    """Why the name maps as it does (shown in errors and in the migration page)."""
    torch_name: str | None = None
    """For an unmapped name: the torch registry name to use if this torch still has it."""


_REMOVED_NVFUSER = "nvFuser and the TorchScript backends were removed from PyTorch; use inductor"

BACKEND_MAP: Mapping[DynamoBackend, BackendMapping] = {
    DynamoBackend.NO: BackendMapping("no", "compilation off"),
    DynamoBackend.EAGER: BackendMapping("eager"),
    DynamoBackend.AOT_EAGER: BackendMapping("aot_eager"),
    DynamoBackend.INDUCTOR: BackendMapping("inductor"),
    DynamoBackend.AOT_TS_NVFUSER: BackendMapping(None, _REMOVED_NVFUSER, "aot_ts_nvfuser"),
    DynamoBackend.NVPRIMS_NVFUSER: BackendMapping(None, _REMOVED_NVFUSER, "nvprims_nvfuser"),
    DynamoBackend.CUDAGRAPHS: BackendMapping("cudagraphs"),
    DynamoBackend.OFI: BackendMapping(
        None, "torch no longer registers the TorchScript 'ofi' backend; use inductor", "ofi"
    ),
    DynamoBackend.FX2TRT: BackendMapping(
        "tensorrt", "Torch-TensorRT's dynamo backend replaced its FX (fx2trt) path"
    ),
    DynamoBackend.ONNXRT: BackendMapping(
        None,
        "torch no longer registers an 'onnxrt' torch.compile backend and no torchkiln "
        "plugin provides one",
        "onnxrt",
    ),
    DynamoBackend.TENSORRT: BackendMapping("tensorrt", "Torch-TensorRT"),
    DynamoBackend.AOT_TORCHXLA_TRACE_ONCE: BackendMapping("xla", "PyTorch/XLA, training"),
    DynamoBackend.TORCHXLA_TRACE_ONCE: BackendMapping(
        "xla_inference", "PyTorch/XLA, inference only"
    ),
    DynamoBackend.TVM: BackendMapping("tvm", "Apache TVM"),
    DynamoBackend.HPU_BACKEND: BackendMapping("hpu", "Intel Gaudi's hpu_backend"),
    DynamoBackend.NEURON: BackendMapping("neuron", "AWS Neuron"),
}


def _error(path: str, message: str, source: str) -> ConfigError:
    return ConfigError([ConfigProblem(path, message, source)])


def parse_backend(value: object, path: str, source: str) -> DynamoBackend:
    """Accelerate's backend name (any case, or a :class:`DynamoBackend`) as a member."""
    try:
        return DynamoBackend(value)  # type: ignore[arg-type]  # any case; _missing_ handles it
    except ValueError:
        allowed = ", ".join(name.lower() for name in DynamoBackend.list())
        raise _error(
            path,
            f"{value!r} is not an Accelerate dynamo backend; allowed (any case): {allowed}",
            source,
        ) from None


def torchkiln_backend(member: DynamoBackend, path: str = "$.backend", source: str = "") -> str:
    """The torchkiln backend for an Accelerate backend, or a ``ConfigError`` saying why none."""
    mapping = BACKEND_MAP[member]
    if mapping.torchkiln is not None:
        return mapping.torchkiln
    if mapping.torch_name is not None:
        import torch.compiler

        if mapping.torch_name in torch.compiler.list_backends(exclude_tags=()):
            return mapping.torch_name
    mapped = ", ".join(m.value.lower() for m, b in BACKEND_MAP.items() if b.torchkiln)
    message = (
        f"Accelerate's dynamo backend {member.value!r} has no torchkiln backend: {mapping.note}. "
        f"Accelerate names that map: {mapped}. Or pass backend= / set TORCHKILN_BACKEND to "
        f"any torchkiln backend{_known_backends_hint()}"
    )
    raise _error(path, message, source)


def _known_backends_hint() -> str:
    """`` (here: a, b, c)`` from the default plugin manager, or a pointer to the CLI."""
    try:
        from torchkiln.plugin_host.default_manager import get_plugin_manager

        names = sorted(get_plugin_manager().backends(include_torch=False))
    except Exception:  # an error message must not fail while being built
        return " (`torchkiln plugins` lists them)"
    return f" (plugins here: {', '.join(names)}; `torchkiln plugins` lists torch's too)"


def parse_truth(value: object, path: str, source: str) -> bool:
    """Accelerate's truth values (``str_to_bool``): yes/no words, 1/0, or a YAML boolean."""
    if isinstance(value, bool):
        return value
    word = str(value).strip().lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    raise _error(
        path,
        f"{value!r} is not a truth value; allowed: "
        f"{', '.join(TRUE_WORDS)} / {', '.join(FALSE_WORDS)}",
        source,
    )


def env_truth(name: str, path: str) -> bool | None:
    """The truth value of the variable ``name``; ``None`` when unset or empty."""
    raw = os.environ.get(name, "").strip()
    return parse_truth(raw, path, f"env:{name}") if raw else None


@attrs.frozen
class AccelerateDynamo:
    """Accelerate's dynamo settings; ``None`` means not given."""

    backend: DynamoBackend | None = None
    mode: str | None = None
    fullgraph: bool | None = None
    dynamic: bool | None = None
    regional: bool | None = None
    origins: Mapping[str, str] = attrs.field(factory=dict, eq=False)
    """Where each given field came from: ``env:NAME`` or ``file:PATH``."""

    def merged_over(self, lower: AccelerateDynamo) -> AccelerateDynamo:
        """These settings, with ``lower``'s filling the fields not given here."""
        given = {field: getattr(self, field) for field in self.origins}
        return attrs.evolve(lower, **given, origins={**lower.origins, **self.origins})

    @property
    def is_empty(self) -> bool:
        return not self.origins


def _parse_field(field: str, value: object, path: str, source: str) -> Any:
    if field == "backend":
        return parse_backend(value, path, source)
    if field == "mode":
        return str(value)
    return parse_truth(value, path, source)


_ENV_FIELDS = {
    ENV_BACKEND: ("backend", "$.backend"),
    ENV_MODE: ("mode", "$.mode"),
    ENV_FULLGRAPH: ("fullgraph", "$.fullgraph"),
    ENV_DYNAMIC: ("dynamic", "$.dynamic"),
    ENV_REGIONAL: ("regional", "$.regions.strategy"),
}


def read_env(environ: Mapping[str, str] | None = None) -> AccelerateDynamo:
    """The ``ACCELERATE_DYNAMO_*`` variables that are set (an empty value counts as unset)."""
    environ = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    origins: dict[str, str] = {}
    for name, (field, path) in _ENV_FIELDS.items():
        raw = environ.get(name, "").strip()
        if raw:
            values[field] = _parse_field(field, raw, path, f"env:{name}")
            origins[field] = f"env:{name}"
    return AccelerateDynamo(**values, origins=origins)


def read_yaml(path: str | os.PathLike[str]) -> AccelerateDynamo:
    """The dynamo settings of an ``accelerate config`` YAML (or JSON) file.

    Reads ``dynamo_config`` (keys with or without the ``dynamo_`` prefix) and the older
    top-level ``dynamo_backend`` form. Every other key of the file is ignored here.
    """
    source = f"file:{path}"
    document = load_mapping(Path(path), source)
    section = _dynamo_section(document, source)
    values: dict[str, Any] = {}
    for key, value in section.items():
        field = YAML_KEYS.get(key) or YAML_KEYS.get(f"dynamo_{key}")
        where = f"$.dynamo_config.{key}"
        if field is None:
            raise _error(
                where,
                f"unknown dynamo_config key {key!r}; allowed: {', '.join(YAML_KEYS)}",
                source,
            )
        if value is None:
            continue
        values[field] = _parse_field(field, value, where, source)
    return AccelerateDynamo(**values, origins=dict.fromkeys(values, source))


def load_mapping(path: Path, source: str) -> Mapping[str, Any]:
    """The whole Accelerate config file (``{}`` when empty)."""
    # torchkiln's own reader: size, depth and alias limits, UTF-8, regular files only, plain
    # data (JSON is YAML too: old accelerate configs load here).
    document = parse_yaml(read_config_text(path, source, what="the Accelerate config file"), source)
    if document is None:
        return {}
    if not isinstance(document, Mapping):
        raise _error(
            "$",
            f"an Accelerate config file is a mapping, not {type(document).__name__}",
            source,
        )
    return document


def _dynamo_section(document: Mapping[str, Any], source: str) -> Mapping[str, Any]:
    section = document.get("dynamo_config") or {}
    if not isinstance(section, Mapping):
        raise _error("$.dynamo_config", f"must be a mapping, not {type(section).__name__}", source)
    if "dynamo_backend" in document:  # the older form, before dynamo_config existed
        if section:
            raise _error(
                "$.dynamo_backend",
                "given both at the top level (the old form) and in "
                "dynamo_config; keep only dynamo_config",
                source,
            )
        return {"dynamo_backend": document["dynamo_backend"]}
    return section


def to_overrides(
    settings: AccelerateDynamo, sources: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """The ``resolve_compile_config`` override mapping for ``settings``.

    Only fields whose ``sources`` entry is ``default`` (or missing) are set, so torchkiln's own
    YAML, ``TORCHKILN_*`` variables and keyword options win. Without a backend, or with
    ``NO``, the other settings are ignored, as in Accelerate, where they only apply when
    dynamo is on.
    """
    sources = sources or {}
    if settings.backend is None:
        return {}
    overrides: dict[str, Any] = {}

    def put(path: str, value: Any) -> None:
        if sources.get(path, "default") != "default":
            return
        *parents, leaf = path.split(".")
        target = overrides
        for parent in parents:
            target = target.setdefault(parent, {})
        target[leaf] = value

    origin = settings.origins.get("backend", "")
    put("backend", torchkiln_backend(settings.backend, "$.backend", origin))
    if settings.backend is DynamoBackend.NO:
        return overrides
    if settings.mode is not None and settings.mode.lower() != "default":
        put("mode", settings.mode)
    if settings.fullgraph is not None:
        put("fullgraph", settings.fullgraph)
    if settings.dynamic:  # false means "not asked for" (docs/migrating-from-accelerate.md)
        put("dynamic", True)
    if settings.regional is not None and sources.get("regions.strategy", "default") == "default":
        put("regions.strategy", "repeated" if settings.regional else "whole")
        if settings.regional:  # Accelerate compiles the rest (lm_head, ...) separately too
            put("regions.rest", "leaves")
    return overrides
