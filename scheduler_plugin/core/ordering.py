"""Node order: name order for listings, a fixed per-run order for ties, and name -> slot lookups.

All three are recomputed only when nodes join or leave (`membership_version`),
because adapters ask the same questions for every pod.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from scheduler_plugin.core.api import NodeName
from scheduler_plugin.core.cluster import ClusterState
from scheduler_plugin.core.filtering import slots_for

Ranks = npt.NDArray[np.int64]
Slots = npt.NDArray[np.intp]


class NodeOrder:
    def __init__(self, state: ClusterState, *, tie_break_seed: int | None) -> None:
        self.state = state
        self.tie_break_seed = tie_break_seed
        self._by_name: tuple[int, Ranks] | None = None
        self._ties: tuple[int, Ranks] | None = None
        self._all: tuple[tuple[int, bytes], list[str], Slots] | None = None
        self._lookup: tuple[int, list[NodeName], Slots] | None = None

    def name_ranks(self) -> Ranks:
        """rank[slot]: position of the slot's node in name order (free slots last)."""
        version = self.state.membership_version
        if (
            self._by_name is None
            or self._by_name[0] != version
            or len(self._by_name[1]) != self.state.capacity
        ):
            names = self.state.names
            order = sorted(range(len(names)), key=lambda s: (names[s] == "", names[s]))
            self._by_name = (version, _ranks(order))
        return self._by_name[1]

    def tie_ranks(self) -> Ranks:
        """rank[slot] for breaking equal scores: name order, or a shuffle keyed by seed and name.

        Keying the shuffle by name (not by arrival) keeps a node's place when others join.
        """
        if self.tie_break_seed is None:
            return self.name_ranks()
        version = self.state.membership_version
        if self._ties is None or self._ties[0] != version or len(self._ties[1]) != self.state.capacity:
            seed = self.tie_break_seed
            keys = [
                (name == "", hashlib.blake2b(f"{seed}\0{name}".encode(), digest_size=8).digest(), name)
                for name in self.state.names
            ]
            self._ties = (version, _ranks(sorted(range(len(keys)), key=keys.__getitem__)))
        return self._ties[1]

    def all_nodes(self) -> tuple[list[str], Slots]:
        """Every known node, in name order, with its slot."""
        active = self.state.active
        key = (self.state.membership_version, active.tobytes())
        if self._all is None or self._all[0] != key:
            slots = np.flatnonzero(active)
            slots = slots[np.argsort(self.name_ranks()[slots], kind="stable")]
            self._all = (key, [self.state.names[s] for s in slots], slots)
        return self._all[1], self._all[2]

    def slots_of(self, nodes: Sequence[NodeName]) -> Slots:
        """Slots of the named nodes (-1 for unknown ones); the last answer is kept, as callers
        usually pass the same list again (filter, then score, for every pod)."""
        version = self.state.membership_version
        if self._lookup is not None and self._lookup[0] == version and self._lookup[1] == nodes:
            return self._lookup[2]
        slots = slots_for(self.state, nodes)
        self._lookup = (version, list(nodes), slots)
        return slots


def _ranks(order: list[int]) -> Ranks:
    ranks = np.empty(len(order), dtype=np.int64)
    ranks[order] = np.arange(len(order))
    return ranks
