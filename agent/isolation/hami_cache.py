"""The per-container HAMi-core cache directories: `<hamiCacheRoot>/<pod uid>_<container>`.

The hook creates one for each container of a limited share; they are removed
when the pod stops (PostStopPodSandbox) and, because that notification can be
missed (the agent down while the pod went away), by the admission sweep for
every pod no longer on the node.
"""

from __future__ import annotations

import glob
import os
import shutil
import time
from collections.abc import Collection, Iterable


def dir_name(pod_uid: str, container_name: str) -> str:
    return f"{pod_uid}_{container_name}"


def owner_uid(name: str) -> str:
    """The pod UID a cache directory name belongs to ("" when the name is not one of ours)."""
    uid, sep, _ = name.partition("_")
    return uid if sep and uid else ""


def orphaned(names: Iterable[str], *, live_uids: Collection[str]) -> list[str]:
    """Pure: the directory names whose pod is not among `live_uids`."""
    return sorted(n for n in names if (uid := owner_uid(n)) and uid not in live_uids)


def remove_pod_dirs(root: str, pod_uid: str) -> None:
    """Removes every cache directory of `pod_uid` under `root`."""
    if not root or not pod_uid or "/" in pod_uid or pod_uid.startswith("."):
        return
    for path in glob.glob(os.path.join(glob.escape(root), f"{glob.escape(pod_uid)}_*")):
        shutil.rmtree(path, ignore_errors=True)


def remove_orphans(root: str, *, live_uids: Collection[str], min_age_s: float, now: float | None = None) -> list[str]:
    """Removes the directories of pods not in `live_uids` that are older than `min_age_s`; returns their names.

    The age guard covers a directory the hook made for a pod admitted after the pods were listed.
    """
    try:
        names = os.listdir(root)
    except OSError:
        return []
    now = time.time() if now is None else now
    removed = []
    for name in orphaned(names, live_uids=live_uids):
        path = os.path.join(root, name)
        try:
            if now - os.lstat(path).st_mtime < min_age_s:
                continue
        except OSError:
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(name)
    return removed
