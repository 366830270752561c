"""auto never falls back silently: with no repeated blocks it compiles the whole model, and says
so in the plan and in a WARNING on the ``torchkiln`` logger."""

import logging

from torch import nn

import torchkiln

logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")

mlp = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.LayerNorm(32))  # nothing repeats
plan = torchkiln.plan(mlp, backend="eager")
# WARNING torchkiln: auto: no repeated blocks found (...); compiling the whole model as one region
assert plan.selector == "whole" and plan.requested == "auto"
print(plan.reason)
