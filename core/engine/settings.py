"""Process-wide settings held by compiled models, restored per model whatever the order.

A compiled model may need a process-wide setting for as long as it lives (inductor's cache
directory variable, a Dynamo flag FSDP2 wants). Several models can hold the same setting at
once, and users decompile them in any order. Saving "the value before me" per model restores
the wrong value when models are released out of order (compile A with X, B with Y; release A,
then B: the variable ends as X). Instead every setting keeps one stack of holds:

- the value in force is the most recent live hold's;
- releasing a hold re-applies the most recent remaining hold's value;
- releasing the last hold puts back the value from before the first hold.

If someone else changed the setting since torchkiln last wrote it, theirs wins: a release never
overwrites a value torchkiln did not write.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

_UNSET = "<unset>"


@attrs.define(eq=False)
class _Stack:
    read: Callable[[], Any]
    write: Callable[[Any], None]
    original: Any
    holds: list[Hold] = attrs.Factory(list)
    written: Any = _UNSET


_STACKS: dict[str, _Stack] = {}


@attrs.define(eq=False)
class Hold:
    """One model's claim on a process-wide setting. :meth:`release` is idempotent."""

    key: str
    value: Any
    released: bool = False

    def release(self) -> None:
        if self.released:
            return
        self.released = True
        stack = _STACKS.get(self.key)
        if stack is None or self not in stack.holds:
            return
        stack.holds.remove(self)
        ours = stack.read() == stack.written
        if not stack.holds:
            del _STACKS[self.key]
            if ours:
                stack.write(stack.original)
            return
        if ours:
            _apply(stack, stack.holds[-1].value)

    def __call__(self) -> None:
        """Undo actions are plain callables: a hold is one."""
        self.release()

    def __deepcopy__(self, memo: dict[int, Any]) -> Hold:
        # A deep copy of a compiled model holds the setting in its own right: releasing the
        # copy's hold must not release the original's.
        if self.released or self.key not in _STACKS:
            return Hold(self.key, self.value, released=True)
        copied = Hold(self.key, self.value)
        _STACKS[self.key].holds.insert(_STACKS[self.key].holds.index(self), copied)
        return copied


def _apply(stack: _Stack, value: Any) -> None:
    stack.write(value)
    stack.written = stack.read()


def hold_setting(
    key: str, value: Any, read: Callable[[], Any], write: Callable[[Any], None]
) -> Hold:
    """Set the process-wide setting ``key`` to ``value`` until the returned hold is released.

    :param key: names the setting (``env:TORCHINDUCTOR_CACHE_DIR``, ``dynamo:capture_scalar_outputs``).
    :param read: returns the setting's current value.
    :param write: sets it (for the original value: whatever ``read`` returned before).
    """
    stack = _STACKS.get(key)
    if stack is None or (stack.read() != stack.written and not stack.holds):
        stack = _STACKS[key] = _Stack(read, write, read())
    elif stack.read() != stack.written:
        # Someone changed it while models held it: that is the value to restore at the end.
        stack.original = stack.read()
    new = Hold(key, value)
    stack.holds.append(new)
    _apply(stack, value)
    return new
