"""Stand-in for ``habana_frameworks.torch.core``: importing it registers ``hpu_backend``.

The real backend hands AOTAutograd's forward and backward graphs to Gaudi's graph compiler;
this one runs them eagerly and counts.
"""

import torch._dynamo
from functorch.compile import make_boxed_func
from torch._dynamo.backends.common import aot_autograd

CALLS = {"graphs": 0, "options": []}


def _compile_graph(graph, example_inputs):
    CALLS["graphs"] += 1
    return make_boxed_func(graph.forward)


_aot = aot_autograd(fw_compiler=_compile_graph)


def hpu_backend(graph, example_inputs, *, options=None, **ignored):
    CALLS["options"].append(options)
    return _aot(graph, example_inputs)


if "hpu_backend" not in torch._dynamo.list_backends(exclude_tags=()):
    torch._dynamo.register_backend(compiler_fn=hpu_backend, name="hpu_backend")
