"""The KV blocks one replica's engines hold, per rank, as its frontend's KvEvents stream reports them
(router process, precise_prefix policy). No I/O: kv_events.py feeds it, the policy reads it."""
from __future__ import annotations

from collections.abc import Iterable


class ReplicaBlocks:
    """Block hashes per rank, and where the stream that fills them stands (for resuming it)."""

    __slots__ = ("connected", "epochs", "mismatch", "ranks", "relay_epoch", "seq")

    def __init__(self) -> None:
        self.ranks: dict[int, set[int]] = {}
        self.epochs: dict[int, str] = {}  # each rank's engine session, as the events name it
        self.relay_epoch = ""  # the frontend's relay; with `seq`, where a new subscription resumes
        self.seq = 0  # of the latest event applied; 0: none, resume from a snapshot
        self.connected = False  # a stream is open now (what is held may be stale otherwise)
        self.mismatch = ""  # why this replica's hashes cannot be ours (another tokenizer), or ""

    def stored(self, rank: int, epoch: str, hashes: Iterable[int]) -> None:
        self._rank(rank, epoch).update(hashes)

    def removed(self, rank: int, epoch: str, hashes: Iterable[int]) -> None:
        self._rank(rank, epoch).difference_update(hashes)

    def cleared(self, rank: int, epoch: str) -> None:
        """The rank restarted, died, or its cache was reset; or a snapshot starts over for it."""
        self.ranks[rank] = set()
        self.epochs[rank] = epoch

    def reset(self) -> None:
        """Before a snapshot: forget every rank, so that one the snapshot no longer lists holds nothing."""
        self.ranks.clear()
        self.epochs.clear()
        self.relay_epoch, self.seq = "", 0

    def match(self, hashes: list[int]) -> tuple[int, int]:
        """(blocks, rank): the longest leading run of `hashes` one rank holds; (0, -1) if none does.
        A request runs on one rank, so runs on different ranks do not add up."""
        if self.mismatch:
            return 0, -1
        best, best_rank = 0, -1
        for rank, held in self.ranks.items():
            n = 0
            for h in hashes:
                if h not in held:
                    break
                n += 1
            if n > best:
                best, best_rank = n, rank
        return best, best_rank

    @property
    def blocks(self) -> int:
        return sum(len(held) for held in self.ranks.values())

    def _rank(self, rank: int, epoch: str) -> set[int]:
        held = self.ranks.get(rank)
        if held is None or self.epochs.get(rank) != epoch:
            # A new session without its `cleared` first (it was lost with a relay's history): start empty.
            held = self.ranks[rank] = set()
            self.epochs[rank] = epoch
        return held
