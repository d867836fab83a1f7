"""The router's public APIs by name (router process): each codec once, in the order listeners'
`apis` list them. An API is one module in this package plus its line here."""
from __future__ import annotations

from services.router.listeners.codecs.anthropic import MESSAGES
from services.router.listeners.codecs.anthropic_count import COUNT_TOKENS
from services.router.listeners.codecs.codec import Codec
from services.router.listeners.codecs.images import IMAGES
from services.router.listeners.codecs.openai import CHAT, COMPLETIONS
from services.router.listeners.codecs.responses import RESPONSES

CODECS: dict[str, Codec] = {codec.name: codec for codec in (CHAT, COMPLETIONS, RESPONSES, MESSAGES,
                                                                       COUNT_TOKENS, IMAGES)}
# What a pool must produce (of PoolConfig.outputs) to answer an API; every API not named here wants text.
OUTPUTS = {IMAGES.name: "image"}


def output_of(api: str) -> str:
    """The output a pool must declare to be routed a request of `api`: image for the Images API, else text."""
    return OUTPUTS.get(api, "text")


def error_shape(api: str | None) -> Codec:
    """The codec whose error body `api` answers with: its own; OpenAI's (chat's) for the router's
    routes that are no adapted API (models, decisions, metrics, paths it does not know)."""
    return CODECS.get(api or "", CHAT)
