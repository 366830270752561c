"""Tiered compilation: the first calls served regionally, then the whole model compiled in
another process and switched to in place between two calls (docs/tiered.md)."""
