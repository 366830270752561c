"""Compiling once per job: at a region group's first call, the ranks agree on keys, one rank per
distinct key compiles (or reads the store), the others receive and load what it compiled.

Per group, on every rank, in the same order (the ranks of a data-parallel job make the same
first calls): each rank computes its key (:mod:`torchkiln.jobs.keys`) and looks in its store;
one gather exchanges the keys; per distinct key, the lowest rank whose store has it, else the
lowest rank with that key, is the source and compiles it; one broadcast per key that some rank
lacks carries the entry; every rank, the source included, loads the entry and serves the group
from it. Whenever sharing cannot serve a rank (its key differs, what it received does not
load, the source's compile failed, a call the entry does not fit), that rank compiles the group
normally and :attr:`GroupShare.reason` says why. docs/jobs.md ("What is shared, and how",
"Failures, and what you see") gives the steps and failures in full.
"""

from __future__ import annotations

import functools
import logging
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs

from torchkiln._internals.aot_artifacts import loaded_guard_table
from torchkiln.artifacts.directory import (
    ArtifactError,
    closure_data,
    error_reason,
    input_spec,
    read_meta,
)
from torchkiln.configuration.config import CompileConfig
from torchkiln.engine.compile_state import region_state_of
from torchkiln.engine.dynamo_records import HeldRecords, all_records
from torchkiln.engine.group_runtime import CodeSource, GroupCall, GroupCode
from torchkiln.engine.saved_code import SavedCode
from torchkiln.engine.states import State, describe
from torchkiln.jobs.entry import (
    build_entry,
    compile_function,
    install_caches,
    load_entry,
    pack_entry,
    unpack_entry,
)
from torchkiln.jobs.exchange import JobExchange
from torchkiln.jobs.keys import (
    CALL_FIELDS,
    call_kind,
    describe_difference,
    group_fields,
    share_fields,
    share_key,
)
from torchkiln.jobs.store import JobStore
from torchkiln.jobs.traced_graph import TracedGraph, first_difference, trace_group
from torchkiln.jobs.written_entries import MissedCall, write_missed_call
from torchkiln.plugin_host.region_plan import RegionGroup

logger = logging.getLogger("torchkiln")


WAYS = {
    "function": "shared as a saved function",
    "caches": "shared through torch's caches",
}
"""The ways a group is shared, as the report's ``job:`` line says them (docs/jobs.md)."""


