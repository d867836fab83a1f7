"""OpenAI's Images API (POST /v1/images/generations), run in the router process: the request body checked
field by field (a 400 names the field and its allowed values), then relayed as it came to an image pool,
whose JSON answer (status and body) goes back to the client as it is."""
from __future__ import annotations

from typing import Any

from services.router.listeners.codecs.codec import Codec, CodecError
from services.router.listeners.codecs.openai import ChunkStream, openai_error
from services.router.listeners.codecs.request_fields import whole

IMAGES_PATH = "/v1/images/generations"
SIZES = ("auto", "256x256", "512x512", "1024x1024", "1536x1024", "1024x1536", "1792x1024", "1024x1792")
# The fields that take one of a few strings, and those strings.
CHOICES: dict[str, tuple[str, ...]] = {
    "size": SIZES,
    "response_format": ("url", "b64_json"),
    "output_format": ("png", "jpeg", "webp"),
    "quality": ("auto", "standard", "hd", "low", "medium", "high"),
    "style": ("vivid", "natural"),
    "background": ("transparent", "opaque", "auto"),
    "moderation": ("low", "auto"),
}
MAX_IMAGES = 10
# OpenAI's fields this router cannot carry: the relay passes one JSON answer on, never an event stream.
REFUSED = {"stream": "streamed image generation is not supported by this router: leave `stream` out or false",
           "partial_images": "partial images need a streamed answer, which this router does not support"}
FIELDS = ("model", "prompt", "n", *CHOICES, "output_compression", "user", *REFUSED)


def images_request(body: Any) -> dict[str, Any]:
    """The body as it goes to the image pool (the dispatcher replaces its model), after every check:
    CodecError names the first field at fault and what it allows. A null field counts as absent."""
    if not isinstance(body, dict):
        raise CodecError("", "the request body must be a JSON object")
    for key in body:
        if key not in FIELDS:
            raise CodecError(key, f"unknown field; the Images API takes: {', '.join(FIELDS)}")
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise CodecError("model", "a model name (non-empty string) is required")
    if not isinstance(body.get("prompt"), str) or not body["prompt"]:
        raise CodecError("prompt", "a prompt (non-empty string) is required")
    stream = body.get("stream")
    if stream is not None and stream is not False:
        raise CodecError("stream", REFUSED["stream"] if stream is True else "must be a boolean, and only false")
    if body.get("partial_images") is not None:
        raise CodecError("partial_images", REFUSED["partial_images"])
    _ranged(body, "n", 1, MAX_IMAGES)
    _ranged(body, "output_compression", 0, 100)
    for key, allowed in CHOICES.items():
        value = body.get(key)
        if value is not None and value not in allowed:
            raise CodecError(key, f"must be one of {', '.join(allowed)}; got {value!r}")
    if body.get("user") is not None and not isinstance(body["user"], str):
        raise CodecError("user", "must be a string")
    return body


def _ranged(body: dict[str, Any], key: str, low: int, high: int) -> None:
    value = body.get(key)
    if value is None:
        return
    message = f"must be an integer from {low} to {high}; got {value!r}"
    try:
        value = whole(value, key)
    except CodecError:
        raise CodecError(key, message) from None
    if not low <= value <= high:
        raise CodecError(key, message)
    body[key] = value


def _as_is(answer: dict[str, Any], request: dict[str, Any]) -> dict[str, Any]:
    return answer


# passthrough: the image pool's answer is already this API's. judged=False: an image is no text to
# accept or judge, so an escalate entry's images go to the first of its stages that answers.
IMAGES = Codec("images", IMAGES_PATH, images_request, _as_is, lambda request: ChunkStream(), openai_error,
               upstream_path=IMAGES_PATH, passthrough=True, judged=False)
