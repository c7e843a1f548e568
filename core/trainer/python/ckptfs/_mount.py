"""Where a checkpoint path lies: a plain directory or a ckptfs mount, and its view directories.

A path is on a ckptfs mount when the mount point above it (found by walking up while st_dev
stays the same) is listed in /proc/self/mountinfo with fstype fuse.ckptfs.  On a mount,
MOUNT/REL has the views MOUNT/tpT_ppP/REL (docs/views.md section 2).
"""
from __future__ import annotations

import os
import re
from typing import Optional, Tuple

_VIEW_RE = re.compile(r"^tp([1-9][0-9]*)_pp([1-9][0-9]*)$")


def _unescape(s: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as \ooo
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), s)


def fstype_at(point: str) -> Optional[str]:
    """The fstype of the mount at exactly `point` (the last one mounted there), or None."""
    try:
        with open("/proc/self/mountinfo") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    found = None
    for line in lines:
        left, _, right = line.partition(" - ")
        fields = left.split()
        if len(fields) >= 5 and _unescape(fields[4]) == point:
            found = right.split()[0] if right else None
    return found


def mount_root(path: str) -> Optional[str]:
    """The ckptfs mount point holding path (path or its nearest existing ancestor), or None."""
    p = os.path.realpath(path)
    while not os.path.exists(p):
        parent = os.path.dirname(p)
        if parent == p:
            return None
        p = parent
    dev = os.stat(p).st_dev
    while True:
        parent = os.path.dirname(p)
        if parent == p or os.stat(parent).st_dev != dev:
            break
        p = parent
    return p if fstype_at(p) == "fuse.ckptfs" else None


def split(path: str) -> Tuple[Optional[str], str, Optional[Tuple[int, int]]]:
    """(mount root or None, the path relative to the mount's plain tree, (T, P) if path is
    inside a view tree)."""
    root = mount_root(path)
    if root is None:
        return None, os.path.realpath(path), None
    rel = os.path.relpath(os.path.realpath(path), root)
    first, _, rest = rel.partition(os.sep)
    m = _VIEW_RE.match(first)
    if m:
        return root, rest, (int(m.group(1)), int(m.group(2)))
    return root, rel, None


def view_dir(root: str, rel: str, tp: int, pp: int = 1) -> str:
    return os.path.join(root, f"tp{tp}_pp{pp}", rel)
