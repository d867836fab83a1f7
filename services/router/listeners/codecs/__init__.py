"""The public APIs' codecs (router process): each API's requests to upstream chat/completions and its
answers back (codec.py: the record each builds; one module per API; registry.py finds them by name)."""
