"""sparseforge: sparse-kernel generator and autotuner for NVIDIA GPUs.

Installed, `sparseforge.generator`, `sparseforge.tuner` and
`sparseforge.templates` are ordinary subpackages.  In a source checkout the
same names resolve to the top-level folders generator/, tuner/ and
templates/ (the layout the design names), so tests run without installing.
"""
from pathlib import Path as _Path

__version__ = "0.1.0"
# Bumped whenever generated sources change meaning; part of every binary key.
GENERATOR_VERSION = "0.1.0"

_checkout = _Path(__file__).resolve().parent.parent
if (_checkout / "generator" / "__init__.py").exists() and (_checkout / "CMakeLists.txt").exists():
    __path__.append(str(_checkout))  # noqa: F821 - package __path__
