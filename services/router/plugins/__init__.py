"""Plugins at the request and response hooks (semantic cache, memory, RAG, stateful Responses), over a store."""
