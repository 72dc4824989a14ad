"""Shared fixtures: where the golden oracles live.

The golden data sits in ``shared/golden`` beside the repository (``<repo>/../shared/golden``);
set ``DUALPIPE_GOLDEN`` to point elsewhere. When the default location is missing the golden
tests are skipped; when ``DUALPIPE_GOLDEN`` is set but wrong they fail.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


def golden_dir() -> Path:
    """The golden data directory (may not exist)."""
    env = os.environ.get("DUALPIPE_GOLDEN")
    return Path(env) if env else REPO_ROOT.parent / "shared" / "golden"


def golden_files(sub: str) -> list:
    """Every JSON file of ``golden/<sub>``, sorted; a single skip marker if there are none."""
    d = golden_dir() / sub
    files = sorted(d.glob("*.json")) if d.is_dir() else []
    if not files:
        if os.environ.get("DUALPIPE_GOLDEN"):
            return [pytest.param(None, id=f"missing-{sub}")]
        return [pytest.param(None, id=f"no-{sub}", marks=pytest.mark.skip(f"no golden data in {d}"))]
    return [pytest.param(f, id=f.stem) for f in files]


def load_golden(path):
    """The parsed golden case, failing clearly when DUALPIPE_GOLDEN points nowhere."""
    if path is None:
        pytest.fail(f"DUALPIPE_GOLDEN={os.environ.get('DUALPIPE_GOLDEN')} holds no golden files")
    with open(path) as f:
        return json.load(f)
