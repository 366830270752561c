"""Built-in plugin: deepspeed (being written)."""
