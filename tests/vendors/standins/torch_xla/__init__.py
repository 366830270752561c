"""Stand-in for torch_xla (tests only): just what torch's openxla backends call."""

__version__ = "0.0.0+standin"
