"""Render Hugging Face chat templates with minijinja, byte for byte as transformers' jinja2 setup does.

Pure: the frontend (one ChatTemplate per model, built at start) and the router's precise_prefix policy
(which must render a request to the same text, hence the same token ids, as the frontend) both use it.
``render`` is safe to call from worker threads (minijinja locks its environment and releases the GIL
while it renders).
"""

from __future__ import annotations

import hashlib
import json
import re
from datetime import datetime
from numbers import Number
from pathlib import Path
from typing import Any

import minijinja

__all__ = ["ChatTemplate", "MissingTemplate", "TemplateError"]

# transformers passes every special token the tokenizer has set (its special_tokens_map).
SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
RESERVED_KWARGS = frozenset({"messages", "tools", "add_generation_prompt"})
# transformers appends this to the final message, renders, and cuts there (continue_final_message).
CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "
# transformers' AssistantTracker tag only records where assistant text lies. minijinja has no such tag;
# `with` scopes its body as jinja2's call block does and keeps the tag's whitespace control.
GENERATION_TAG = re.compile(r"\{%([-+]?)\s*(end)?generation\s*([-+]?)%\}")


class TemplateError(ValueError):
    """A chat template that cannot be loaded, or cannot be rendered for this request (an HTTP 400).
    `param`: the render option at fault, when it is the options that do not go together (render
    checks them for every caller, so an HTTP frontend need not check them again)."""

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class MissingTemplate(TemplateError):
    """A checkpoint that has no chat template at all (most embedding and classifier checkpoints): a
    server may still serve its other routes."""


class _Float:
    """A float minijinja would not give back as Python does: it prints 1e-05 as 0.00001 and hands
    an integral 18.0 to Python filters as int 18. Opaque to minijinja, so it reaches them unchanged.
    The price: templates cannot do arithmetic on it or compare it with a number (no hook for that),
    which chat templates do with lengths and indices, not with the request's floats."""

    __slots__ = ("value",)

    def __init__(self, value: float) -> None:
        self.value = value

    def __repr__(self) -> str:
        return repr(self.value)

    def __eq__(self, other: object) -> bool:
        return self.value == (other.value if isinstance(other, _Float) else other)

    def __hash__(self) -> int:
        return hash(self.value)


def _needs_box(value: float) -> bool:
    # 0.0 stays a native number so `{% if x %}` stays false; in 1e-4 <= |x| < 1e16 both print alike.
    return value != 0.0 and (value.is_integer() or not 1e-4 <= abs(value) < 1e16)


class _Invalid(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.path: list[str | int] = []


_BASES: tuple[type[Any], ...] = (str, int, float, dict, list, tuple)


def _plain(value: Any) -> Any:
    """A fresh JSON-shaped copy: a template may call .pop/.append on it, never on the caller's data."""
    kind = type(value)
    if kind is str or kind is int or kind is bool or value is None:
        return value
    if kind is float:
        return _Float(value) if _needs_box(value) else value
    if kind is dict:
        out = {}
        for key, item in value.items():
            if type(key) is not str:
                raise _Invalid(f"key {key!r} is not a string")
            try:
                out[key] = _plain(item)
            except _Invalid as exc:
                exc.path.append(key)
                raise
        return out
    if kind is list or kind is tuple:
        items = []
        for index, item in enumerate(value):
            try:
                items.append(_plain(item))
            except _Invalid as exc:
                exc.path.append(index)
                raise
        return items
    for base in _BASES:  # subclasses: str enums, Markup, IntEnum
        if isinstance(value, base):
            return _plain(base(value))
    raise _Invalid(f"{type(value).__name__} is not JSON data")


def _copy(value: Any, field: str) -> Any:
    try:
        return _plain(value)
    except _Invalid as exc:
        path = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in reversed(exc.path))
        raise TemplateError(f"{field}{path}: {exc}") from None
    except RecursionError:
        raise TemplateError(f"{field}: nested too deeply") from None


def _json_default(value: Any) -> Any:
    if type(value) is _Float:
        return value.value
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def _tojson(value: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None,
            sort_keys: bool = False) -> str:
    # transformers' filter: json.dumps, no HTML escaping (minijinja's own escapes < > & ').
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys, default=_json_default)


def _raise_exception(message: str) -> None:
    raise TemplateError(message)


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


