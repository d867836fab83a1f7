"""Who a request comes from (listeners/caller.py): key label and tenant from the key's settings, the user
it names, its priority class from the key or the x-router-priority header, and the refusals of a bad one."""
from __future__ import annotations

import pytest

from services.router.config import ListenerConfig
from services.router.config.admission import AdmissionConfig, KeySettings, PriorityClass, key_label
from services.router.errors import HTTPError
from services.router.listeners.caller import caller_of

ADMISSION = AdmissionConfig((PriorityClass("interactive"), PriorityClass("standard"), PriorityClass("batch")))
LISTENER = ListenerConfig("l", 8080, api_keys=("k-a", "k-b", "k-c"), keys={
    "k-a": KeySettings(name="team-a", tenant="alpha", priority="interactive", priority_header=True),
    "k-b": KeySettings(priority="batch")})


def _headers(key: str | None, **extra: str) -> list[tuple[bytes, bytes]]:
    headers = [(b"authorization", f"Bearer {key}".encode())] if key else []
    return headers + [(name.replace("_", "-").encode(), value.encode()) for name, value in extra.items()]


def test_a_configured_key_is_named_by_its_settings() -> None:
    caller = caller_of(LISTENER, ADMISSION, _headers("k-a"), {"user": "ann"})
    assert (caller.key, caller.tenant, caller.user, caller.priority) == ("team-a", "alpha", "ann", "interactive")


def test_an_unnamed_key_is_its_own_tenant_under_a_digest_and_the_default_class() -> None:
    caller = caller_of(LISTENER, ADMISSION, _headers("k-c", x_router_user="bob"), {})
    assert caller.key == caller.tenant == key_label("k-c") and "k-c" not in caller.key
    assert caller.user == "bob" and caller.priority == "standard"


def test_an_open_listener_is_one_caller() -> None:
    caller = caller_of(ListenerConfig("open", 8080), ADMISSION, [], {"metadata": {"user_id": "u1"}})
    assert (caller.key, caller.tenant, caller.user, caller.priority) == ("-", "-", "u1", "standard")


def test_a_key_allowed_to_may_choose_its_class_per_request() -> None:
    caller = caller_of(LISTENER, ADMISSION, _headers("k-a", x_router_priority="batch"), {})
    assert caller.priority == "batch"


def test_a_key_not_allowed_may_only_name_its_own_class() -> None:
    assert caller_of(LISTENER, ADMISSION, _headers("k-b", x_router_priority="batch"), {}).priority == "batch"
    with pytest.raises(HTTPError) as info:
        caller_of(LISTENER, ADMISSION, _headers("k-b", x_router_priority="interactive"), {})
    assert info.value.status == 403 and info.value.param == "x-router-priority"
    assert "may not choose its priority class (its class is 'batch'" in info.value.message


def test_an_unknown_class_is_a_400_listing_the_classes() -> None:
    with pytest.raises(HTTPError) as info:
        caller_of(LISTENER, ADMISSION, _headers("k-a", x_router_priority="urgent"), {})
    assert info.value.status == 400 and info.value.param == "x-router-priority"
    assert info.value.message == ("x-router-priority: 'urgent' is not a priority class; one of interactive, "
                                  "standard, batch")


def test_a_bad_user_is_a_400_naming_its_field() -> None:
    with pytest.raises(HTTPError) as info:
        caller_of(LISTENER, ADMISSION, _headers("k-a"), {"user": "x" * 300})
    assert info.value.status == 400 and info.value.param == "user"
