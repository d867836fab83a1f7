"""Which deployments the config uses, and why: the model runtime starts workers for these only (pure
rule routing starts none). Run once by the router process at start."""
from __future__ import annotations

from services.router.config import RouterConfig


def used_deployments(config: RouterConfig) -> dict[str, list[str]]:
    """Deployment name -> the reasons it is used ("signal entries.auto.signals[1] (topic)"), in the
    config's deployment order; a deployment nothing uses is absent.

    Users are the signals that name a deployment (their `deployment` key). Plugins and published
    models that need a decision model are users too once they exist: they add their reasons here."""
    reasons: dict[str, list[str]] = {}
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
    return {name: reasons[name] for name in config.deployments if name in reasons}
