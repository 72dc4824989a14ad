"""Shared fixtures: where the golden oracles live.

The golden data sits in the repository, ``<repo>/testdata/golden``; set ``DUALPIPE_GOLDEN`` to
point elsewhere. A missing golden directory fails the golden tests (it is part of the checkout).
"""

from __future__ import annotations

import json
import os
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
