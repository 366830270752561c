"""What Dynamo decided to do with a code object: compile it, or skip it for good.

torch 2.14 and later mark a frame "skip" for good (``WON'T CONVERT``, "an error was suppressed
during compilation") when an exception the traced code raises unwinds through a ``try`` or
``with`` block of the frame Dynamo started at, even when the exception is the user's own (a
wrong-shaped input). A region group's function has such a block (the traceable-int setting), so
one bad call would leave every region of the group eager for good. torch 2.13 does not mark it.
"""

from __future__ import annotations

import types


def resume_compiling(code: types.CodeType) -> None:
    """Let Dynamo compile ``code`` again at its next call, keeping its compiled entries.

    Writes the code's frame-execution strategy back to ``DEFAULT``/``DEFAULT`` with
    ``torch._C._dynamo.eval_frame.set_code_exec_strategy`` (``torch._dynamo.eval_frame.skip_code``
    wrote ``SKIP`` there). torch has no public API to undo a skip: ``torch.compiler.reset()``
    drops every compiled entry of the process. Verified: torch 2.11, 2.13, 2.14, 2.15.
    """
    from torch._dynamo.eval_frame import (  # re-exported there from torch._C._dynamo
        FrameAction,
        FrameExecStrategy,
        set_code_exec_strategy,
    )

    set_code_exec_strategy(code, FrameExecStrategy(FrameAction.DEFAULT, FrameAction.DEFAULT))
