"""Compaction on demand: forget the change history now, as etcd's compactor does.

After it, a watch resumed from any earlier resourceVersion (or a list
continued from an older token) gets 410 Gone and must relist: with
`KubeAPIServer.drop_watches()` right after, every informer meets a 410 on resume.
"""

from __future__ import annotations

from tests.kubeapi.store import Store


def compact(store: Store) -> int:
    """Drops every retained change; returns the compacted resourceVersion."""
    with store.cond:
        store._history.clear()  # the store's own history; compaction is the store's business
        store.compacted_rv = store.rv
        store.cond.notify_all()
        return store.compacted_rv