def _int(value: Any, default: int = 0, base: int = 10) -> int:
    # jinja2's filter: "42.5" -> 42 and " 7 " -> 7, anything else -> default (minijinja's raises).
    if type(value) is _Float:
        value = value.value
    try:
        return int(value, base) if isinstance(value, str) else int(value)
    except (TypeError, ValueError):
        try:
            return int(float(value))
        except (TypeError, ValueError, OverflowError):
            return default


def _float(value: Any, default: float = 0.0) -> float:
    if type(value) is _Float:
        return value.value
    try:
        return float(value)
    except (TypeError, ValueError):
        return default


def _is_iterable(value: Any) -> bool:
    # minijinja says none is iterable; jinja2 asks Python, which says no.
    try:
        iter(value)
    except TypeError:
        return False
    return True


def _is_sequence(value: Any) -> bool:
    # jinja2 counts strings and dicts as sequences (they have len and []); minijinja does not.
    try:
        len(value)
        value.__getitem__  # noqa: B018 - having it is the test
    except (TypeError, AttributeError):
        return False
    return True


def _is_number(value: Any) -> bool:
    return isinstance(value, (Number, _Float))


def _environment(templates: dict[str, str]) -> minijinja.Environment:
    env = minijinja.Environment(
        # transformers compiles with trim_blocks and lstrip_blocks; the rest are jinja2's defaults.
        trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=False, undefined_behavior="lenient",
        pycompat=True, auto_escape_callback=lambda name: False,
        filters={"tojson": _tojson, "int": _int, "float": _float},
        tests={"iterable": _is_iterable, "sequence": _is_sequence, "number": _is_number},
        globals={"raise_exception": _raise_exception, "strftime_now": _strftime_now},
    )
    for name, source in templates.items():
        source = GENERATION_TAG.sub(lambda m: f"{{%{m[1]} {m[2] or ''}with {m[3]}%}}", source)
        try:
            env.add_template(name, source)  # compiled here, once
        except minijinja.TemplateError as exc:
            raise TemplateError(f"chat template {name!r} does not compile: {exc.message}") from None
    return env


def _token(value: Any, field: str) -> str | None:
    if isinstance(value, dict):  # an AddedToken as tokenizer_config.json stores it
        value = value.get("content")
        field += ".content"
    if value is None or isinstance(value, str):
        return value
    raise TemplateError(f"tokenizer_config.json: {field} must be a string")


def _config_templates(value: Any) -> dict[str, str]:
    if value is None or isinstance(value, str):
        return {"default": value} if value else {}
    if not isinstance(value, list):
        raise TemplateError("tokenizer_config.json: chat_template must be a string or a list")
    templates = {}
    for i, entry in enumerate(value):
        if not (isinstance(entry, dict) and isinstance(entry.get("name"), str)
                and isinstance(entry.get("template"), str)):
            raise TemplateError(f"tokenizer_config.json: chat_template[{i}]: needs string name and template")
        templates[entry["name"]] = entry["template"]
    return templates


def _file_templates(path: Path) -> dict[str, str]:
    # Newer checkpoints keep templates in files, which transformers prefers to tokenizer_config.json.
    templates = {}
    if (path / "chat_template.jinja").is_file():
        templates["default"] = (path / "chat_template.jinja").read_text(encoding="utf-8")
    extra = path / "additional_chat_templates"
    if extra.is_dir():
        for file in sorted(extra.glob("*.jinja")):
            templates[file.stem] = file.read_text(encoding="utf-8")
    return templates