@attrs.define
class GroupShare:
    """What happened to one group's first call on this rank."""

    group: str
    role: str = "local"
    """This rank's part in the exchange: ``compiled``, it compiled the entry (and sent it where
    others needed it); ``received``, another rank compiled it and sent it; ``store``, read from
    ``job.store``; ``local``, compiled normally on this rank (:attr:`reason` says why). The
    report says the group's :attr:`state` instead, in the one vocabulary."""
    via: str = "function"
    """How the group was shared (:data:`WAYS`): ``function``, every rank loads the entry's saved
    function; ``caches``, the entry's kernels fill this rank's torch caches (the AOTAutograd
    entry, forward and backward, and the compiled kernels) and the rank compiles the group by
    tracing it and hitting them (the compiling rank runs what it compiled)."""
    source: int | None = None
    """The rank whose entry this rank loaded (itself for ``compiled`` and ``store``)."""
    reason: str | None = None
    """Why ``local``, or why this rank's key differs from rank 0's."""
    key: str = ""
    compile_seconds: float = 0.0
    """Spent compiling the entry on this rank (0 unless ``compiled``)."""
    recorded_compile_seconds: float = 0.0
    """The part of :attr:`compile_seconds` that Dynamo's own frame records hold (its metrics
    for ``aot_compile`` carry no frame time on some torch releases): the report adds only the
    rest, so nothing is counted twice."""
    region: str = ""
    """The region whose call was the group's first: it compiled or loaded the entry."""
    wait_seconds: float = 0.0
    """Spent in the gather and the broadcasts (waiting for the source, transfer included)."""
    load_seconds: float = 0.0
    bytes: int = 0
    """Size of the entry as sent (0 when nothing was sent)."""
    transfer_seconds: float = 0.0
    """The entry's bytes on the wire, once the source had them (part of ``wait_seconds``)."""
    trace_seconds: float = 0.0
    """Tracing the group for the rank-invariance check (a job of several ranks only)."""
    untraced: str | None = None
    """Why the rank-invariance check could not trace the group on this rank (the line says
    so: what every rank failed to trace alike was not compared)."""
    receivers: tuple[int, ...] = ()
    """The ranks this rank sent the entry to."""
    stored: bool = False
    """Whether the entry is (now) in ``job.store``."""
    fitted_calls: int = 0
    """Calls the loaded entry served."""
    other_calls: int = 0
    """Calls the entry did not fit (another shape, the other kind): compiled on this rank."""
    written: int = 0
    """Of :attr:`other_calls`, those compiled into a new entry of ``job.store``
    (:func:`~torchkiln.jobs.written_entries.write_missed_call`)."""

    @property
    def state(self) -> State:
        """:class:`~torchkiln.engine.states.State`: ``pending`` before the group's first call,
        ``serving`` what another rank or the store had, ``compiled`` here (for the job or not)."""
        if not self.key:
            return State.PENDING
        return State.SERVING if self.role in ("received", "store") else State.COMPILED

    @property
    def source_name(self) -> str | None:
        """``rank 0`` or ``store`` for a group served from there; else ``None``."""
        if self.role == "store":
            return "store"
        return f"rank {self.source}" if self.role == "received" else None

    def line(self) -> str:
        if not self.key:  # its first call has not come (a whole-model form served every call)
            return f"{self.group}: {State.PENDING} (not called yet)"
        sent = f", sent to rank(s) {', '.join(map(str, self.receivers))}" if self.receivers else ""
        wire = (
            f", {self.bytes / 2**20:.1f} MB in {self.transfer_seconds:.3f} s"
            if self.role == "received"
            else ""
        )
        trace = f"trace {self.trace_seconds:.1f} s, " if self.trace_seconds else ""
        times = (
            f" ({trace}compile {self.compile_seconds:.1f} s, wait {self.wait_seconds:.1f} s, "
            f"load {self.load_seconds:.2f} s{wire})"
        )
        why = f": {self.reason}" if self.reason else ""
        other = (
            f"; {self.other_calls} of {self.fitted_calls + self.other_calls} calls did not fit "
            "it and were compiled here"
            if self.other_calls and self.role != "local"
            else ""
        )
        if other and self.written:
            other += f" ({self.written} into new entries of the store)"
        if self.untraced is not None:
            other += f"; the rank-invariance check could not trace it ({self.untraced})"
        way = f", {WAYS[self.via]}" if self.role != "local" else ""
        said = describe(self.state, self.source_name)
        return f"{self.group}: {said}{sent}{way}{times}{why}{other}"


@attrs.define
class JobReport:
    """``torchkiln.report(model).job``: the job's sharing as this rank saw it."""

    rank: int
    world: int
    sharing: bool
    reason: str | None
    """Why the job does not share (``sharing`` false), else ``None``."""
    store: str | None
    groups: tuple[GroupShare, ...] = ()

    def lines(self) -> list[str]:
        if not self.sharing:
            return [f"job: rank {self.rank} of {self.world}, every rank compiles: {self.reason}"]
        store = f", store {self.store}" if self.store else ""
        head = f"job: rank {self.rank} of {self.world}, compiled once per job{store}"
        return [head, *(f"  {g.line()}" for g in self.groups)]


@attrs.frozen
class StoredEntry:
    """An entry of the store for one group, loaded: its saved guards decide which calls it fits."""

    directory: Path
    functions: list[tuple[str, Any]]
    closure: dict[str, Any]

    def fits(self, call: GroupCall) -> bool:
        f_locals = {**self.closure, "module": call.module, "args": call.args, "kwargs": call.kwargs}
        return loaded_guard_table(fn for _, fn in self.functions).find(f_locals) is not None


