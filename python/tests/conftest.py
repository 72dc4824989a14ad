"""Shared fixtures: where the golden oracles live.

The golden data sits in the repository, ``<repo>/testdata/golden``; set ``DUALPIPE_GOLDEN`` to
point elsewhere. A missing golden directory fails the golden tests (it is part of the checkout).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


def dualpipe_cli():
    """A built `dualpipe` CLI: ``DUALPIPE_BIN``, else ``<repo>/target/{release,debug}/dualpipe``;
    ``None`` when there is none (the tests that need one skip)."""
    env = os.environ.get("DUALPIPE_BIN")
    if env:
        return Path(env)
    for profile in ("release", "debug"):
        path = REPO_ROOT / "target" / profile / "dualpipe"
        if path.is_file():
            return path
    return None


def golden_dir() -> Path:
    """The golden data directory (may not exist)."""
    env = os.environ.get("DUALPIPE_GOLDEN")
    return Path(env) if env else REPO_ROOT / "testdata" / "golden"


def golden_files(sub: str) -> list:
    """Every JSON file of ``golden/<sub>``, sorted; a single skip marker if there are none."""
    d = golden_dir() / sub
    files = sorted(d.glob("*.json")) if d.is_dir() else []
    if not files:
        return [pytest.param(None, id=f"missing-{sub}")]
    return [pytest.param(f, id=f.stem) for f in files]


def load_golden(path):
    """The parsed golden case, failing clearly when DUALPIPE_GOLDEN points nowhere."""
    if path is None:
        pytest.fail(f"no golden files in {golden_dir()}")
    with open(path) as f:
        return json.load(f)


def torchrun(script: Path, nproc: int, suite: str, out: Path, timeout: float = 300):
    """Runs ``script --out OUT --suite SUITE`` on ``nproc`` processes under torchrun (one thread
    each), in ``out``; returns (returncode, output, seconds)."""
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--standalone",
           "--monitor_interval", "0.2", str(script), "--out", str(out), "--suite", suite]
    t0 = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=str(out))
    return p.returncode, p.stdout + p.stderr, time.monotonic() - t0
