"""The one exception type protocol decoding raises."""
from __future__ import annotations


class ProtocolError(ValueError):
    """A message could not be decoded or does not belong to this protocol version."""
