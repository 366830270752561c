"""Stand-in for ``torch_neuronx.neuron_dynamo_backend.backend``: the entry point's target.

The real backend lowers AOTAutograd's graphs through StableHLO to NEFFs; this one runs them
eagerly and counts.
"""

from functorch.compile import make_boxed_func
from torch._dynamo.backends.common import aot_autograd

CALLS = {"graphs": 0, "options": [], "modes": []}


def _compile_graph(graph, example_inputs):
    CALLS["graphs"] += 1
    return make_boxed_func(graph.forward)


_aot = aot_autograd(fw_compiler=_compile_graph)


def neuron_backend(graph, example_inputs, *, options=None, mode=None):
    CALLS["options"].append(options)
    CALLS["modes"].append(mode)
    return _aot(graph, example_inputs)
