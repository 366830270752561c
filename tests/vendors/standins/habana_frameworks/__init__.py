"""Stand-in for Intel Gaudi's habana_frameworks (tests only)."""
