"""The engine client (layer 2): the ZMQ socket thread, the engine ranks and their handshakes, in-flight
engine requests, KV indexes, placement, the LoRA registry, and utility calls fanned out to ranks.
Imports text/ and parsers/ at most (it needs neither today) and the root's errors.py."""
