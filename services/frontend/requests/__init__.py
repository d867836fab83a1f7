"""Requests (layer 3): OpenAI and token-in bodies decoded and checked, refusals, structured outputs,
tools, tokenization, worker-side preparation, and translation into engine requests. Imports the layers
below (engine_client/, text/, parsers/) and the root's errors.py, never generation/ or a face."""
