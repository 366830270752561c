"""Built-in plugin: accelerate_config (being written)."""
