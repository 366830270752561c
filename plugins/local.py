"""Built-in plugin: local (being written)."""
