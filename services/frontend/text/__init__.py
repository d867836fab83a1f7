"""Text from token ids (the frontend's lowest layer with parsers/): incremental detokenizing, stop
strings, each token's string and the logprobs' JSON. Imports nothing else of the frontend."""
