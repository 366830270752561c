"""Stand-in for ``torch_xla.core.dynamo_bridge``.

torch's ``openxla``/``openxla_eval`` backends call ``extract_compiled_graph(graph, args)`` on
the first run of each graph. The real one lowers it to XLA HLO for the device; this one runs it
eagerly and counts.
"""

CALLS = {"graphs": 0, "runs": 0}


def extract_compiled_graph(model, args):
    CALLS["graphs"] += 1

    def run(*inputs):
        CALLS["runs"] += 1
        return model(*inputs)

    return run
