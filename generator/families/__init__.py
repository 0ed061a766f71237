"""Kernel families; importing this package registers each one."""
from . import csr  # noqa
from . import nm24  # noqa
from . import bsr  # noqa
from . import shflbw  # noqa
