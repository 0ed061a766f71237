"""Root pytest configuration: tests marked `gpu` run only where a CUDA GPU
answers through libsparseforge, and otherwise skip with the reason."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

_gpu_state = None


def gpu_state():
    """(available, reason), asked once per session."""
    global _gpu_state
    if _gpu_state is None:
        try:
            from sparseforge import native
            _gpu_state = native.gpu_available()
        except Exception as e:  # library not built, or binding missing
            _gpu_state = (False, f"libsparseforge unavailable: {e}")
    return _gpu_state


def pytest_collection_modifyitems(config, items):
    gpu_items = [it for it in items if it.get_closest_marker("gpu")]
    if not gpu_items:
        return
    ok, reason = gpu_state()
    if ok:
        return
    skip = pytest.mark.skip(reason=f"no GPU: {reason}")
    for it in gpu_items:
        it.add_marker(skip)
