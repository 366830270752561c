"""Built-in plugin: tvm (being written)."""
