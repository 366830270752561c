"""Stand-in for Apache TVM (tests only): the calls torch's ``tvm`` backend makes, through Relay
(torch up to 2.14) or Relax (torch 2.15 on).

Relay: ``relay.frontend.from_pytorch`` keeps the TorchScript module it is given, ``relay.build``
records its options, and ``graph_executor.GraphModule`` runs the TorchScript module eagerly.
Relax: ``relax.frontend.torch.relax_dynamo(pipeline)`` records the pipeline and runs the graph
module eagerly; ``tvm.relax`` is imported only when asked for.
"""

from tvm import contrib, nd, relay, target, transform

__version__ = "0.0.0+standin"
CALLS = {"builds": 0, "runs": 0, "opt_levels": [], "pipelines": []}


class Device:
    def __init__(self, kind, index=0):
        self.kind, self.index = kind, index


def cpu(index=0):
    return Device("cpu", index)


def cuda(index=0):
    return Device("cuda", index)


__all__ = ["contrib", "cpu", "cuda", "nd", "relay", "target", "transform"]