class JobShare(CodeSource):
    """Per compiled model: the exchange, the store, and one :class:`GroupShare` per group; a
    source of each group's code (its first call shares)."""

    name = "job"

    def __init__(self, config: CompileConfig, progress: bool, via: str = "function"):
        self.config = config
        self.via = via
        """How this model's groups are shared (:attr:`GroupShare.via`)."""
        self.exchange = JobExchange(config.job.timeout, progress)
        self.store = JobStore(config.job.store) if config.job.store else None
        self.groups: dict[str, GroupShare] = {}
        self.codes: dict[str, GroupCode] = {}
        self._stored: dict[str, list[StoredEntry]] = {}

    def stored_entries(self, call: GroupCall) -> list[StoredEntry]:
        """Every entry the store holds for the call's group (all its group fields equal: the
        same environment, class, sources and layout), loaded once, whatever call it was
        compiled for: keys name the entries' directories, the saved guards decide reuse."""
        name = call.group.name
        if name not in self._stored:  # through the caches, only an equal key serves a call
            loads = self.store is not None and self.via == "function"
            self._stored[name] = self._load_stored(call) if loads else []
        return self._stored[name]

    def _load_stored(self, call: GroupCall) -> list[StoredEntry]:
        assert self.store is not None
        fields = group_fields(self.config, call.group.name, call.module, call.shared)
        entries = []
        for path in self.store.published():
            try:
                saved = read_meta(path).get("fields", {})
                if {k: v for k, v in saved.items() if k not in CALL_FIELDS} != fields:
                    continue
                functions, closure = load_entry(path, call.shared, self.config.cache_dir)
            except Exception as error:  # a damaged entry: the others still serve
                logger.info("torchkiln: store entry %s not used: %s", path, error_reason(error))
                continue
            entries.append(StoredEntry(path, functions, closure))
        return entries

    def report(self) -> JobReport:
        for name, code in self.codes.items():
            record = self.groups[name]
            # A call served by an entry another process wrote since fits the store: not
            # compiled here.
            found = code.loaded.found if code.loaded is not None else 0
            record.fitted_calls, record.other_calls = code.hits + found, code.misses - found
            record.written = code.loaded.written if code.loaded is not None else 0
        return JobReport(
            self.exchange.rank,
            self.exchange.world,
            True,
            None,
            str(self.store.root) if self.store else None,
            tuple(self.groups.values()),
        )

    def attach(self, group: RegionGroup, shared: Callable[..., Any]) -> bool:
        self.groups.setdefault(group.name, GroupShare(group.name, via=self.via))
        return True

    def load(self, call: GroupCall) -> SavedCode | None:
        self.codes[call.group.name] = call.code
        region_state = region_state_of(call.module)
        if region_state is not None:
            self.groups[call.group.name].region = region_state.region.path
        return _GroupSharing(self, self.groups[call.group.name], call).share()


