"""Which deployments the config uses, and why: the model runtime starts workers for these only (pure
rule routing starts none). Run once by the router process at start."""
from __future__ import annotations

from services.router.config import RouterConfig


def used_deployments(config: RouterConfig) -> dict[str, list[str]]:
    """Deployment name -> the reasons it is used, in the config's deployment order; a deployment
    nothing uses is absent. Users are: the signals that name a deployment (their `deployment` key:
    "signal entries.auto.signals[1] (topic, classifier)"), the stages of native System One recipes
    ("stage of entries.triage"), and the listeners that publish it as a System One model ("published
    as a System One model on listener public"), the embedders of the recall plugins ("embedder of plugin
    entries.auto.plugins[0] (semantic_cache)") and of the knowledge bases a rag plugin reads ("embedder of
    knowledge base handbook")."""
    reasons: dict[str, list[str]] = {}
    read: dict[str, None] = {}  # the knowledge bases some rag plugin reads, in the order first named
    for entry_name, entry in config.entries.items():
        # A signal no decision (or projection) reads is never evaluated: it starts nothing. Entries
        # that know which signals they need say so (`needed`); otherwise every signal counts.
        needed = getattr(entry, "needed", None)
        for i, signal in enumerate(entry.signals):
            # Only the model-backed signal types have the key; rule signals never use a deployment.
            name = getattr(signal, "deployment", None)
            if isinstance(name, str) and (needed is None or signal.name in needed):
                reasons.setdefault(name, []).append(
                    f"signal entries.{entry_name}.signals[{i}] ({signal.name}, {signal.type})")
        if entry.native:  # its candidates are deployments: every decision's stages, and the default's
            stages = entry.default + tuple(stage for rule in entry.decisions for stage in rule.pools)
            for stage in dict.fromkeys(stages):
                reasons.setdefault(stage, []).append(f"stage of entries.{entry_name}")
        lists = [(f"entries.{entry_name}.plugins", entry.plugins)] + [
            (f"entries.{entry_name}.decisions[{i}].plugins", rule.plugins)
            for i, rule in enumerate(entry.decisions) if rule.plugins is not None]
        for path, plugins in lists:
            for j, plugin in enumerate(plugins):
                embedder = getattr(plugin, "embedder", None)
                # An exact-only cache (semantic: false) never embeds: it starts nothing.
                if isinstance(embedder, str) and getattr(plugin, "semantic", True):
                    reasons.setdefault(embedder, []).append(f"embedder of plugin {path}[{j}] ({plugin.type})")
                knowledge = getattr(plugin, "knowledge", None)
                if isinstance(knowledge, str):
                    read[knowledge] = None
    for name in read:
        base = config.knowledge.get(name)
        if base is not None:  # one nobody reads is never indexed, so never embedded
            reasons.setdefault(base.embedder, []).append(f"embedder of knowledge base {name}")
    for listener in config.listeners:
        for model in listener.systemone:
            if model in config.deployments:  # else a native entry: its stages are counted above
                reasons.setdefault(model, []).append(f"published as a System One model on listener {listener.name}")
    return {name: reasons[name] for name in config.deployments if name in reasons}
