"""Schema lock: every struct's ordered (name, type, has_default) fields, a fingerprint over them,
and the compatibility rules an edit must keep. `python -m protocol.schema --update` rewrites the lock.
"""
from __future__ import annotations

import argparse
import functools
import hashlib
import json
import sys
import types
import typing
from pathlib import Path
from typing import Any

import msgspec

from protocol.messages import MESSAGE_TYPES, NESTED_TYPES
from protocol.version import MAJOR, MINOR

LOCK_PATH = Path(__file__).with_name("schema.lock.json")
_HOW_TO_BREAK = (
    "only append new fields at the end, each with a default; a breaking change must bump "
    "protocol.version.MAJOR and then run `python -m protocol.schema --update`"
)

Schema = dict[str, Any]


def type_name(tp: Any) -> str:
    if tp is type(None):
        return "None"
    if tp is Any:
        return "Any"
    origin = typing.get_origin(tp)
    if origin is None:
        return tp.__name__
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_name(a) for a in args)
    return f"{origin.__name__}[{', '.join(type_name(a) for a in args)}]"


def describe() -> Schema:
    """The schema as the code declares it now."""
    structs: dict[str, list[list[Any]]] = {}
    for cls in (*MESSAGE_TYPES.values(), *NESTED_TYPES):
        structs[cls.__name__] = [
            [f.name, type_name(f.type), not f.required] for f in msgspec.structs.fields(cls)
        ]
    tags = {cls.__name__: tag for tag, cls in sorted(MESSAGE_TYPES.items())}
    return {"major": MAJOR, "minor": MINOR, "tags": tags, "structs": structs}


def fingerprint(schema: Schema) -> str:
    """sha256 over tags and struct layouts (not the version numbers), first 16 hex digits."""
    body = json.dumps({"tags": schema["tags"], "structs": schema["structs"]}, sort_keys=True)
    return hashlib.sha256(body.encode()).hexdigest()[:16]


@functools.cache
def current_fingerprint() -> str:
    return fingerprint(describe())


def load_lock(path: Path = LOCK_PATH) -> Schema:
    return json.loads(path.read_text())


def compatibility_problems(lock: Schema, now: Schema) -> list[str]:
    """Why `now` cannot be read by peers built from `lock` at the same major (empty if it can)."""
    problems: list[str] = []
    for name, tag in lock["tags"].items():
        if name not in now["tags"]:
            problems.append(f"message {name} (tag {tag}) was removed or renamed; {_HOW_TO_BREAK}")
        elif now["tags"][name] != tag:
            problems.append(f"message {name} changed tag {tag} -> {now['tags'][name]}; {_HOW_TO_BREAK}")
    for name, old_fields in lock["structs"].items():
        new_fields = now["structs"].get(name)
        if new_fields is None:
            problems.append(f"struct {name} was removed or renamed; {_HOW_TO_BREAK}")
            continue
        for i, old in enumerate(old_fields):
            if i >= len(new_fields):
                problems.append(
                    f"struct {name}: field #{i} '{old[0]}: {old[1]}' was removed; {_HOW_TO_BREAK}"
                )
                break
            new = new_fields[i]
            if new[0] != old[0] or new[1] != old[1]:
                what = "renamed or reordered" if new[1] == old[1] else "retyped, renamed or reordered"
                problems.append(
                    f"struct {name}: field #{i} was '{old[0]}: {old[1]}' in the lock and is "
                    f"'{new[0]}: {new[1]}' now ({what}); {_HOW_TO_BREAK}"
                )
                break
            if old[2] and not new[2]:
                problems.append(
                    f"struct {name}: field '{old[0]}' lost its default, so old writers that omit it "
                    f"can no longer be read; {_HOW_TO_BREAK}"
                )
        for new in new_fields[len(old_fields):]:
            if not new[2]:
                problems.append(
                    f"struct {name}: appended field '{new[0]}: {new[1]}' has no default, so old "
                    f"writers that omit it can no longer be read; give it a default"
                )
    return problems


def check(lock: Schema, now: Schema) -> list[str]:
    """Everything wrong between the committed lock and the code; empty when they agree."""
    if fingerprint(lock) != lock.get("fingerprint"):
        return ["schema.lock.json was edited by hand (its fingerprint does not match its content); "
                "run `python -m protocol.schema --update`"]
    if now["major"] < lock["major"]:
        return [f"protocol MAJOR went backwards: lock {lock['major']}, code {now['major']}"]
    if now["major"] == lock["major"]:
        problems = compatibility_problems(lock, now)
        if problems:
            return problems
    if fingerprint(now) == lock["fingerprint"]:
        if (now["major"], now["minor"]) != (lock["major"], lock["minor"]):
            return [f"version is {now['major']}.{now['minor']} but the lock says "
                    f"{lock['major']}.{lock['minor']} and the schema did not change; "
                    "run `python -m protocol.schema --update`"]
        return []
    if now["major"] == lock["major"] and now["minor"] <= lock["minor"]:
        return [f"the schema grew compatibly but MINOR is still {now['minor']}: bump "
                "protocol.version.MINOR, then run `python -m protocol.schema --update`"]
    return [f"the schema changed ({lock['fingerprint']} -> {fingerprint(now)}) and the lock is "
            "stale: run `python -m protocol.schema --update` and commit schema.lock.json"]


def _dump(schema: Schema) -> str:
    """JSON with one field per line, so a diff of the lock reads like a diff of the structs."""
    structs = ",\n".join(
        f'  "{name}": [\n' + ",\n".join(f"    {json.dumps(f)}" for f in fields) + "\n  ]"
        for name, fields in schema["structs"].items()
    )
    head = {k: schema[k] for k in ("major", "minor", "fingerprint", "tags")}
    return json.dumps(head, indent=1)[:-2] + ',\n "structs": {\n' + structs + "\n }\n}\n"


def write_lock(path: Path = LOCK_PATH) -> Schema:
    schema = describe()
    schema["fingerprint"] = fingerprint(schema)
    path.write_text(_dump(schema))
    return schema


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m protocol.schema", description=__doc__)
    parser.add_argument("--update", action="store_true", help="rewrite schema.lock.json (after checks)")
    args = parser.parse_args(argv)
    lock = load_lock() if LOCK_PATH.exists() else None
    now = describe()
    if args.update:
        problems = [] if lock is None else [
            p for p in check(lock, now) if "--update" not in p
        ]
        if problems:
            print("\n".join(problems), file=sys.stderr)
            return 1
        print(f"wrote {LOCK_PATH} fingerprint {write_lock()['fingerprint']}")
        return 0
    if lock is None:
        print("no schema.lock.json")
        return 1
    problems = check(lock, now)
    print("\n".join(problems) or f"schema matches lock ({lock['fingerprint']})")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
