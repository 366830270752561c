"""Stand-in for torch-neuronx (TorchNeuron), tests only.

Importing it registers nothing: like the real package, its ``neuron`` backend reaches torch
through the ``torch_dynamo_backends`` entry point in the neighbouring ``.dist-info`` folder.
"""

__version__ = "0.0.0+standin"
