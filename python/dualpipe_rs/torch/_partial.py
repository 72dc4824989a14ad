"""The folder a checkpoint is written into before it is renamed into place, and its leftovers.

A checkpoint ``PATH`` is written into ``.<name>.partial-<step>-<random>`` beside it, created
exclusively (``os.mkdir`` of a name nobody else holds: a user's folder is never reused), with our
marker file inside naming the host and process that writes it. The marker, never the folder's
name, is what makes a folder ours: a leftover (its writer killed mid-save) is removed only when it
holds our marker, written on this host by a process that has ended. A user's ``PATH.partial-4``
folder, or a look-alike without the marker, is never touched. The marker is removed just before
the rename, so a complete checkpoint never looks partial.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import stat
from typing import Any, Dict, List, Optional

MARKER = ".dualpipe-partial.json"
KIND = "dualpipe-torch-checkpoint partial folder"
_MARKER_BYTES = 4096


def parent_of(target: str) -> str:
    """The folder ``target`` goes into."""
    return os.path.dirname(target) or "."


def create(target: str, step: int, fmt: str) -> str:
    """A new, empty partial folder beside ``target`` holding our marker (the parent folders are
    created when missing)."""
    parent = parent_of(target)
    os.makedirs(parent, exist_ok=True)
    base = os.path.basename(target)[:160]
    for _ in range(64):
        tmp = os.path.join(parent, f".{base}.partial-{step}-{secrets.token_hex(6)}")
        try:
            os.mkdir(tmp)
        except FileExistsError:
            continue
        marker = {"kind": KIND, "format": fmt, "host": socket.gethostname(), "pid": os.getpid(), "target": base}
        with open(os.path.join(tmp, MARKER), "x") as f:
            json.dump(marker, f)
        return tmp
    raise FileExistsError(f"no free name for a partial folder beside {target}")


def read_marker(folder: str) -> Optional[Dict[str, Any]]:
    """Our marker in ``folder``, or ``None`` when it holds none (a link, a FIFO, a big or foreign
    file named like it: not ours)."""
    try:
        fd = os.open(os.path.join(folder, MARKER), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > _MARKER_BYTES:
            return None
        marker = json.loads(os.read(fd, _MARKER_BYTES))
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)
    if not isinstance(marker, dict) or marker.get("kind") != KIND or not isinstance(marker.get("pid"), int):
        return None
    return marker


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return True
    return True


def remove_stale(parent: str) -> List[str]:
    """Removes the partial folders in ``parent`` that hold our marker, written on this host by a
    process that has ended; returns them. Anything else (a user's folder, a live writer's, another
    host's) is kept."""
    removed = []
    host = socket.gethostname()
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return removed
    for e in entries:
        if not (e.name.startswith(".") and ".partial-" in e.name):
            continue  # only a pre-filter: the marker decides
        try:
            if not e.is_dir(follow_symlinks=False):
                continue
        except OSError:
            continue
        marker = read_marker(e.path)
        if marker is None or marker.get("host") != host or _alive(marker["pid"]):
            continue
        shutil.rmtree(e.path, ignore_errors=True)
        if not os.path.lexists(e.path):
            removed.append(e.path)
    return removed


def discard(tmp: str) -> None:
    """Removes this process's own partial folder (made by :func:`create`) after a failed save."""
    if os.path.isdir(tmp) and not os.path.islink(tmp):
        shutil.rmtree(tmp, ignore_errors=True)


def publish(tmp: str, target: str) -> None:
    """Renames the complete folder ``tmp`` to ``target``, which must not exist: ``target`` is
    claimed with ``os.mkdir`` (exclusive: a folder, file or link that appeared there since the
    start is refused, never replaced), then ``tmp`` renamed over that empty claim."""
    os.unlink(os.path.join(tmp, MARKER))
    try:
        os.mkdir(target)
    except FileExistsError:
        raise FileExistsError(
            f"checkpoint directory {target} already exists (it appeared during the save): choose a new "
            "one (nothing is overwritten)"
        ) from None
    try:
        os.rename(tmp, target)
    except OSError:
        try:
            os.rmdir(target)  # our empty claim; a folder someone filled meanwhile stays
        except OSError:
            pass
        raise
