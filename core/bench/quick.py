"""``torchkiln bench --quick`` (README's main job): which cells it runs, and how long it times
them. Its own module, so that the settings (which build the quick grid) and the presets (which
build their runs from the settings) import it without importing each other."""

QUICK_DEPTHS = (4, 16)
"""Two depths: regional's first call stays flat while full compile's grows."""
QUICK_BATCHES = (1,)
QUICK_EVERY_DEPTH = ("full", "regional")
"""Strategies run at every quick depth: the contrast the story is about (full compile's first
call grows with depth, regional's stays flat)."""
QUICK_DEEPEST_ONLY = ("precompiled", "tiered")
"""Strategies run at the deepest quick depth only, where they differ most from full compile:
one cell each. ``precompiled`` is about 70 s on a quiet 2-core machine with its precompile run
(region groups and the whole model); ``tiered`` (issue 21) its first call plus the calls until
the builder's whole-model form serves (about two full compiles' time there, the builder
sharing two cores with the foreground). ``hierarchical`` and ``accelerate`` (about 30 s each)
are left to the default preset and ``--strategies``: with them the quick preset would not fit
its 6 minutes."""
QUICK_WARM = ("regional",)
"""The compiled strategies whose warm start (a second process reusing the cache directory)
is measured: regional's, the one the persistent-cache story is about. Each other warm run
costs a process (about 10 s)."""
QUICK_STEADY_DEEPEST_ONLY = True
"""Time the steady state at the deepest quick depth only, where a block boundary's cost
adds up most (one steady-state process instead of one per depth)."""
QUICK_STEADY_ITERS = 10
"""Timed rounds of the shared steady-state run (each round times every strategy once)."""
QUICK_WARMUP_ITERS = 2
