"""docs/jobs.md: its YAML is a valid configuration, and its first command, run twice as the
page says (with aot_eager instead of inductor to keep CI short), prints the report lines the
page shows: served from rank 0, then from the store."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
import yaml
from launching import launch_env, read_ranks, torchrun

from torchkiln.engine.resolve import resolve_config

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "jobs.md"
FENCE = re.compile(r"^```(?P<info>[^\n`]*)\n(?P<body>.*?)^```\s*$", re.MULTILINE | re.DOTALL)


def blocks(language: str) -> list[str]:
    return [m["body"] for m in FENCE.finditer(PAGE.read_text()) if m["info"].strip() == language]


def test_the_yaml_example_is_a_valid_configuration(tmp_path: Path) -> None:
    [text] = blocks("yaml")
    path = tmp_path / "torchkiln.yaml"
    path.write_text(text)
    job = resolve_config(str(path), env={}).config.job
    assert (job.share, job.timeout, job.store) == ("auto", 1800.0, "/shared/kiln")
    assert yaml.safe_load(text)["job"]["store"] == "/shared/kiln"


@pytest.mark.distributed
@pytest.mark.needs_feature("precompiled artifacts")
def test_the_first_command_shares_then_restarts_from_the_store(tmp_path: Path) -> None:
    words = shlex.split(blocks("bash")[0].replace("\\\n", " "))
    env = dict(w.split("=", 1) for w in words if re.fullmatch(r"[A-Z_]+=.*", w))
    command = [w for w in words if w not in {f"{k}={v}" for k, v in env.items()}]
    assert command[:2] == ["torchrun", "--nproc_per_node=2"]
    script, *args = command[2:]
    assert (script, args) == ("examples/distributed_train.py", ["--json", "out/"])
    env |= {"TORCHKILN_JOB_STORE": str(tmp_path / "store"), "TORCHKILN_BACKEND": "aot_eager"}
    runs = []
    for name in ("first", "restart"):
        out = tmp_path / name
        out.mkdir()
        process = torchrun(REPO / script, ["--json", str(out)], cwd=REPO, env=launch_env(env))
        runs.append(read_ranks(out, process))
    shown = [b for b in blocks("text") if b.startswith("job:")]
    first, restart = ([r["job"] for r in ranks] for ranks in runs)
    store = str(tmp_path / "store")
    assert first[1][0] == shown[0].splitlines()[0].replace("/tmp/kiln-store", store)
    assert first[0][1].startswith("  LlamaDecoderLayer: compiled, sent to rank(s) 1")
    # the rank-invariance check's trace, then no compile on the receiving rank
    assert first[1][1].startswith(
        "  LlamaDecoderLayer: serving from rank 0, shared as a saved function (trace "
    )
    assert ", compile 0.0 s, " in first[1][1]
    assert [lines[1].split(" (")[0] for lines in restart] == [
        shown[1].splitlines()[1].split(" (")[0]
    ] * 2
    assert json.dumps(restart).count("compile 0.0 s") == 2
