"""Scripted replies for the sim (`--sim-script`): rules `{match: REGEX, reply: TEXT}` read once at start;
a prompt whose decoded text a rule's regex searches gets that rule's reply tokens. Runs in the engine process.
"""
from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

RULE_KEYS = ("match", "reply")


class ScriptError(ValueError):
    """A script file that cannot be read or has a bad rule; the message names the file and the rule."""


@dataclass(frozen=True, slots=True)
class Rule:
    pattern: re.Pattern[str]
    reply: str
    reply_ids: tuple[int, ...]


class Script:
    """The rules in file order; the first whose regex searches the decoded prompt gives the reply."""

    __slots__ = ("_decode", "rules")

    def __init__(self, rules: Sequence[Rule], decode: Callable[[list[int]], str]) -> None:
        self.rules = tuple(rules)
        self._decode = decode

    def reply_for(self, prompt_token_ids: list[int]) -> tuple[int, ...] | None:
        """The reply token ids of the first matching rule, or None (the sim samples as usual)."""
        text = self._decode(prompt_token_ids)
        for rule in self.rules:
            if rule.pattern.search(text):
                return rule.reply_ids
        return None


def load_script(
    path: str | Path, encode: Callable[[str], list[int]], decode: Callable[[list[int]], str]
) -> Script:
    """Read and check the file (JSON if it ends in .json, else YAML) and tokenize every reply once."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ScriptError(f"--sim-script {str(path)!r}: cannot read the file: {exc}") from None
    try:
        data = json.loads(text) if path.suffix.lower() == ".json" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as exc:  # json.JSONDecodeError is a ValueError
        kind = "JSON" if path.suffix.lower() == ".json" else "YAML"
        raise ScriptError(f"--sim-script {str(path)!r}: not valid {kind}: {exc}") from None
    if not isinstance(data, list) or not data:
        raise ScriptError(f"--sim-script {str(path)!r}: expected a non-empty list of rules "
                          f"{{match: REGEX, reply: TEXT}}, got {_kind(data)}")
    return Script([_rule(path, i, item, encode) for i, item in enumerate(data)], decode)


def _rule(path: Path, i: int, item: Any, encode: Callable[[str], list[int]]) -> Rule:
    where = f"--sim-script {str(path)!r}: rule {i}"
    if not isinstance(item, dict):
        raise ScriptError(f"{where}: expected a mapping with keys match and reply, got {_kind(item)}")
    unknown = sorted(str(k) for k in item if k not in RULE_KEYS)
    if unknown:
        raise ScriptError(f"{where}: unknown key(s) {unknown}; allowed: match, reply")
    for key in RULE_KEYS:
        if not isinstance(item.get(key), str) or not item[key]:
            raise ScriptError(f"{where}: {key} must be a non-empty string, got {item.get(key)!r}")
    try:
        pattern = re.compile(item["match"], re.DOTALL)
    except re.error as exc:
        raise ScriptError(f"{where}: match {item['match']!r} is not a valid regex: {exc}") from None
    reply_ids = tuple(encode(item["reply"]))
    if not reply_ids:
        raise ScriptError(f"{where}: reply {item['reply']!r} tokenizes to no tokens")
    return Rule(pattern, item["reply"], reply_ids)


def _kind(value: Any) -> str:
    return "an empty list" if value == [] else type(value).__name__
