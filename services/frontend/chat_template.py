"""Render Hugging Face chat templates with minijinja, byte for byte as transformers' jinja2 setup does.

Runs in the frontend server process: one ChatTemplate per model, built at start; ``render`` is safe to
call from worker threads (minijinja locks its environment and releases the GIL while it renders).
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from numbers import Number
from pathlib import Path
from typing import Any

import minijinja

__all__ = ["ChatTemplate", "TemplateError"]

# transformers passes every special token the tokenizer has set (its special_tokens_map).
SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
RESERVED_KWARGS = frozenset({"messages", "tools", "add_generation_prompt"})
# transformers appends this to the final message, renders, and cuts at it (continue_final_message).
CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "
# transformers' AssistantTracker tag only marks assistant spans; `with` keeps its scoping and its
# whitespace control ({%- generation -%}), so the body renders exactly as jinja2 renders it.
GENERATION_TAG = re.compile(r"\{%([-+]?)\s*(end)?generation\s*([-+]?)%\}")


class TemplateError(ValueError):
    """A chat template that cannot be loaded, or cannot be rendered for this request (an HTTP 400)."""


class _Float:
    """A float minijinja would not give back as Python does: it prints 1e-05 as 0.00001 and hands an
    integral 18.0 to Python filters as int 18. Opaque to minijinja, so it reaches filters unchanged."""

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
    # 0.0 stays a native number so `{% if x %}` stays false; in 1e-4 <= |x| < 1e16 the two agree.
    return value != 0.0 and (value.is_integer() or not 1e-4 <= abs(value) < 1e16)


class _Invalid(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.path: list[str | int] = []


def _plain(value: Any) -> Any:
    """A fresh JSON-shaped copy: the template may call .pop/.append on it, never on the caller's data."""
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
    for base in (str, int, float, dict, list, tuple):  # subclasses: str enums, Markup, IntEnum
        if isinstance(value, base):
            return _plain(base(value))
    raise _Invalid(f"{type(value).__name__} is not JSON data")


def _copy(value: Any, field: str) -> Any:
    try:
        return _plain(value)
    except _Invalid as exc:
        path = field + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in reversed(exc.path))
        raise TemplateError(f"{path}: {exc}") from None
    except RecursionError:
        raise TemplateError(f"{field}: nested too deeply") from None


