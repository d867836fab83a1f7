"""The gRPC schema's lock (fleet.lock.json): every message's fields by number (name, type, label, oneof),
its reserved numbers and names, every enum's values and every service's methods, read from the
compiled descriptor, and the rules an edit must keep: a field keeps its number, name and type
forever; a new field takes a number above every number the message ever used; a removed field's
number and name are reserved; methods keep their types and streaming; enum values keep their numbers.

`python -m protocol.grpc --check` compares the proto with the lock, `--update` rewrites the lock
(after the same checks). The lock keeps the numbers of fields that were removed (under "reserved"),
so a later edit cannot reuse them even if the proto's reserved line is dropped too.
"""
from __future__ import annotations

import argparse
import copy
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

LOCK_PATH = Path(__file__).with_name("fleet.lock.json")
_HOW = ("append a field with the next unused number instead; to drop one, delete it and add "
        "`reserved <number>; reserved \"<name>\";` to its message")

Schema = dict[str, Any]

_TYPE_NAMES = {1: "double", 2: "float", 3: "int64", 4: "uint64", 5: "int32", 6: "fixed64", 7: "fixed32", 8: "bool",
               9: "string", 12: "bytes", 13: "uint32", 15: "sfixed32", 16: "sfixed64", 17: "sint32", 18: "sint64"}


def _field_type(f: Any) -> str:
    if f.message_type is not None:
        if f.message_type.GetOptions().map_entry:
            k, v = f.message_type.fields_by_name["key"], f.message_type.fields_by_name["value"]
            return f"map<{_field_type(k)}, {_field_type(v)}>"
        return f.message_type.full_name
    if f.enum_type is not None:
        return f.enum_type.full_name
    return _TYPE_NAMES[f.type]


def _label(f: Any) -> str:
    if f.message_type is not None and f.message_type.GetOptions().map_entry:
        return "map"
    if f.is_repeated:
        return "repeated"
    if f.has_presence and f.message_type is None and f.containing_oneof is None:
        return "optional"
    return ""


def describe(file: Any | None = None) -> Schema:
    """The schema as the proto declares it now (the compiled descriptor of fleet.proto)."""
    if file is None:
        from protocol.grpc import pb2
        file = pb2.DESCRIPTOR
    messages: dict[str, Any] = {}

    def walk(desc: Any) -> None:
        if desc.GetOptions().map_entry:
            return
        fields = {}
        for f in desc.fields:
            oneof = f.containing_oneof
            synthetic = oneof is not None and oneof.name == f"_{f.name}"  # proto3 `optional`
            fields[str(f.number)] = [f.name, _field_type(f), _label(f), oneof.name if oneof and not synthetic else ""]
        messages[desc.full_name] = {"fields": fields}
        for nested in desc.nested_types:
            walk(nested)

    for desc in file.message_types_by_name.values():
        walk(desc)
    enums = {e.full_name: {v.name: v.number for v in e.values} for e in file.enum_types_by_name.values()}
    services = {s.full_name: {m.name: [m.input_type.full_name, m.output_type.full_name,
                                       bool(m.client_streaming), bool(m.server_streaming)] for m in s.methods}
                for s in file.services_by_name.values()}
    return {"package": file.package, "messages": messages, "enums": enums, "services": services}


def reserved_in_proto(source: str) -> dict[str, tuple[set[int], set[str]]]:
    """Each message's `reserved` numbers and names as the proto text declares them (the Python
    descriptor does not expose them). A small reader for the one form this file uses:
    `reserved 3, 5 to 7; reserved "name";` on a line of the message's body."""
    out: dict[str, tuple[set[int], set[str]]] = {}
    stack: list[str] = []  # the enclosing blocks: a message's name, "" for any other block
    package = ""
    for raw in source.splitlines():
        line = raw.split("//", 1)[0].strip()
        if line.startswith("package "):
            package = line.removeprefix("package ").rstrip(";").strip()
        elif line.startswith("reserved ") and stack and stack[-1]:
            name = ".".join([package, *[s for s in stack if s]])
            numbers, names = out.setdefault(name, (set(), set()))
            for part in line.removeprefix("reserved ").rstrip(";").split(","):
                part = part.strip()
                if part.startswith('"'):
                    names.add(part.strip('"'))
                elif " to " in part:
                    lo, hi = (int(x) for x in part.split(" to "))
                    numbers.update(range(lo, hi + 1))
                else:
                    numbers.add(int(part))
        for _ in range(line.count("{")):
            words = line.split()
            stack.append(words[1] if words[0] == "message" else "")
        for _ in range(line.count("}")):
            stack.pop()
    return out


def fingerprint(schema: Schema) -> str:
    body = json.dumps({k: schema[k] for k in ("package", "messages", "enums", "services")}, sort_keys=True)
    return hashlib.sha256(body.encode()).hexdigest()[:16]


