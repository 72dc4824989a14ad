"""The package itself: its names, its version, and that it never imports torch on its own."""

from __future__ import annotations

import subprocess
import sys

import dualpipe_rs


def test_public_names():
    assert set(dualpipe_rs.__all__) == {"Schedule", "eplb", "schedule", "simulate", "__version__"}
    assert dualpipe_rs.__version__.count(".") == 2
    assert callable(dualpipe_rs.eplb.rebalance_experts)
    assert dualpipe_rs.eplb.__all__ == ["rebalance_experts"]


def test_importing_and_balancing_does_not_import_torch():
    code = (
        "import sys\n"
        "from dualpipe_rs.eplb import rebalance_experts\n"
        "import dualpipe_rs\n"
        "rebalance_experts([[1.0, 2.0, 3.0, 4.0]], 4, 1, 1, 2)\n"
        "dualpipe_rs.simulate('1f1b', 2, 4)\n"
        "print('torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
