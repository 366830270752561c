"""Stand-in for Torch-TensorRT (tests only): importing it registers ``tensorrt`` and its alias
``torch_tensorrt``.

The real backend builds TensorRT engines from forward graphs and, like this one, reads its
settings from ``options``; this one runs the graph eagerly and records the options.
"""

import torch._dynamo

__version__ = "0.0.0+standin"
CALLS = {"graphs": 0, "options": []}


def tensorrt_backend(graph, sample_inputs, *, options=None, **ignored):
    CALLS["graphs"] += 1
    CALLS["options"].append(dict(options or {}))
    return graph.forward


for _name in ("tensorrt", "torch_tensorrt"):
    if _name not in torch._dynamo.list_backends(exclude_tags=()):
        torch._dynamo.register_backend(compiler_fn=tensorrt_backend, name=_name)
