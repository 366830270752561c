"""Built-in plugin: hierarchical (being written)."""
