"""Built-in plugin: tensorrt (being written)."""
