"""Frontend peers of one engine rank: who has handshaken, when each was last heard, what each owns.

Two frontends may reuse the same request id, so the backend sees engine-internal ids that
name the peer too; outputs are mapped back here in one dict lookup each.
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field


@dataclass(slots=True, eq=False)
class Peer:
    identity: bytes
    frontend_id: str
    number: int
    last_seen: float
    requests: set[str] = field(default_factory=set)  # engine-internal ids
    # Anything but Hello heard since its Ready: a Hello after that starts a new session; one before it
    # is a retry the frontend sent while waiting for that Ready (queued while this rank loaded).
    spoke: bool = False


class Peers:
    def __init__(self) -> None:
        self._by_identity: dict[bytes, Peer] = {}
        self._owner: dict[str, tuple[Peer, str]] = {}  # internal id -> (peer, client request id)
        self._next_number = 0

    def __len__(self) -> int:
        return len(self._by_identity)

    def __iter__(self) -> Iterator[Peer]:
        return iter(list(self._by_identity.values()))

    def get(self, identity: bytes) -> Peer | None:
        return self._by_identity.get(identity)

    def join(self, identity: bytes, frontend_id: str, now: float) -> Peer:
        self._next_number += 1
        peer = Peer(identity, frontend_id, self._next_number, now)
        self._by_identity[identity] = peer
        return peer

    def leave(self, peer: Peer) -> list[str]:
        """Forget a peer; returns the internal ids of the requests it still owned."""
        self._by_identity.pop(peer.identity, None)
        orphans = list(peer.requests)
        for internal_id in orphans:
            self._owner.pop(internal_id, None)
        peer.requests.clear()
        return orphans

    def excuse(self, seconds: float, now: float) -> None:
        """Credit every peer with `seconds` this rank did not listen (a long step, the process stopped):
        messages queued meanwhile are not read yet, and that silence is the rank's, not the peers'."""
        for p in self._by_identity.values():
            p.last_seen = min(now, p.last_seen + seconds)

    def silent_since(self, deadline: float) -> list[Peer]:
        return [p for p in self._by_identity.values() if p.last_seen < deadline]

    # ---- request ownership ----

    def internal_id(self, peer: Peer, request_id: str) -> str:
        return f"{peer.number}:{request_id}"

    def own(self, peer: Peer, internal_id: str, request_id: str) -> None:
        peer.requests.add(internal_id)
        self._owner[internal_id] = (peer, request_id)

    def owner(self, internal_id: str) -> tuple[Peer, str] | None:
        return self._owner.get(internal_id)

    def release(self, internal_id: str) -> tuple[Peer, str] | None:
        entry = self._owner.pop(internal_id, None)
        if entry is not None:
            entry[0].requests.discard(internal_id)
        return entry

    def in_flight(self) -> int:
        return len(self._owner)

    def all_requests(self) -> list[str]:
        return list(self._owner)
