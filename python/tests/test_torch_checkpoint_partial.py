"""``dualpipe_rs.torch._partial``: a checkpoint's partial folder is ours by its marker alone.

Cases the contract test (test_checkpoint_contract.py, rule 4) does not stage through torchrun: a
link named like a partial folder, a marker that is a link or a FIFO, another host's marker, and
the exclusive claim of the target at the rename.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

if os.environ.get("DUALPIPE_REQUIRE_TORCH"):
    import torch  # noqa: F401 - CI: must be installed
else:
    pytest.importorskip("torch", reason="torch is not installed")

from dualpipe_rs.torch import _partial  # noqa: E402


def dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def marked(folder, pid, host=None):
    os.makedirs(folder)
    with open(os.path.join(folder, _partial.MARKER), "w") as f:
        json.dump({"kind": _partial.KIND, "format": "x", "host": host or socket.gethostname(), "pid": pid}, f)


def test_only_our_marked_folders_of_ended_processes_are_removed(tmp_path):
    d = str(tmp_path)
    pid = dead_pid()
    marked(os.path.join(d, ".a.partial-1-dead"), pid)
    marked(os.path.join(d, ".a.partial-1-other-host"), pid, host="not-" + socket.gethostname())
    marked(os.path.join(d, ".a.partial-1-live"), os.getpid())
    # a folder of ours reached through a link named like a partial folder: the link is not followed
    marked(os.path.join(d, "elsewhere"), pid)
    os.symlink(os.path.join(d, "elsewhere"), os.path.join(d, ".a.partial-1-link"))
    # a marker that is a link to a marker of ours, and one that is a FIFO (never opened to wait)
    os.makedirs(os.path.join(d, ".a.partial-1-linked-marker"))
    os.symlink(os.path.join(d, "elsewhere", _partial.MARKER), os.path.join(d, ".a.partial-1-linked-marker", _partial.MARKER))
    os.makedirs(os.path.join(d, ".a.partial-1-fifo"))
    os.mkfifo(os.path.join(d, ".a.partial-1-fifo", _partial.MARKER))
    os.makedirs(os.path.join(d, "a.partial-1"))  # a user's, named as the old code named its own
    removed = _partial.remove_stale(d)
    assert removed == [os.path.join(d, ".a.partial-1-dead")]
    left = set(os.listdir(d))
    assert left == {".a.partial-1-other-host", ".a.partial-1-live", "elsewhere", ".a.partial-1-link",
                    ".a.partial-1-linked-marker", ".a.partial-1-fifo", "a.partial-1"}
    assert os.path.isfile(os.path.join(d, "elsewhere", _partial.MARKER))


def test_a_partial_folder_is_new_marked_and_published_only_onto_nothing(tmp_path):
    target = str(tmp_path / "sub" / "ck")  # the parent is created
    a = _partial.create(target, 7, "x")
    b = _partial.create(target, 7, "x")
    assert a != b and os.path.basename(a).startswith(".ck.partial-7-")
    assert _partial.read_marker(a)["pid"] == os.getpid()
    os.makedirs(target)  # appeared during the save: refused, never replaced
    with pytest.raises(FileExistsError, match="already exists"):
        _partial.publish(a, target)
    assert os.listdir(target) == []
    _partial.discard(a)
    assert not os.path.exists(a)
    _partial.publish(b, str(tmp_path / "sub" / "ck2"))
    assert os.listdir(tmp_path / "sub" / "ck2") == []  # the marker is gone: a complete one never looks partial