def _json_default(value: Any) -> Any:
    if type(value) is _Float:
        return value.value
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def tojson(value: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None,
           sort_keys: bool = False) -> str:
    """transformers' tojson: json.dumps without jinja2's HTML escaping (minijinja's escapes < > & ')."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys, default=_json_default)


def raise_exception(message: str) -> None:
    raise TemplateError(message)


def strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


def to_int(value: Any, default: int = 0, base: int = 10) -> int:
    """jinja2's int filter: "42.5" -> 42, anything unparsable -> default (minijinja's raises)."""
    if type(value) is _Float:
        value = value.value
    try:
        return int(value, base) if isinstance(value, str) else int(value)
    except (TypeError, ValueError):
        try:
            return int(float(value))
        except (TypeError, ValueError, OverflowError):
            return default


def to_float(value: Any, default: float = 0.0) -> float:
    if type(value) is _Float:
        return value.value
    try:
        return float(value)
    except (TypeError, ValueError):
        return default


def is_iterable(value: Any) -> bool:
    # minijinja says none is iterable; jinja2 asks Python, which says no.
    try:
        iter(value)
    except TypeError:
        return False
    return value is not None


def is_sequence(value: Any) -> bool:
    # jinja2 counts strings and dicts as sequences (len and __getitem__); minijinja does not.
    try:
        len(value)
        value.__getitem__  # noqa: B018 - the attribute lookup is the test
    except (TypeError, AttributeError):
        return False
    return True


def is_number(value: Any) -> bool:
    return isinstance(value, (Number, _Float))


def _environment(templates: dict[str, str]) -> minijinja.Environment:
    env = minijinja.Environment(
        # The settings transformers compiles with; the rest are jinja2's defaults.
        trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=False,
        undefined_behavior="lenient", pycompat=True, auto_escape_callback=lambda name: False,
        filters={"tojson": tojson, "int": to_int, "float": to_float},
        tests={"iterable": is_iterable, "sequence": is_sequence, "number": is_number},
        globals={"raise_exception": raise_exception, "strftime_now": strftime_now},
    )
    for name, source in templates.items():
        source = GENERATION_TAG.sub(lambda m: f"{{%{m[1]} {m[2] or ''}with {m[3]}%}}", source)
        try:
            env.add_template(name, source)  # compiled once, here
        except minijinja.TemplateError as exc:
            raise TemplateError(f"chat template {name!r} does not compile: {exc.message}") from None
    return env


def _token(value: Any, field: str) -> str | None:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    raise TemplateError(f"tokenizer_config.json: {field} must be a string or {{'content': str}}")


def _config_templates(value: Any) -> dict[str, str]:
    if value is None or isinstance(value, str):
        return {"default": value} if value else {}
    if not isinstance(value, list):
        raise TemplateError("tokenizer_config.json: chat_template must be a string or a list")
    templates = {}
    for i, entry in enumerate(value):
        if not (isinstance(entry, dict) and isinstance(entry.get("name"), str)
                and isinstance(entry.get("template"), str)):
            raise TemplateError(f"tokenizer_config.json: chat_template[{i}] must be {{name: str, template: str}}")
        templates[entry["name"]] = entry["template"]
    return templates


def _file_templates(path: Path) -> dict[str, str]:
    # Newer checkpoints keep templates in files; transformers prefers them to tokenizer_config.json.
    templates = {}
    if (path / "chat_template.jinja").is_file():
        templates["default"] = (path / "chat_template.jinja").read_text(encoding="utf-8")
    extra = path / "additional_chat_templates"
    if extra.is_dir():
        for file in sorted(extra.glob("*.jinja")):
            templates[file.stem] = file.read_text(encoding="utf-8")
    return templates


class ChatTemplate:
    """A model's chat template(s), compiled once. Immutable after construction."""

    __slots__ = ("_env", "_tool_use", "_special_tokens", "_mentions_content")

    def __init__(self, templates: str | dict[str, str], *, special_tokens: dict[str, str] | None = None) -> None:
        templates = {"default": templates} if isinstance(templates, str) else dict(templates)
        if "default" not in templates:
            raise TemplateError(f"chat templates {sorted(templates)} have no 'default' entry")
        self._env = _environment(templates)
        self._tool_use = "tool_use" in templates
        self._special_tokens = dict(special_tokens or {})
        self._mentions_content = "content" in templates["default"]

    @classmethod
    def from_checkpoint(cls, path: Path) -> ChatTemplate:
        """The template(s) and special tokens of a checkpoint directory, as transformers loads them."""
        config_file = Path(path) / "tokenizer_config.json"
        try:
            config = json.loads(config_file.read_text(encoding="utf-8")) if config_file.is_file() else {}
        except json.JSONDecodeError as exc:
            raise TemplateError(f"{config_file}: not valid JSON ({exc})") from None
        templates = _file_templates(Path(path)) or _config_templates(config.get("chat_template"))
        if not templates:
            raise TemplateError(f"{path}: no chat template (none in tokenizer_config.json, no chat_template.jinja)")
        tokens = {name: token for name in SPECIAL_TOKENS if (token := _token(config.get(name), name)) is not None}
        return cls(templates, special_tokens=tokens)

    def render(self, messages: list[dict], *, tools: list[dict] | None = None, add_generation_prompt: bool = True,
               continue_final_message: bool = False, chat_template_kwargs: dict | None = None) -> str:
        """The prompt text for a conversation. Raises TemplateError, naming the field, on a bad request."""
        if add_generation_prompt and continue_final_message:
            raise TemplateError("add_generation_prompt and continue_final_message cannot both be true: "
                                "set add_generation_prompt to false to continue the final message")
        if not isinstance(messages, list) or not messages:
            raise TemplateError("messages: must be a non-empty list")
        if tools is not None and not isinstance(tools, list):
            raise TemplateError("tools: must be a list or null")
        context = dict(self._special_tokens, documents=None)
        if chat_template_kwargs:
            if not isinstance(chat_template_kwargs, dict):
                raise TemplateError("chat_template_kwargs: must be an object")
            for key in chat_template_kwargs:
                if key in RESERVED_KWARGS:
                    raise TemplateError(f"chat_template_kwargs.{key}: may not override the request's {key}")
            context.update(_copy(chat_template_kwargs, "chat_template_kwargs"))
        context["messages"] = _copy(messages, "messages")
        context["tools"] = _copy(tools, "tools")
        context["add_generation_prompt"] = add_generation_prompt
        name = "tool_use" if tools is not None and self._tool_use else "default"
        if not continue_final_message:
            return self._render(name, context)
        final = self._tag_final_message(context["messages"])
        return self._cut_at_tag(self._render(name, context), final)

    def _render(self, name: str, context: dict[str, Any]) -> str:
        try:
            return self._env.render_template(name, **context)
        except TemplateError:
            raise  # raise_exception(): the template's own message
        except minijinja.TemplateError as exc:
            raise TemplateError(f"chat template: {exc.message}") from None
        except (LookupError, TypeError, ValueError, ArithmeticError) as exc:
            # A Python method or filter the template called (d.pop('missing'), tojson on a macro).
            raise TemplateError(f"chat template: {type(exc).__name__}: {exc}") from None

    def _tag_final_message(self, messages: list[Any]) -> str:
        """Append transformers' tag to the final message's text (our copy); return that text."""
        final = messages[-1]
        content = final.get("content") if isinstance(final, dict) else None
        if content is None:
            raise TemplateError("messages[-1].content: continue_final_message needs a final message with content")
        if not self._mentions_content:
            raise TemplateError("continue_final_message: the chat template never reads message content")
        if isinstance(content, str):
            final["content"] = content + CONTINUE_TAG
            return content
        for block in reversed(content if isinstance(content, list) else []):
            if isinstance(block, dict) and isinstance(block.get("text"), str):
                text = block["text"]
                block["text"] = text + CONTINUE_TAG
                return text
        raise TemplateError("messages[-1].content: continue_final_message found no text to continue")

    @staticmethod
    def _cut_at_tag(rendered: str, final: str) -> str:
        tag = CONTINUE_TAG.strip()
        if final.strip() not in rendered or tag not in rendered:
            raise TemplateError("continue_final_message: the chat template drops part of the final message, "
                                "so it cannot be left open")
        at = rendered.rindex(tag)
        if rendered.startswith(CONTINUE_TAG, at):
            return rendered[:at]
        return rendered[:at].rstrip()  # the template trimmed the tag's space, so it trims content too
