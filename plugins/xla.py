"""Built-in plugin: xla (being written)."""
