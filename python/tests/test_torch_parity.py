"""The GPT against PyTorch (scripts/torch_gpt_parity.py): `dualpipe eval` and one SGD step of
`dualpipe train --model gpt` agree with PyTorch in f64 to 1e-9.

Runs only where torch is importable and a built CLI is found (``DUALPIPE_BIN``, else
``<repo>/target/{release,debug}/dualpipe``); skipped otherwise, so torch stays out of the
default test command.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import REPO_ROOT, dualpipe_cli
pytest.importorskip("torch")


CLI = dualpipe_cli()


@pytest.mark.skipif(CLI is None, reason="no built dualpipe CLI (set DUALPIPE_BIN)")
def test_gpt_matches_pytorch():
    script = REPO_ROOT / "scripts" / "torch_gpt_parity.py"
    p = subprocess.run([sys.executable, str(script), "--binary", str(CLI)], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "all checks agree" in p.stdout
