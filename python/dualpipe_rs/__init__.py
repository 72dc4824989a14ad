"""dualpipe_rs: DualPipe pipeline schedules, their simulator, and a drop-in EPLB, in Rust.

>>> import dualpipe_rs
>>> s = dualpipe_rs.schedule("dualpipe", ranks=4, micro_batches=8)
>>> dualpipe_rs.simulate("dualpipe", ranks=4, micro_batches=8)["makespan"]
26.0
>>> from dualpipe_rs.eplb import rebalance_experts

Bad arguments raise ``ValueError`` with the message the ``dualpipe`` CLI prints; the Rust code
runs with the GIL released.
"""

from . import _native, eplb
from ._native import Schedule, schedule, simulate

__version__ = _native.__version__

__all__ = ["Schedule", "eplb", "schedule", "simulate", "__version__"]
