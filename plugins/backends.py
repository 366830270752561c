"""Built-in plugin: backends (being written)."""
