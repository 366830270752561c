"""Per-region progress during the first (compiling) call: shown on a terminal or when forced,
silent otherwise, and gone from the forward path after the first call."""

from __future__ import annotations

import io

import pytest
import torch
import torch._dynamo

import torchkiln
from torchkiln.configuration.config import CompileConfig
from torchkiln.engine.progress import NullProgress, StreamProgress, make_progress
from torchkiln.examples import example_inputs, llama
from torchkiln.testing import isolated_plugin_manager


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _first_call(progress: str, depth: int = 3) -> torch.nn.Module:
    model = llama(depth=depth)
    torchkiln.compile(model, backend="eager", progress=progress, plugins=isolated_plugin_manager())
    with torch.no_grad():
        model(example_inputs(model, batch=1, seq=8))
    return model


def test_on_writes_one_line_per_group_and_a_summary(capsys: pytest.CaptureFixture[str]) -> None:
    _first_call("on")
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "compiling 1/1 groups: LlamaDecoderLayer (model.layers.0) ..."
    assert lines[1].startswith("compiled group 1/1: LlamaDecoderLayer (model.layers.0) in ")
    assert lines[2].startswith("compiled 1 group (3 regions) in ")
    assert len(lines) == 3, "reused regions add no lines on a plain stream"


def test_auto_is_silent_when_stderr_is_not_a_terminal(capsys: pytest.CaptureFixture[str]) -> None:
    _first_call("auto")
    assert capsys.readouterr().err == ""


def test_off_is_silent(capsys: pytest.CaptureFixture[str]) -> None:
    _first_call("off")
    assert capsys.readouterr().err == ""


def test_nothing_left_on_the_forward_path_after_the_first_call(
    capsys: pytest.CaptureFixture[str],
) -> None:
    model = _first_call("on", depth=2)
    capsys.readouterr()
    with torch.no_grad():
        model(example_inputs(model, batch=1, seq=8))
    assert capsys.readouterr().err == ""
    for layer in model.model.layers:
        installed = layer.__dict__["forward"]
        assert installed.run is installed.code  # no first-call step: the group's code runs


def _plan_and_config(progress: str) -> tuple[torchkiln.plugin.RegionPlan, CompileConfig]:
    model = llama(depth=2)
    plan = torchkiln.plan(model, backend="eager", plugins=isolated_plugin_manager())
    return plan, CompileConfig(backend="eager", progress=progress)


def test_auto_on_a_terminal_rewrites_one_line_in_place() -> None:
    plan, config = _plan_and_config("auto")
    terminal = FakeTerminal()
    progress = make_progress(config, plan, stream=terminal)
    assert isinstance(progress, StreamProgress) and progress.live
    first, second = plan.groups[0].regions
    progress.start(first, 0, 1)
    progress.done(first, 2.5, True)
    progress.start(second, 0, 1)
    assert terminal.getvalue().endswith(
        "\r\x1b[Kreusing 1/1 groups: LlamaDecoderLayer (model.layers.1) ..."
    )
    assert "\n" not in terminal.getvalue(), "the line is rewritten, not repeated"
    progress.done(second, 0.5, True)
    assert terminal.getvalue().endswith("\r\x1b[Kcompiled 1 group (2 regions) in 3.0 s\n")
    assert terminal.getvalue().startswith(
        "\r\x1b[Kcompiling 1/1 groups: LlamaDecoderLayer (model.layers.0) ..."
    )


@pytest.mark.parametrize(
    ("setting", "terminal", "shown"),
    [("auto", True, True), ("auto", False, False), ("on", False, True), ("off", True, False)],
)
def test_make_progress_choice(setting: str, terminal: bool, shown: bool) -> None:
    plan, config = _plan_and_config(setting)
    stream = FakeTerminal() if terminal else io.StringIO()
    progress = make_progress(config, plan, stream=stream)
    assert isinstance(progress, StreamProgress) is shown
    assert isinstance(progress, NullProgress) is not shown


def test_no_progress_when_compilation_is_off() -> None:
    plan, _ = _plan_and_config("on")
    config = CompileConfig(backend="no", progress="on")
    assert isinstance(make_progress(config, plan, stream=FakeTerminal()), NullProgress)


def test_the_docs_examples_print_what_they_show(capsys: pytest.CaptureFixture[str]) -> None:
    """docs/progress.md: the first example's standard error and the second's standard output
    are the ```text blocks that follow them (timings and column widths aside)."""
    import re
    from pathlib import Path

    from doc_output import assert_shown_output

    text = (Path(__file__).parents[2] / "docs" / "progress.md").read_text()
    fences = re.findall(r"^```(\w*)\n(.*?)^```$", text, re.MULTILINE | re.DOTALL)
    code = [body for language, body in fences if language == "python"]
    shown = [body for language, body in fences if language == "text"]
    assert len(code) == len(shown) == 2
    namespace: dict[str, object] = {}
    exec(compile(code[0], "docs/progress.md (progress)", "exec"), namespace)
    assert_shown_output(capsys.readouterr().err, shown[0], "docs/progress.md, progress")
    exec(compile(code[1], "docs/progress.md (report)", "exec"), namespace)
    assert_shown_output(capsys.readouterr().out, shown[1], "docs/progress.md, report")
