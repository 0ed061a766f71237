"""Code generators whose outputs are checked in (tests keep them current)."""