class _GroupSharing:
    """One group's first call on this rank: agree on keys, send or receive, load."""

    def __init__(self, job: JobShare, record: GroupShare, call: GroupCall):
        self.job = job
        self.record = record
        self.call = call
        self.compiled: Any = None
        """What this rank's ``aot_compile`` returned (when it built the entry)."""

    def share(self) -> SavedCode | None:
        job, record, call = self.job, self.record, self.call
        exchange, store = job.exchange, job.store
        fields = share_fields(
            job.config, record.group, call.module, call.shared, call.args, call.kwargs
        )
        key = share_key(fields)
        record.key = key
        started = time.perf_counter()
        stored = job.stored_entries(call)
        record.load_seconds += time.perf_counter() - started
        found = next((entry.directory for entry in stored if entry.fits(call)), None)
        if found is None and store is not None:
            found = store.find(key)
        message = {"key": key, "fields": fields, "stored": found is not None}
        graph = None
        if exchange.world > 1:  # what this rank traced, for the rank-invariance check
            started = time.perf_counter()
            graph = trace_group(call, job.config.dynamic)
            record.trace_seconds = time.perf_counter() - started
            record.untraced = graph.failure
            message["graph"], message["code"] = graph.digest, graph.packed()
        started = time.perf_counter()
        everyone = exchange.gather(message, f"group {record.group!r}'s first call")
        record.wait_seconds += time.perf_counter() - started
        me = exchange.rank
        if everyone[0]["key"] != key:
            record.reason = describe_difference(fields, everyone[0]["fields"])
        directory: Path | None = None
        differs_from: int | None = None
        for plan in _plans(everyone):
            if me in plan.traced_otherwise:
                differs_from = plan.source
            elif me == plan.source:
                directory = self._send(plan, fields, found)
            elif me in plan.receivers:
                directory = self._receive(plan)
            elif plan.receivers:  # another key's broadcast: every rank takes part
                exchange.broadcast_object(None, plan.source, _what(record.group, plan.source))
        if differs_from is not None:
            record.reason = _traced_otherwise(graph, everyone[differs_from], differs_from)
            return self._load(None)
        if found is not None and directory in (None, found):
            directory, record.role, record.source, record.stored = found, "store", me, True
        return self._load(directory)

    def _send(
        self,
        plan: _Plan,
        fields: dict[str, Any],
        found: Path | None,
    ) -> Path | None:
        """The source's part: read or build the entry, send it to the ranks that lack it.
        Returns the entry's directory (``None`` when the compile failed)."""
        record, exchange = self.record, self.job.exchange
        directory, failure = found, None
        if directory is None:
            directory, failure = self._build(fields)
        if plan.receivers:
            message = pack_entry(directory) if directory is not None else None
            started = time.perf_counter()
            exchange.broadcast_object(
                {"entry": message, "failure": failure},
                exchange.rank,
                _what(record.group, exchange.rank),
            )
            record.wait_seconds += time.perf_counter() - started
            record.bytes = len(message or b"")
            record.receivers = plan.receivers
        if failure is not None:
            record.reason = f"the compile for sharing failed: {failure}; compiled normally"
        return directory

    def _receive(self, plan: _Plan) -> Path | None:
        """A receiver's part: the entry from the source, kept (``None``: the source's compile
        failed)."""
        record, exchange = self.record, self.job.exchange
        started = time.perf_counter()
        received = exchange.broadcast_object(None, plan.source, _what(record.group, plan.source))
        record.wait_seconds += time.perf_counter() - started
        if received["entry"] is None:
            record.reason = (
                f"rank {plan.source} could not compile it for sharing: {received['failure']}"
            )
            return None
        record.bytes = len(received["entry"])
        record.transfer_seconds = exchange.transfer_seconds
        staging = self._staging(record.key)
        unpack_entry(received["entry"], staging)
        record.role, record.source = "received", plan.source
        return self._keep(staging)

    def _build(self, fields: dict[str, Any]) -> tuple[Path | None, str | None]:
        record, call = self.record, self.call
        staging = self._staging(record.key)
        recorded_before = HeldRecords.now()
        try:
            record.compile_seconds, self.compiled = build_entry(
                staging,
                fields,
                call.build_savable(),
                call.shared,
                call.module,
                call.args,
                call.kwargs,
                name_seed=record.key if self.job.via == "caches" else None,
            )
        except Exception as error:  # sent to the others; every rank then compiles normally
            return None, error_reason(error)
        record.recorded_compile_seconds = sum(r.seconds for r in all_records(recorded_before))
        record.role, record.source = "compiled", self.job.exchange.rank
        return self._keep(staging), None

    def _staging(self, key: str) -> Path:
        store = self.job.store
        if store is not None:
            return store.staging(key)
        return Path(tempfile.mkdtemp(prefix="torchkiln-job-"))

    def _keep(self, staging: Path) -> Path:
        """Publish ``staging`` to the store (when there is one)."""
        store = self.job.store
        if store is None:
            return staging
        self.record.stored = True
        return store.publish(staging, self.record.key)

    def _load(self, directory: Path | None) -> SavedCode | None:
        record, job = self.record, self.job
        if directory is None:
            record.role = "local"
            return None
        if job.via == "caches":
            return self._through_caches(directory)
        started = time.perf_counter()
        stored = job.stored_entries(self.call)
        try:
            match = next((entry for entry in stored if entry.directory == directory), None)
            if match is not None:
                functions, closure = match.functions, match.closure
            else:
                functions, closure = load_entry(directory, self.call.shared, job.config.cache_dir)
        except Exception as error:
            self._not_served(error, "could not be loaded here")
            return None
        finally:
            self._loaded(directory, started)
        others = [fn for entry in stored if entry.directory != directory for fn in entry.functions]
        return self._served([*functions, *others], closure)

    def _served(self, functions: list[tuple[str, Any]], closure: dict[str, Any]) -> SavedCode:
        """The group's code, from the store or the rank named in the record; with a store
        (and saved functions), a call it does not fit is written back (:func:`~torchkiln.jobs.written_entries.write_missed_call`)."""
        record, job, call = self.record, self.job, self.call
        write_back = None
        if job.store is not None and job.via == "function":
            missed = MissedCall(
                record.group,
                call.shared,
                call.build_savable,
                input_spec(call.args, dict(call.kwargs)),
                group_fields(job.config, record.group, call.module, call.shared),
            )
            write_back = functools.partial(write_missed_call, job.store, job.config, missed)
        return SavedCode(
            "store" if record.role == "store" else f"rank {record.source}",
            functions,
            closure,
            functools.partial(_other_call, record.group),
            compiled_here=record.role == "compiled",
            write_back=write_back,
        )

    def _not_served(self, error: Exception, what: str) -> None:
        """This rank compiles the group itself, saying why; an entry of the store that failed
        its checks is removed."""
        record, job = self.record, self.job
        record.reason = (
            f"what rank {record.source} compiled {what} ({error_reason(error)}); "
            "compiled on this rank"
        )
        record.role = "local"
        if isinstance(error, ArtifactError) and job.store is not None and record.stored:
            job.store.discard(record.key)

    def _loaded(self, directory: Path, started: float) -> None:
        """The load's time counted; without a store nothing needs the entry's directory any
        more (its kernels were copied, its function loaded)."""
        self.record.load_seconds += time.perf_counter() - started
        if self.job.store is None:
            shutil.rmtree(directory, ignore_errors=True)

    def _through_caches(self, directory: Path) -> SavedCode | None:
        """Sharing through torch's caches: the rank that compiled the entry serves the group
        from what its ``aot_compile`` returned (its guards are this process's own: nothing is
        loaded, nothing compiled twice); every other rank merges the entry's kernels (torch's
        AOTAutograd cache entry, forward and backward, and the compiled kernel libraries) into
        its inductor cache and compiles the group the same way, which traces it with Dynamo and
        hits that entry (the compiled function's name, in its key, is the same on every rank:
        :func:`~torchkiln._internals.compiled_names.stable_compiled_fn_name`). The entry's saved
        function is never loaded: for a model its caller shards after compiling (Accelerate's
        FSDP2), whose leaf groups' saved functions did not fit their calls (docs/jobs.md, "Two
        ways to share")."""
        record, job, call = self.record, self.job, self.call
        started = time.perf_counter()
        try:
            compiled = self.compiled
            if record.role != "compiled" or compiled is None:
                install_caches(directory, job.config.cache_dir)
                compiled = compile_function(
                    call.build_savable(), call.module, call.args, call.kwargs, record.key
                )
            closure = closure_data(call.shared)
            names = call.shared.__code__.co_freevars
            return self._served(
                [(call_kind(call.module), compiled)],
                {name: closure[f"closure:{name}"] for name in names},
            )
        except Exception as error:
            self._not_served(error, "could not be put in this rank's caches")
            return None
        finally:
            self._loaded(directory, started)


