"""The tiered runtime: the root module's ``forward`` while a model is compiled with tiers.

Calls run regionally (each block runs its group's code) until a whole-model form is there: the
builder's (:mod:`~torchkiln.tiered.build`), or one found at compile time; the model then switches
to it in place, at the start of a root call, never inside one. docs/tiered.md, "The root's
call", lists a call's steps; :meth:`TieredForward.__call__` numbers them.
"""

from __future__ import annotations

import functools
import logging
import sys
import time
import weakref
from pathlib import Path
from typing import Any

from torch import nn

from torchkiln.artifacts.directory import ArtifactError, environment_key, read_meta
from torchkiln.artifacts.whole_build import contiguous_state
from torchkiln.artifacts.whole_load import load_whole
from torchkiln.configuration.config import CompileConfig
from torchkiln.engine.compile_state import MISSING
from torchkiln.engine.miss_log import MissLog
from torchkiln.engine.saved_code import SavedCode
from torchkiln.engine.states import State
from torchkiln.tiered.build import BuildFailed, WholeBuild
from torchkiln.tiered.calls import CallLog, call_spec, covered, describe_families, family_shapes
from torchkiln.tiered.tier_report import REGIONAL, WHOLE, TierReport

logger = logging.getLogger("torchkiln")


class TieredForward:
    """The root's instance ``forward``: dispatches each call to a tier, drives the build.

    ``state``, the whole-model form's (:class:`~torchkiln.engine.states.State`): ``pending``
    (observing the first calls, then building; regional meanwhile), ``serving`` (from
    :attr:`source`: the builder, or the directory a form was found in at compile time, an
    artifact directory's or the store's), ``failed`` (none will come: regional for good,
    :attr:`reason` says why)."""

    def __init__(self, model: nn.Module, config: CompileConfig, region_paths: list[str]):
        self._model = weakref.ref(model)
        self.config = config
        self.region_paths = region_paths
        self.log = CallLog()
        self.build = WholeBuild(config, region_paths, functools.partial(say, config))
        self.form: SavedCode | None = None
        self.state = State.PENDING
        self.source: str | None = None
        """Where the serving form came from: ``the builder``, or a directory."""
        self.reason: str | None = "no call yet: the builder starts at the first call"
        self.calls = {REGIONAL: 0, WHOLE: 0}
        self.missed = MissLog()
        """The calls the whole-model form did not fit, by the first guard each entry failed."""
        self.first_call_at: float | None = None
        self.switched_at_call: int | None = None
        self.seconds_to_switch: float | None = None
        self.loaded_from: str | None = None
        self._depth = 0
        self.frozen = False
        """Serving mode (``torchkiln.freeze``): no build is started or taken any more."""
        # Stops the builder at exit or when the runtime is collected, whichever comes first; it
        # holds the build, never the runtime (an atexit entry would keep it alive for good).
        self._stop = weakref.finalize(self, self.build.stop)

    # -- copies and pickles ---------------------------------------------------------------------

    previous_forward: Any = MISSING
    """The root's instance ``forward`` before tiers were installed (``MISSING``: none)."""

    def installed_pairs(self) -> list[tuple[nn.Module, Any]]:
        """``(root, previous forward)``: a pickled model loads as the plain model."""
        model = self._model()
        return [(model, self.previous_forward)] if model is not None else []

    def __reduce_ex__(self, protocol: Any) -> Any:
        # The root's own state is set after its values are unpickled, so the undo that puts
        # regions' forwards back cannot remove this entry: it loads as the root's previous
        # forward, or as the class's forward bound to the root (what a call runs anyway).
        if self.previous_forward is not MISSING:
            return (_identity, (self.previous_forward,))
        return (_class_forward, (self._model(),))

    def __deepcopy__(self, memo: dict[int, Any]) -> TieredForward:
        """A copied model gets its own runtime: the loaded form is shared (read-only), the
        builder is not (a copy made while building stays regional)."""
        model = self._model()
        copied_model = memo.get(id(model)) if model is not None else None
        target = copied_model if copied_model is not None else model
        assert target is not None, "a copied runtime needs the model it belongs to"
        copied = TieredForward(target, self.config, self.region_paths)
        copied.previous_forward = self.previous_forward
        if self.form is not None and copied_model is not None:
            copied.form = self.form
            copied.state, copied.source = self.state, self.source
            copied.reason = None
            copied.log.closed = True
        else:
            copied.state, copied.reason = State.FAILED, "copied while observing or building"
        return copied

    # -- per call: docs/tiered.md, "The root's call" ---------------------------------------------

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        model = self._model()
        assert model is not None
        if self._depth:  # 1. a call from inside a call: no tier change here
            return type(model).forward(model, *args, **kwargs)
        if self.first_call_at is None:
            self.first_call_at = time.perf_counter()
        if not self.frozen:  # serving mode: the forms already here serve, nothing is built
            self._drive_build(model, args, kwargs)  # 2-5
        form = self.form
        if form is not None:  # 6. the whole-model form serves the calls it fits
            f_locals = {"module": model, "args": args, "kwargs": kwargs}
            fn = form.find(f_locals)
            if fn is None and contiguous_state((args, kwargs)):
                fn = form.find(f_locals)  # a cache in another layout
            if fn is not None:
                self.calls[WHOLE] += 1
                return fn(model, *args, **kwargs)
            self._missed(form, f_locals)
        self.calls[REGIONAL] += 1  # 7. regionally: each block runs its group's code
        self._depth += 1
        try:
            return type(model).forward(model, *args, **kwargs)
        finally:
            self._depth -= 1

    def _drive_build(self, model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if self.build.pending:  # 2. a build that finished is taken now, between two calls
            self._take_build(model)
        self.build.pace()  # 3. the builder runs or pauses for this step
        if not self.log.closed and self.state is not State.FAILED:
            self._observe(model, args, kwargs)  # 4. the first calls ask for the build
        elif self.build.builds == 1 and self.build.job is None and self.state is not State.FAILED:
            self._watch(model, args, kwargs)  # 5. a call the build does not cover

    def _missed(self, form: SavedCode, f_locals: dict[str, Any]) -> None:
        reason = None
        if self.missed.wants_reason():
            reason = f"a call did not fit: {form.why_not(f_locals)}"
        if self.missed.total == 0:
            self.reason = reason
        self.missed.add(reason)

    @property
    def misses(self) -> int:
        return self.missed.total

    # -- observing and building -----------------------------------------------------------------

    def _observe(self, model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        try:
            self.log.add(call_spec(model, args, kwargs), args, kwargs)
        except Exception as error:  # an input we cannot describe: stay regional, say why
            self.log.closed = True
            if self.build.builds == 0:
                self._stop_with(f"the call's inputs cannot be sent to a builder: {error}")
            return
        if self.build.builds == 0:  # the first call: build for it, beside the regional compile
            self._ask(model)
            self.log.closed = self.log.ready()  # a log of one call (a limit of 1)
            return
        if not self.log.ready():
            return
        self.log.closed = True
        if family_shapes(self.log.families()) != family_shapes(self.build.built_for):
            self._ask(
                model,
                f"calls 1-{len(self.log.specs)} showed "
                f"{describe_families(self.log.families())}; the first builder had call 1 only",
            )

    def _watch(self, model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """After the log closed, until the one rebuild: a call the build does not cover (other
        sizes, another kind of call) restarts the builder for everything seen; the form already
        loaded, if any, serves the calls it fits meanwhile (docs/tiered.md, "Sizes that vary")."""
        try:
            spec = call_spec(model, args, kwargs)
        except Exception:  # it runs regionally, as every call it cannot describe
            return
        built_for = self.build.built_for
        if covered(spec, built_for, every_size_dynamic=self.config.dynamic is True):
            return
        self.log.add(spec, args, kwargs)
        call = sum(self.calls.values()) + 1
        self._ask(
            model,
            f"call {call} showed {describe_families(self.log.families())}; the builder had "
            f"{describe_families(built_for)}",
        )

    def _ask(self, model: nn.Module, rebuild_reason: str | None = None) -> None:
        """Start a build of what the log saw (with ``rebuild_reason``: the restart): still
        ``pending`` while no form serves (``reason``: what it waits for), or ``failed`` when no
        build can start here."""
        call, form_loaded = sum(self.calls.values()) + 1, self.form is not None
        try:
            waiting_for = self.build.start(model, self.log, call, form_loaded, rebuild_reason)
        except BuildFailed as failure:
            self._stop_with(str(failure))
            return
        if waiting_for is not None and self.form is None:
            self.state, self.reason = State.PENDING, waiting_for

    def _take_build(self, model: nn.Module) -> None:
        try:
            directory = self.build.poll()
        except BuildFailed as failure:
            if self.form is None:
                self._stop_with(str(failure))
            else:  # the first build's form still serves the calls it fits
                self.reason = f"the rebuild did not finish, {failure}"
                self._say(self.reason, logging.WARNING)
            return
        if directory is None:
            return
        try:
            self.switch(model, directory)
        except Exception as error:  # a form that cannot load must never fail the user's call
            self._stop_with(
                f"the built whole-model form could not be loaded: {type(error).__name__}: {error}"
            )

    def _stop_with(self, reason: str) -> None:
        self.state = State.FAILED
        self.reason = reason
        self._say(f"staying regional: {reason}", logging.WARNING)

    def _say(self, message: str, level: int = logging.INFO) -> None:
        say(self.config, message, level)

    # -- switching ------------------------------------------------------------------------------

    def switch(self, model: nn.Module, directory: Path, *, loaded: bool = False) -> None:
        """Load ``directory``'s whole-model entry and serve from it from now on.

        :raises ArtifactError: no whole-model entry, or one that does not fit.
        """
        meta = read_meta(directory)
        if meta.get("environment") != environment_key(self.config, model):
            raise ArtifactError("the directory was built for another environment")
        self.form = load_whole(directory, meta, model)
        self.build.keep_output = True
        self.state, self.source = State.SERVING, str(directory) if loaded else "the builder"
        self.reason = None
        if loaded:  # from an artifact directory or the store before any call: nothing to build
            self.log.closed = True
            self.loaded_from = str(directory)
        if self.switched_at_call is None:  # the first switch (a rebuild's form replaces it)
            self.switched_at_call = sum(self.calls.values()) + 1
            if self.first_call_at is not None:
                self.seconds_to_switch = time.perf_counter() - self.first_call_at
        result = self.build.result
        built = f" (built in {result['seconds']:.1f} s)" if result else ""
        self._say(
            f"serving the whole-model form from call {self.switched_at_call}{built}, loaded in "
            f"{self.form.load_seconds:.2f} s"
        )
        if self.build.builder is not None:
            self.build.builder.stop()

    def freeze(self) -> None:
        """Serving mode: stop the builder (no compile runs beside the calls); the form loaded,
        if any, keeps serving the calls it fits."""
        self.frozen = True
        self.log.closed = True
        self.stop()
        if self.form is None and self.state is not State.FAILED:
            self.state, self.reason = State.FAILED, "frozen before a whole-model form was there"

    def stop(self) -> None:
        """Stop the builder and remove a directory torchkiln made for it (decompile, exit)."""
        self.build.keep_output = self.form is not None
        self._stop()

    def report(self) -> TierReport:
        build, governor = self.build, self.build.governor
        return TierReport(
            serving=WHOLE if self.form is not None else REGIONAL,
            state=self.state,
            source=self.source,
            calls=dict(self.calls),
            reason=self.reason,
            switched_at_call=self.switched_at_call,
            seconds_to_switch=self.seconds_to_switch,
            build_seconds=build.result.get("seconds"),
            builder_peak_rss_mb=build.result.get("peak_rss_mb"),
            load_seconds=self.form.load_seconds if self.form is not None else None,
            loaded_from=self.loaded_from,
            dropped_guards=dict(build.result.get("dropped_guards", {})),
            misses=self.misses,
            miss_lines=tuple(self.missed.lines(indent="    ")),
            builds=build.builds,
            rebuild_reason=build.rebuild_reason,
            builder_processes=build.processes,
            builder_slowdown=governor.slowdown,
            builder_period=governor.period,
            builder_lowered_from=governor.lowered_from,
            builder_lowered=governor.lowered,
            measured_steps={"running": len(governor.running), "paused": len(governor.paused)},
            slowdown_bound=self.config.tiered.max_slowdown,
            job_rank=build.job.exchange.rank if build.job is not None else None,
        )


def say(config: CompileConfig, message: str, level: int = logging.INFO) -> None:
    """Progress of the build: each change of state, logged, and shown on standard error as the
    per-region progress is (``progress``: ``on``, or ``auto`` on a terminal)."""
    logger.log(level, "torchkiln: tiered: %s", message)
    shown = config.progress == "on" or (config.progress == "auto" and sys.stderr.isatty())
    if shown:
        print(f"torchkiln: tiered: {message}", file=sys.stderr, flush=True)


def _identity(value: Any) -> Any:
    return value


def _class_forward(model: nn.Module) -> Any:
    return type(model).forward.__get__(model)