def problems(lock: Schema, now: Schema, reserved: dict[str, tuple[set[int], set[str]]] | None = None) -> list[str]:
    """Why `now` breaks peers built from `lock` (empty when it is a pure append)."""
    reserved = reserved or {}
    out: list[str] = []
    if now["package"] != lock["package"]:
        out.append(f"package changed {lock['package']} -> {now['package']}: a new version is a new package "
                   "(fleet.v2) beside this one, not an edit")
    for name, old in lock["messages"].items():
        new = now["messages"].get(name)
        if new is None:
            out.append(f"message {name} was removed or renamed; keep it (an old peer still sends it)")
            continue
        numbers, names = reserved.get(name, (set(), set()))
        used = {int(n) for n in old["fields"]} | set(old.get("reserved", []))
        for number, field in old["fields"].items():
            got = new["fields"].get(number)
            if got is None:
                if int(number) not in numbers or field[0] not in names:
                    out.append(f"message {name}: field {number} '{field[0]}' was removed without reserving its "
                               f"number and name; {_HOW}")
                continue
            if got[:2] != field[:2]:
                out.append(f"message {name}: field {number} was '{field[0]}: {field[1]}' in the lock and is "
                           f"'{got[0]}: {got[1]}' now; {_HOW}")
            elif got[2] != field[2] and {got[2], field[2]} != {"", "optional"}:
                out.append(f"message {name}: field {number} '{field[0]}' changed label '{field[2]}' -> "
                           f"'{got[2]}'; {_HOW}")
        for number in old.get("reserved", []):
            if str(number) in new["fields"]:
                out.append(f"message {name}: field number {number} was removed before and may not be reused; {_HOW}")
        top = max(used, default=0)
        for number, field in new["fields"].items():
            if number not in old["fields"] and int(number) <= top:
                out.append(f"message {name}: new field '{field[0]}' takes number {number}, not above every number "
                           f"the message used ({top}); {_HOW}")
    for name, values in lock["enums"].items():
        got = now["enums"].get(name)
        if got is None:
            out.append(f"enum {name} was removed or renamed")
            continue
        for value, number in values.items():
            if got.get(value) != number:
                out.append(f"enum {name}: {value} = {number} in the lock, {got.get(value)} now; values keep "
                           "their numbers")
    for name, methods in lock["services"].items():
        got = now["services"].get(name)
        if got is None:
            out.append(f"service {name} was removed or renamed")
            continue
        for method, shape in methods.items():
            if got.get(method) != shape:
                out.append(f"service {name}: method {method} was {shape} (input, output, client stream, server "
                           f"stream) and is {got.get(method)} now; add a new method instead")
    return out


def merged(lock: Schema | None, now: Schema) -> Schema:
    """The lock to write: the schema now, with every number a message ever used and no longer has kept
    under "reserved"."""
    out = copy.deepcopy(now)
    for name, msg in out["messages"].items():
        old = (lock or {}).get("messages", {}).get(name)
        gone = set(old.get("reserved", [])) if old else set()
        if old:
            gone |= {int(n) for n in old["fields"] if n not in msg["fields"]}
        if gone:
            msg["reserved"] = sorted(gone)
    out["fingerprint"] = fingerprint(out)
    return out


def check(lock: Schema, now: Schema, reserved: dict[str, tuple[set[int], set[str]]] | None = None) -> list[str]:
    found = problems(lock, now, reserved)
    if found:
        return found
    if fingerprint(lock) != lock.get("fingerprint"):
        return ["fleet.lock.json was edited by hand (its fingerprint does not match); run "
                "`python -m protocol.grpc --update`"]
    if fingerprint(merged(lock, now)) != lock["fingerprint"]:
        return ["fleet.proto grew and the lock is stale: run `python -m protocol.grpc --update` and commit "
                "fleet.lock.json"]
    return []


def _proto_reserved() -> dict[str, tuple[set[int], set[str]]]:
    from protocol.grpc import PROTO, PROTO_DIR
    return reserved_in_proto((PROTO_DIR / PROTO).read_text())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m protocol.grpc", description=__doc__)
    parser.add_argument("--update", action="store_true", help="rewrite fleet.lock.json (after the checks)")
    parser.add_argument("--check", action="store_true", help="compare fleet.proto with the lock (the default)")
    args = parser.parse_args(argv)
    lock = json.loads(LOCK_PATH.read_text()) if LOCK_PATH.exists() else None
    now = describe()
    reserved = _proto_reserved()
    if args.update:
        found = problems(lock, now, reserved) if lock is not None else []
        if found:
            print("\n".join(found), file=sys.stderr)
            return 1
        written = merged(lock, now)
        LOCK_PATH.write_text(json.dumps(written, indent=1, sort_keys=True) + "\n")
        print(f"wrote {LOCK_PATH} fingerprint {written['fingerprint']}")
        return 0
    if lock is None:
        print("no fleet.lock.json: run `python -m protocol.grpc --update`", file=sys.stderr)
        return 1
    found = check(lock, now, reserved)
    print("\n".join(found) or f"fleet.proto matches the lock ({lock['fingerprint']})")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