@attrs.frozen
class _Plan:
    source: int
    receivers: tuple[int, ...]
    traced_otherwise: tuple[int, ...] = ()


def _plans(everyone: list[dict[str, Any]]) -> list[_Plan]:
    """Per distinct key, in the order of the first rank that has it: the source, the ranks
    that need the entry sent (a rank whose store has it needs nothing), and the ranks whose
    traced graph differs from the source's (they compile their own: nothing is sent to them,
    and they use no stored entry)."""
    plans = []
    for key in dict.fromkeys(e["key"] for e in everyone):
        ranks = [r for r, e in enumerate(everyone) if e["key"] == key]
        stored = [r for r in ranks if everyone[r]["stored"]]
        source = stored[0] if stored else ranks[0]
        graph = everyone[source].get("graph")
        otherwise = tuple(r for r in ranks if everyone[r].get("graph") != graph)
        receivers = tuple(
            r for r in ranks if r != source and r not in otherwise and not everyone[r]["stored"]
        )
        plans.append(_Plan(source, receivers, otherwise))
    return plans


def _traced_otherwise(graph: TracedGraph | None, source: dict[str, Any], rank: int) -> str:
    """Why a rank whose key equals its source's compiles its own: the graphs differ."""
    assert graph is not None  # only ranks that traced are compared
    what = first_difference(graph, source["code"], rank)
    return (
        f"the graph this rank traced differs from rank {rank}'s ({what}): code compiled there "
        "may not be right here; compiled on this rank"
    )


def _other_call(group: str, reason: str | None) -> None:
    """A call the shared entry does not fit (it covers the first call's shapes and kind only):
    the rank compiles it as usual, logged (the report counts them)."""
    if reason is not None:
        logger.info("torchkiln: group %r's shared entry does not fit this call (%s)", group, reason)


def _what(group: str, source: int) -> str:
    return f"group {group!r}'s compiled entry (compiled or read by rank {source})"