class ChatTemplate:
    """A model's chat template(s), compiled once; immutable after construction."""

    __slots__ = ("_env", "_reads_content", "_special_tokens", "sha256")

    def __init__(self, templates: str | dict[str, str], *,
                 special_tokens: dict[str, str] | None = None) -> None:
        templates = {"default": templates} if isinstance(templates, str) else dict(templates)
        if "default" not in templates:
            raise TemplateError(f"chat templates {sorted(templates)} have no 'default' entry")
        self._env = _environment(templates)
        self._reads_content = {name: "content" in source for name, source in templates.items()}
        self._special_tokens = dict(special_tokens or {})
        # The template's identity (gRPC's GetModelInfo): a router that renders it too can check it has the same.
        self.sha256 = hashlib.sha256(json.dumps(templates, sort_keys=True).encode()).hexdigest()

    @classmethod
    def from_checkpoint(cls, path: Path) -> ChatTemplate:
        """The template(s) and special tokens of a checkpoint directory, found as transformers finds them."""
        path = Path(path)
        config_file = path / "tokenizer_config.json"
        try:
            config = json.loads(config_file.read_text(encoding="utf-8")) if config_file.is_file() else {}
        except json.JSONDecodeError as exc:
            raise TemplateError(f"{config_file}: not valid JSON ({exc})") from None
        templates = _file_templates(path) or _config_templates(config.get("chat_template"))
        if not templates:
            raise MissingTemplate(f"{path}: no chat template in tokenizer_config.json or chat_template.jinja")
        tokens = {name: _token(config.get(name), name) for name in SPECIAL_TOKENS}
        return cls(templates, special_tokens={name: tok for name, tok in tokens.items() if tok is not None})

    def render(self, messages: list[dict[str, Any]], *, tools: list[dict[str, Any]] | None = None,
               add_generation_prompt: bool = True, continue_final_message: bool = False,
               chat_template_kwargs: dict[str, Any] | None = None) -> str:
        """The prompt text of a conversation. Raises TemplateError, naming the field, on a bad request."""
        if add_generation_prompt and continue_final_message:
            raise TemplateError("add_generation_prompt and continue_final_message cannot both be true: "
                                "set add_generation_prompt to false to continue the final message",
                                param="continue_final_message")
        if not isinstance(messages, list) or not messages:
            raise TemplateError("messages: must be a non-empty list", param="messages")
        if tools is not None and not isinstance(tools, list):
            raise TemplateError("tools: must be a list or null")
        context: dict[str, Any] = dict(self._special_tokens, documents=None)
        if chat_template_kwargs:
            if not isinstance(chat_template_kwargs, dict):
                raise TemplateError("chat_template_kwargs: must be an object")
            for key in RESERVED_KWARGS.intersection(chat_template_kwargs):
                raise TemplateError(f"chat_template_kwargs.{key}: may not override the request's {key}",
                                    param=f"chat_template_kwargs.{key}")
            context.update(_copy(chat_template_kwargs, "chat_template_kwargs"))
        context["messages"] = _copy(messages, "messages")
        context["tools"] = _copy(tools, "tools")
        context["add_generation_prompt"] = add_generation_prompt
        # As transformers picks: "tool_use" whenever tools are given (even []), if the model has one.
        name = "tool_use" if tools is not None and "tool_use" in self._reads_content else "default"
        if not continue_final_message:
            return self._render(name, context)
        if not self._reads_content[name]:
            raise TemplateError("continue_final_message: this chat template never reads message content")
        final = _tag_final_message(context["messages"])
        return _cut_at_tag(self._render(name, context), final)

    def _render(self, name: str, context: dict[str, Any]) -> str:
        try:
            return self._env.render_template(name, **context)
        except TemplateError:
            raise  # raise_exception(): the template's own message
        except minijinja.TemplateError as exc:
            raise TemplateError(f"chat template: {exc.message}") from None
        except (LookupError, TypeError, ValueError, ArithmeticError) as exc:
            # From a Python method or filter the template called: d.pop('missing'), tojson(indent='x').
            raise TemplateError(f"chat template: {type(exc).__name__}: {exc}") from None


def _tag_final_message(messages: list[Any]) -> str:
    """Append transformers' tag to the final message's text, in our copy; return the text untagged."""
    final = messages[-1]
    content = final.get("content") if isinstance(final, dict) else None
    if content is None:
        raise TemplateError("messages[-1].content: continue_final_message needs a final message with content")
    if isinstance(content, str):
        final["content"] = content + CONTINUE_TAG
        return content
    for block in reversed(content if isinstance(content, list) else []):
        if isinstance(block, dict) and isinstance(block.get("text"), str):
            text: str = block["text"]
            block["text"] = text + CONTINUE_TAG
            return text
    raise TemplateError("messages[-1].content: continue_final_message found no text to continue")


def _cut_at_tag(rendered: str, final: str) -> str:
    tag = CONTINUE_TAG.strip()
    if final.strip() not in rendered or tag not in rendered:
        raise TemplateError("continue_final_message: the chat template drops part of the final message, "
                            "so it cannot be left open")
    at = rendered.rindex(tag)
    if rendered.startswith(CONTINUE_TAG, at):
        return rendered[:at]
    return rendered[:at].rstrip()  # the template trimmed the tag's space, so it trims the content too
