"""Built-in plugin: fsdp2 (being written)."""
