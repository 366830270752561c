"""Built-in plugin: ddp (being written)."""
