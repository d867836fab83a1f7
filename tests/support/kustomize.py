"""The subset of `kustomize build` that deploy/k8s uses, so tests can render an overlay offline.

Supported, as kustomize does it: `resources` (files, or directories holding a kustomization.yaml),
`labels` (pairs added to every resource's metadata.labels; no selectors, no templates), `patches`
that are JSON 6902 operation lists (add, remove, replace) selected by target group/version/kind/name,
and the final drop of resources annotated `config.kubernetes.io/local-config: "true"`. Anything else
in a kustomization (another field, a strategic-merge patch, a target by label) raises, so an overlay
cannot silently rely on a feature this renderer would skip.
"""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

Resource = dict[str, Any]
KNOWN_FIELDS = {"apiVersion", "kind", "resources", "labels", "patches"}
TARGET_FIELDS = {"group", "version", "kind", "name"}
LOCAL_CONFIG = "config.kubernetes.io/local-config"


class Unsupported(ValueError):
    """The kustomization uses something this renderer does not implement."""


def build(directory: Path) -> list[Resource]:
    """The resources `kustomize build directory` prints, in order."""
    return [r for r in _build(Path(directory)) if _annotations(r).get(LOCAL_CONFIG) != "true"]


def load_documents(path: Path) -> list[Resource]:
    return [d for d in yaml.safe_load_all(Path(path).read_text()) if d is not None]


def _build(directory: Path) -> list[Resource]:
    k = yaml.safe_load((directory / "kustomization.yaml").read_text())
    unknown = set(k) - KNOWN_FIELDS
    if unknown:
        raise Unsupported(f"{directory}/kustomization.yaml: fields {sorted(unknown)}")
    resources: list[Resource] = []
    for entry in k.get("resources", []):
        path = directory / entry
        resources.extend(_build(path) if path.is_dir() else load_documents(path))
    for label in k.get("labels", []):
        if set(label) - {"pairs"}:
            raise Unsupported(f"{directory}: labels options {sorted(set(label) - {'pairs'})}")
        for r in resources:
            r.setdefault("metadata", {}).setdefault("labels", {}).update(label["pairs"])
    for patch in k.get("patches", []):
        ops = yaml.safe_load((directory / patch["path"]).read_text()) if "path" in patch else yaml.safe_load(
            patch["patch"])
        if not isinstance(ops, list):
            raise Unsupported(f"{directory}: only JSON 6902 patches (a list of operations)")
        target = patch["target"]
        if set(target) - TARGET_FIELDS:
            raise Unsupported(f"{directory}: patch target keys {sorted(set(target) - TARGET_FIELDS)}")
        matched = [i for i, r in enumerate(resources) if _matches(r, target)]
        if not matched:
            raise ValueError(f"{directory}: patch target {target} matches no resource")  # kustomize: a no-op
        for i in matched:
            resources[i] = apply_json6902(resources[i], ops)
    return resources


def _annotations(r: Resource) -> dict[str, str]:
    return r.get("metadata", {}).get("annotations") or {}


def _matches(r: Resource, target: dict[str, str]) -> bool:
    group, _, version = r["apiVersion"].rpartition("/")
    have = {"group": group, "version": version, "kind": r["kind"], "name": r["metadata"]["name"]}
    return all(have[key] == value for key, value in target.items())


def apply_json6902(doc: Resource, ops: list[dict[str, Any]]) -> Resource:
    """RFC 6902 add/remove/replace; a missing path is an error, as in kustomize."""
    doc = copy.deepcopy(doc)
    for op in ops:
        kind, path = op["op"], op["path"]
        if kind not in ("add", "remove", "replace"):
            raise Unsupported(f"JSON 6902 op {kind!r}")
        *parents, last = [p.replace("~1", "/").replace("~0", "~") for p in path.split("/")[1:]]
        node: Any = doc
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        if isinstance(node, list):
            index = len(node) if last == "-" else int(last)
            if kind == "add":
                node.insert(index, copy.deepcopy(op["value"]))
                continue
            if not 0 <= index < len(node):
                raise KeyError(f"{path}: no element {index}")
            if kind == "remove":
                del node[index]
            else:
                node[index] = copy.deepcopy(op["value"])
        else:
            if kind != "add" and last not in node:
                raise KeyError(f"{path}: no member {last!r}")
            if kind == "remove":
                del node[last]
            else:
                node[last] = copy.deepcopy(op["value"])
    return doc
