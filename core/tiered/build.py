"""The whole-model form's source at run time: a builder process and what it produced.

:class:`WholeBuild` starts a builder for the families of calls the runtime saw, restarts it
once when later calls show more, paces it against the steps (:mod:`~torchkiln.tiered.governor`)
and, at the start of each call while it works, asks whether it finished: then it publishes the
form (the store) and hands its directory to the runtime. In a job whose ranks share, rank 0
builds and every rank learns the result at the same call (:mod:`~torchkiln.tiered.job_tiers`).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from torchkiln._internals.transformers import can_record_registry
from torchkiln.artifacts.directory import environment_key
from torchkiln.configuration.config import CompileConfig
from torchkiln.jobs.whole_store import BuildOutput
from torchkiln.tiered.calls import CallLog, describe_families
from torchkiln.tiered.decision import Machine, builder_problem, core_left_free
from torchkiln.tiered.governor import StepGovernor
from torchkiln.tiered.process import BuilderProcess
from torchkiln.tiered.weightless import dumps_weightless, unsendable

Say = Callable[[str], None]


class BuildFailed(Exception):
    """The build cannot give a form: the runtime stays regional (or keeps the form it has)."""


class WholeBuild:
    """The builder source of one runtime: its process, its request and its result."""

    def __init__(self, config: CompileConfig, region_paths: list[str], say: Say):
        self.config = config
        self.region_paths = region_paths
        self._say = say
        self.builder: BuilderProcess | None = None
        self.prestarted: BuilderProcess | None = None
        """A builder started at compile time, importing what it needs until the first call."""
        self.built_for: list[Any] = []
        """The families (:meth:`CallLog.families`) the current builder compiles for."""
        self.builds = 0
        self.processes = 0
        self.pending = False
        """Whether a build was asked for whose result the runtime has not taken yet."""
        self.keep_output = False
        """Whether a form was loaded from the output directory (then :meth:`stop` keeps it)."""
        self.rebuild_reason: str | None = None
        self.result: dict[str, Any] = {}
        self.output = BuildOutput(config, region_paths)
        self.governor = StepGovernor(config.tiered.max_slowdown)
        """Measures what the builder costs the steps and pauses it beyond the bound."""
        self.job: Any = None
        """A :class:`~torchkiln.tiered.job_tiers.JobTiers` in a job whose ranks share."""
        self._job_failure: dict[str, Any] | None = None

    @property
    def builds_here(self) -> bool:
        return self.job is None or self.job.builds_here

    def prestart(self, model: nn.Module) -> None:
        """Start the builder process now (compile time), so that it has imported torch and
        the model's modules (seconds) by the time the first call asks for a build."""
        if not self.builds_here or builder_problem(self.config, Machine.now(model)) is not None:
            return  # rank 0 builds for the job; or decided again at the first call, saying why
        if saved_functions_supported() and not unsendable(model):
            self.prestarted = self._new_builder(model)

    def start(
        self,
        model: nn.Module,
        log: CallLog,
        call: int,
        form_loaded: bool,
        rebuild_reason: str | None = None,
    ) -> str | None:
        """Ask for a build of what ``log`` saw (with ``rebuild_reason``: stop the builder and
        start one for everything seen). Returns what the runtime waits for meanwhile (``None``:
        nothing new, as when rank 0 could not build and tells the other ranks).

        :raises BuildFailed: no build can start here, and the runtime stays regional.
        """
        if rebuild_reason is not None:
            self.rebuild_reason = rebuild_reason
            self._say(f"restarting the builder: {rebuild_reason}")
            if self.builder is not None:
                self.builder.stop()
            self.governor.restarted()
        if not saved_functions_supported():
            raise BuildFailed(
                f"torch {torch.__version__} cannot save compiled functions "
                "(torch.compile(...).aot_compile and torch.compiler.load_compiled_function "
                "arrived in torch 2.13)"
            )
        problem = unsendable(model)
        if problem is not None:
            raise BuildFailed(problem)
        self.built_for = log.families()
        if not self.builds_here:
            self.builds += 1
            self.pending = True
            return "rank 0 builds the whole-model form for the job"
        problem = builder_problem(self.config, Machine.now(model))
        failure = {"ok": False, "error": problem, "decided": True}
        if problem is None:
            try:
                request = self._request(model, log, form_loaded)
            except Exception as error:
                problem = f"the model cannot be sent to a builder: {type(error).__name__}: {error}"
                failure = {"ok": False, "error": problem}  # "the builder failed: ..."
        if problem is not None:
            if self.job is None:
                raise BuildFailed(problem)
            # The other ranks wait for this rank's word at the next call: send it then.
            self.pending, self._job_failure = True, failure
            return None
        builder, self.prestarted = self.prestarted, None
        if builder is None or builder.process.poll() is not None:  # none started, or it died
            if builder is not None:
                builder.stop()
            builder = self._new_builder(model)
        builder.start(request)
        self.builder = builder
        self.builds += 1
        self.pending = True
        self._say(
            f"building the whole-model form in process {builder.process.pid} for "
            f"{describe_families(self.built_for)} (call {call})"
        )
        return "the whole-model form is being built"

    def pace(self) -> None:
        """Pause the running builder for this step, or let it run (the governor's bound)."""
        builder = self.builder
        if not self.pending or builder is None or not builder.started:
            return
        measured, builder.resumed_idle = not builder.resumed_idle, False
        builder.pause(not self.governor.step(time.perf_counter(), measured))
        if self.governor.priority is not None:
            builder.lower_priority(self.governor.priority)

    def poll(self) -> Path | None:
        """The directory of the finished form, published; ``None`` while it builds.

        :raises BuildFailed: the builder finished without a form.
        """
        directory = None
        if self.job is None:
            assert self.builder is not None
            result = self.builder.poll()
        else:  # every rank, every call until the switch: rank 0's result, or None
            mine = self._job_failure or (self.builder.poll() if self.builder else None)
            agreed = self.job.agree(mine, self.output.path)
            result = agreed["result"] if agreed is not None else None
            if result is not None and result.get("ok") and not self.job.builds_here:
                directory = self.job.write(agreed["files"])
        if result is None:
            return None
        self.pending = False
        self.result = result
        if not result.get("ok"):
            if result.get("decided"):
                raise BuildFailed(result["error"])
            skipped = "; ".join(s["reason"] for s in result.get("skipped", []))
            raise BuildFailed(f"the builder failed: {result.get('error') or skipped}")
        if directory is not None:
            return directory
        assert self.builder is not None
        built = self.output.path
        return self.output.publish(Path(self.builder.workdir) if built is None else built)

    def stop(self) -> None:
        """Stop the builders; remove a directory torchkiln made unless a form was loaded."""
        for builder in (self.builder, self.prestarted):
            if builder is not None:
                builder.stop()
        if not self.keep_output:
            self.output.remove()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the builder has finished; ``True`` if it has (or there is none here)."""
        return self.builder is None or self.builder.wait(timeout) is not None

    def _new_builder(self, model: nn.Module) -> BuilderProcess:
        """A builder process, importing what the build needs while it waits; at the lowest
        priority from the start when the steps leave no core free (``when: always``)."""
        builder = BuilderProcess(self.config.tiered.threads, _preload(model))
        self.processes += 1
        if not core_left_free(self.config, Machine.now(model)):
            self.governor.start_lowered()
        if self.governor.priority is not None:
            builder.lower_priority(self.governor.priority)
        return builder

    def _request(self, model: nn.Module, log: CallLog, form_loaded: bool) -> dict[str, Any]:
        output = self.output.directory(model, form_loaded=form_loaded)
        families = [
            {
                "kind": spec.kind,
                "training": spec.training,
                "call": log.calls[index],
                "dynamic": dims,
            }
            for spec, index, dims in self.built_for
        ]
        return {
            "model": dumps_weightless(model),
            "families": families,
            "config": self.config,
            "environment": environment_key(self.config, model),
            "region_paths": self.region_paths,
            "output": str(output),
            "nice": self.config.tiered.nice,
            "threads": self.config.tiered.threads,
            "intra_op_threads": torch.get_num_threads(),
            "registry": _output_registry(),
        }


def _preload(model: nn.Module) -> list[str]:
    """The modules of the model's classes, for a builder to import while it waits."""
    names = {type(module).__module__ for module in model.modules()}
    return sorted(name for name in names if name in sys.modules and name != "__main__")


def _output_registry() -> bytes | None:
    """transformers' output-capturing registry as this process has it, in order (the builder
    replays it: the saved guards index it by position)."""
    registry = can_record_registry()
    return dumps_weightless(list(dict.items(registry))) if isinstance(registry, dict) else None


def saved_functions_supported() -> bool:
    """Whether this torch can save and load compiled functions (torch 2.13 and later)."""
    return hasattr(torch.compiler, "load_compiled_function")
