"""Built-in plugin: selectors (being written)."""
