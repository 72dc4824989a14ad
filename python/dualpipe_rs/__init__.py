"""dualpipe_rs: DualPipe pipeline schedules, their simulator, and a drop-in EPLB, in Rust.

>>> import dualpipe_rs
>>> s = dualpipe_rs.schedule("dualpipe", ranks=4, micro_batches=8)
>>> from dualpipe_rs.eplb import rebalance_experts
"""

from . import _native, eplb
from ._native import Schedule, schedule

__version__ = _native.__version__

__all__ = ["Schedule", "eplb", "schedule", "__version__"]
