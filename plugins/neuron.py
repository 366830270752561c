"""Built-in plugin: neuron (being written)."""
