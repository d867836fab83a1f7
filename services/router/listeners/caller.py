"""Who a request comes from, as admission sees it (router process): the API key's label (its configured
name, else a short digest: never the key), its tenant, the end user it names, and the priority class it
runs in (its key's, or the x-router-priority header where the key may set it). Read once per request,
after the key was accepted."""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from edge.api_keys import presented_key
from services.router.config import ListenerConfig
from services.router.config.admission import PRIORITY_HEADER, AdmissionConfig, KeySettings, key_label
from services.router.errors import HTTPError
from services.router.plugins.identity import user_of

_PRIORITY = PRIORITY_HEADER.encode()


@dataclass(frozen=True, slots=True)
class Caller:
    key: str  # the key's label; "-" on an open listener (everyone is one caller there)
    tenant: str  # its tenant's name, or the key's label where it has none
    user: str | None  # the end user the request names (body `user`, metadata.user_id, x-router-user)
    priority: str  # its class: one of admission.priorities
    settings: KeySettings


def caller_of(listener: ListenerConfig, admission: AdmissionConfig, headers: Iterable[tuple[bytes, bytes]],
              request: Mapping[str, Any]) -> Caller:
    """HTTPError 400 for a bad user name or an unknown class, 403 for a class the key may not choose."""
    headers = tuple(headers)
    key = presented_key(headers).decode("utf-8", "replace") if listener.api_keys else None
    settings = listener.key_settings(key)
    label = "-" if key is None else settings.name or key_label(key)
    try:
        user = user_of(dict(request), headers)
    except ValueError as exc:
        raise HTTPError(400, str(exc), param=str(exc).partition(":")[0]) from None
    priority = settings.priority or admission.default_priority
    asked = next((value for name, value in headers if name == _PRIORITY), None)
    if asked is not None:
        chosen = asked.decode("utf-8", "replace").strip()
        classes = tuple(c.name for c in admission.priorities)
        if chosen not in classes:
            raise HTTPError(400, f"{PRIORITY_HEADER}: {chosen!r} is not a priority class; one of {', '.join(classes)}",
                            param=PRIORITY_HEADER)
        if not settings.priority_header and chosen != priority:
            raise HTTPError(403, f"{PRIORITY_HEADER}: this API key may not choose its priority class (its class is "
                                 f"{priority!r}; the router's config gives a key `priority_header: true` to allow it)",
                            param=PRIORITY_HEADER)
        priority = chosen
    return Caller(label, settings.tenant or label, user, priority, settings)
