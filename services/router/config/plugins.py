"""The plugins' configuration (router process, read once at start by plugins_reader.py): the store, the
knowledge bases, and the plugins an entry's default and each decision run at the request and response
hooks. Every field is documented in docs/router-config.md; defaults are written here only."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, TypeAlias

STORE_BACKENDS = ("sqlite", "postgres")
ON_STORE_ERROR = ("open", "closed")  # the store down: the request goes on without the plugin, or is refused (503)


@dataclass(frozen=True, slots=True)
class StoreConfig:
    backend: str = "sqlite"  # of STORE_BACKENDS
    path: str = "router-state.db"  # sqlite: the file (relative to the working directory)
    dsn: str | None = field(default=None, repr=False)  # postgres: libpq URI (it may hold a password)
    timeout_s: float = 0.5  # the longest one store call may take
    responses: bool = True  # keep Responses API state (`store`, `previous_response_id`, GET/DELETE)
    responses_ttl_s: float = 30 * 86400  # how long a stored response is kept


@dataclass(frozen=True, slots=True)
class KnowledgeConfig:
    name: str
    paths: tuple[str, ...]  # files and folders of text and markdown (folders read recursively)
    embedder: str  # an embed deployment
    chunk_chars: int = 1500  # a chunk's longest
    overlap_chars: int = 200  # carried from one chunk into the next
    refresh_s: float = 30.0  # how often the files are checked for changes (0: only at start)
    max_file_bytes: int = 10 << 20  # a longer file is skipped, and said so
    extensions: tuple[str, ...] = (".md", ".markdown", ".txt", ".rst")


@dataclass(frozen=True, slots=True)
class SemanticCacheConfig:
    type: ClassVar[str] = "semantic_cache"
    embedder: str  # an embed deployment
    threshold: float = 0.92  # cosine similarity of the request's last user turn to a cached one's
    ttl_s: float = 3600.0
    max_entries: int = 100_000  # over the whole cache (every scope), oldest evicted first
    shared: bool = False  # true: one cache for every tenant of the entry; false: each tenant its own
    store_tool_calls: bool = False  # answers ending in tool calls are cached too
    store_truncated: bool = False  # answers cut off (finish_reason length) are cached too
    semantic: bool = True  # false: exact hits only (no embedding call)
    timeout_s: float = 1.0  # the longest its request hook may take (embedding and lookup); past it: a miss


@dataclass(frozen=True, slots=True)
class MemoryConfig:
    type: ClassVar[str] = "memory"
    embedder: str  # an embed deployment
    top_k: int = 5
    min_similarity: float = 0.3
    max_tokens: int = 512  # the recalled memories' budget in the system message
    max_memories: int = 10_000  # per user; the oldest go first
    on_store_error: str = "open"  # of ON_STORE_ERROR
    timeout_s: float = 1.0  # the longest its request hook may take (embedding and recall)


@dataclass(frozen=True, slots=True)
class RagConfig:
    type: ClassVar[str] = "rag"
    knowledge: str  # a knowledge base
    top_k: int = 4
    min_similarity: float = 0.2
    max_tokens: int = 1500  # the recalled chunks' budget in the system message
    on_store_error: str = "open"  # of ON_STORE_ERROR
    timeout_s: float = 1.0  # the longest its request hook may take (embedding and recall)


PluginConfig: TypeAlias = SemanticCacheConfig | MemoryConfig | RagConfig
PLUGIN_TYPES: dict[str, type] = {p.type: p for p in (SemanticCacheConfig, MemoryConfig, RagConfig)}
