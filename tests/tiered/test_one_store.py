"""One store (``store=DIR``): what a run compiles lands there, and the next process that names
it starts from the best form it holds, with no extra step.

The two-process tests run the same script twice in fresh interpreters, as a user restarting a
job would; the second's Dynamo counters are the witness that it compiled nothing.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import torch
from json_scripts import run_json_script

import torchkiln
from torchkiln._internals.versions import feature_problem
from torchkiln.configuration.store_layout import KERNELS, WHOLE
from torchkiln.engine.resolve import resolve_config
from torchkiln.errors import ConfigError
from torchkiln.jobs.store import ENTRIES, JobStore

SCRIPT = textwrap.dedent(
    """
    import json, sys, time
    import torch, torchkiln, torchkiln.tiered
    from torch._dynamo.utils import counters
    sys.path.insert(0, sys.argv[3])
    from tiered_models import tiny_llama

    torch.manual_seed(0)
    model = tiny_llama()
    reference = tiny_llama()
    reference.load_state_dict(model.state_dict())
    options = json.loads(sys.argv[2])
    model = torchkiln.compile(model, **{"store": sys.argv[1], "backend": "aot_eager", **options})
    tokens = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        started = time.perf_counter()
        first = model(tokens).logits
        first_seconds = time.perf_counter() - started
        if options.get("tiered", {}).get("enabled", True):
            assert torchkiln.tiered.wait(model, 600)
        later = [model(tokens).logits for _ in range(2)]
        expected = reference(tokens).logits
    exact = all(torch.equal(out, expected) or torch.allclose(out, expected, atol=1e-5)
                for out in (first, *later))
    report = torchkiln.report(model)
    tiers = report.tiers
    print(json.dumps({
        "exact": exact,
        "first_seconds": first_seconds,
        "unique_graphs": counters["stats"]["unique_graphs"],
        "tiers_state": tiers.state if tiers is not None else None,
        "tiers_source": tiers.source if tiers is not None else None,
        "loaded_from": tiers.loaded_from if tiers is not None else None,
        "roles": [g.role for g in report.job.groups] if report.job is not None else [],
        "report": str(report),
    }))
    """
)


def _run(store: Path, tmp_path: Path, /, **options: object) -> dict[str, object]:
    here = str(Path(__file__).resolve().parent)
    return run_json_script(
        tmp_path, "run_with_store.py", SCRIPT, str(store), json.dumps(options), here
    )


@pytest.mark.needs_feature("tiered compilation")
def test_a_second_process_naming_the_store_starts_from_the_whole_model_form(tmp_path):
    store = tmp_path / "store"
    first = _run(store, tmp_path, tiered={"when": "always", "max_slowdown": 0})
    assert first["exact"] and (first["tiers_state"], first["tiers_source"]) == (
        "serving",
        "the builder",
    )
    assert first["roles"] == ["compiled"]  # the group's entry, compiled and stored
    assert first["unique_graphs"] >= 1
    (entry,) = JobStore(store).entries.iterdir()
    assert (entry / "meta.json").is_file()
    (form,) = (store / WHOLE).iterdir()
    assert (form / "meta.json").is_file() and not form.name.startswith(".")
    assert (store / KERNELS).is_dir()

    second = _run(store, tmp_path, tiered={"when": "always", "max_slowdown": 0})
    assert second["exact"]
    assert (second["tiers_state"], second["tiers_source"]) == ("serving", str(form))
    assert second["loaded_from"] == str(form)
    assert second["unique_graphs"] == 0, second["report"]  # Dynamo compiled nothing
    assert f"loaded from {form} when compiled" in second["report"]
    assert "LlamaDecoderLayer: pending (not called yet)" in second["report"]
    assert [p.name for p in (store / WHOLE).iterdir()] == [form.name]  # nothing new written


@pytest.mark.needs_feature("tiered compilation")
def test_with_tiered_off_a_stored_form_still_serves_unless_the_store_is_named_by_parts(tmp_path):
    """docs/tiered.md, "With tiered off, a stored form still serves": loaded at compile, no
    builder; cache_dir and job.store instead of store= read the region entries only."""
    store = tmp_path / "store"
    first = _run(store, tmp_path, tiered={"when": "always", "max_slowdown": 0})
    assert (first["tiers_state"], first["tiers_source"]) == ("serving", "the builder")
    (form,) = (store / WHOLE).iterdir()

    off = _run(store, tmp_path, tiered={"enabled": False})
    assert off["exact"] and off["tiers_state"] == "serving" and off["loaded_from"] == str(form)
    assert f"tiers: whole-model form serving from {form}; calls" in off["report"]
    assert "builder:" not in off["report"]  # nothing was built in that process

    by_parts = {"store": None, "cache_dir": str(store / KERNELS), "job": {"store": str(store)}}
    regional = _run(store, tmp_path, tiered={"enabled": False}, **by_parts)
    assert regional["exact"] and regional["tiers_state"] is None
    assert regional["roles"] == ["store"] and regional["unique_graphs"] == 0, regional["report"]


@pytest.mark.needs_feature("precompiled artifacts")
def test_without_a_whole_model_form_the_regions_load_from_the_store(tmp_path):
    store = tmp_path / "store"
    first = _run(store, tmp_path, tiered={"enabled": False})
    assert first["exact"] and first["tiers_state"] is None and first["roles"] == ["compiled"]
    assert not any((store / WHOLE).iterdir()) if (store / WHOLE).exists() else True
    second = _run(store, tmp_path, tiered={"enabled": False})
    assert second["exact"] and second["roles"] == ["store"], second["report"]
    assert second["unique_graphs"] == 0, second["report"]


def test_store_fills_the_settings_it_subsumes_and_names_itself_as_their_source(tmp_path):
    resolved = resolve_config(None, store=str(tmp_path / "s"), backend="aot_eager")
    config = resolved.config
    assert config.cache_dir == str(tmp_path / "s" / KERNELS)
    assert config.job.store == str(tmp_path / "s")
    assert resolved.sources["cache_dir"] == "store (argument)"
    assert resolved.sources["job.store"] == "store (argument)"
    if feature_problem("tiered compilation") is None:
        assert config.tiered.enabled and resolved.sources["tiered.enabled"] == "store (argument)"
    else:  # a torch without tiered compilation: the store keeps the kernels and entries only
        assert not config.tiered.enabled


def test_a_value_set_explicitly_wins_over_the_store(tmp_path):
    resolved = resolve_config(
        None,
        store=str(tmp_path / "s"),
        cache_dir=str(tmp_path / "kernels"),
        job={"store": str(tmp_path / "entries")},
        tiered={"enabled": False},
        backend="aot_eager",
    )
    assert resolved.config.cache_dir == str(tmp_path / "kernels")
    assert resolved.config.job.store == str(tmp_path / "entries")
    assert not resolved.config.tiered.enabled
    assert resolved.sources["cache_dir"] == "argument"


def test_store_from_the_environment_is_named_as_the_source(tmp_path):
    env = {"TORCHKILN_STORE": str(tmp_path / "s")}
    resolved = resolve_config(None, env=env, backend="aot_eager", cwd=tmp_path)
    assert resolved.config.store == str(tmp_path / "s")
    assert resolved.sources["cache_dir"] == "store (env:TORCHKILN_STORE)"


@pytest.mark.parametrize("bad", ["", "   "])
def test_an_empty_store_is_refused_naming_the_field(bad):
    with pytest.raises(ConfigError) as raised:
        resolve_config(None, store=bad)
    (problem,) = raised.value.problems
    assert problem.path == "$.store"
    assert "an empty store would put what torchkiln compiles in the working directory" in (
        problem.message
    )


def test_a_store_that_is_a_file_is_refused(tmp_path):
    path = tmp_path / "file"
    path.write_text("x")
    with pytest.raises(ConfigError, match=r"\$\.store.*exists and is not a directory"):
        resolve_config(None, store=str(path))


def test_implied_tiers_stand_down_for_a_backend_that_cannot_save(tmp_path):
    """``eager`` cannot save its compiled code: with a store (tiered not asked for) the model
    compiles regionally, no builder starts, nothing is raised, and the report says why the
    store keeps no entry."""
    from tiered_models import tiny_llama

    model = torchkiln.compile(tiny_llama(), backend="eager", store=str(tmp_path / "s"))
    try:
        assert "forward" not in model.__dict__  # no tier forward on the root
        with torch.no_grad():
            model(torch.randint(0, 256, (1, 6)))
        report = torchkiln.report(model)
    finally:
        torchkiln.decompile(model)  # puts inductor's cache directory back
    assert report.tiers is None
    missing = feature_problem("precompiled artifacts")  # a torch that cannot save says that
    why = missing if missing is not None else "backend 'eager' does not declare"
    assert not report.job.sharing and why in report.job.reason
    assert not (tmp_path / "s" / ENTRIES).exists()  # nothing it could keep, nothing made


def test_a_published_form_is_kept_when_another_writer_was_first(tmp_path):
    store = JobStore(tmp_path, section=WHOLE, marker="meta.json")
    key = "a" * 64
    theirs = store.staging(key)
    (theirs / "meta.json").write_text("{}")
    published = store.publish(theirs, key)
    mine = store.staging(key)
    (mine / "meta.json").write_text('{"mine": 1}')
    assert store.publish(mine, key) == published
    assert (published / "meta.json").read_text() == "{}" and not mine.exists()
    assert store.find(key) == published
