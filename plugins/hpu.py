"""Built-in plugin: hpu (being written)."""
