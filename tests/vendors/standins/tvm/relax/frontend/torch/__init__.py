"""Stand-in for ``tvm.relax.frontend.torch``: ``relax_dynamo(pipeline)`` returns a Dynamo
compiler that records the pipeline and runs the graph module eagerly (``gm.forward``)."""

import tvm


def relax_dynamo(pipeline=None):
    def _relax_backend(graph_module, example_inputs):
        tvm.CALLS["pipelines"].append(pipeline)

        def exec_tvm(*args):
            tvm.CALLS["runs"] += 1
            return graph_module.forward(*args)

        return exec_tvm

    return _relax_backend


__all__ = ["relax_dynamo"]
