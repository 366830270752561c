"""Write-back: a region call that no entry of the store fits is compiled into a new entry.

The entry is compiled the savable way (``aot_compile``), as a group's first call is, so that
a restart serves the call too (evaluation after training, the last short batch, a decode step).
Its directory is named by the call's key; but a key sees only what the call's arguments show
(shapes, dtypes, the call's kind), and a saved function's guards may read more (an int
attribute of a cache object a decode step passes in, say). So when the key's entry exists and
its guards fail for the call, the new entry goes beside it under a sibling key: keys name
directories, the saved guards decide reuse, and a restart loads every entry of the group.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
from collections.abc import Callable, Iterator
from typing import Any

import attrs
from torch import nn

from torchkiln._internals.aot_artifacts import loaded_guard_table
from torchkiln._internals.dynamo import floats_specialized
from torchkiln.artifacts.directory import error_reason
from torchkiln.configuration.config import CompileConfig
from torchkiln.jobs.entry import build_entry, load_entry
from torchkiln.jobs.keys import call_fields, share_key
from torchkiln.jobs.store import JobStore

logger = logging.getLogger("torchkiln")

ENTRIES_PER_KEY = 4
"""At most this many entries under one key and its siblings: a call whose guards keep failing
past them is served by the backend's code, not written again by every run."""


@attrs.frozen
class MissedCall:
    """What :func:`write_missed_call` needs of a group to compile a call its entries do not
    fit (the first call's inputs as their spec: no tensor of that call is kept)."""

    group: str
    shared: Callable[..., Any]
    build_savable: Callable[..., Any]
    first_inputs: Any
    group_fields: dict[str, Any]
    """The key's group fields, from the module of the group's first call: a restart loads the
    entries whose group fields equal its first call's, so an entry written for another block
    (whose own attributes differ: ``layer_idx``) carries these, not that block's."""


def sibling_keys(key: str) -> Iterator[str]:
    """``key``, then the names of the entries written beside it (64 hexadecimal digits, as
    every store key)."""
    yield key
    for index in range(1, ENTRIES_PER_KEY):
        yield hashlib.sha256(f"{key}/{index}".encode()).hexdigest()


def write_missed_call(
    store: JobStore,
    config: CompileConfig,
    call: MissedCall,
    module: nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> tuple[list[tuple[str, Any]], bool] | None:
    """A call the group's loaded functions do not fit, compiled on this rank (as without a
    store) into a new entry of ``store``, so that a restart serves it too: the functions of the
    entry that fits it and whether this call compiled it (``False``: another process wrote it
    since the group loaded the store), or ``None`` when none could be compiled, saved or made to
    fit (the backend's code then serves it). No collective: only this rank may have missed. A call whose
    input shapes differ from the first call's, or whose key's entry it does not fit, is
    compiled with symbolic sizes when ``dynamic`` is unset (torch's automatic dynamic shapes
    recompile it so too), so that one entry covers the calls that follow."""
    fields = {**call.group_fields, **call_fields(module, args, kwargs)}
    try:
        for index, key in enumerate(sibling_keys(share_key(fields))):
            directory = store.find(key)
            built = directory is None
            if directory is None:
                # Symbolic where the call differs from what an entry was compiled for: its
                # input shapes, or (an entry of its key not fitting it) a value its key
                # cannot see.
                dynamic = config.dynamic
                if dynamic is None and (index > 0 or fields["inputs"] != call.first_inputs):
                    dynamic = True
                staging = store.staging(key)
                savable = call.build_savable(dynamic)
                with floats_specialized() if dynamic else contextlib.nullcontext():
                    build_entry(staging, fields, savable, call.shared, module, args, kwargs)
                directory = store.publish(staging, key)
            functions, closure = load_entry(directory, call.shared, config.cache_dir)
            table = loaded_guard_table(fn for _, fn in functions)
            if (
                table.find({**closure, "module": module, "args": args, "kwargs": kwargs})
                is not None
            ):
                return functions, built
            if built:  # compiled for this very call and still not fitting it: stop here
                raise RuntimeError(f"the entry compiled for the call does not fit it ({key})")
        raise RuntimeError(f"{ENTRIES_PER_KEY} entries of its key exist and none fits it")
    except Exception as error:  # the backend compiles the call as usual
        logger.info(
            "torchkiln: group %r: a call its entries do not fit was not written to the store: %s",
            call.group,
            error_reason(error),
        )
        return None
