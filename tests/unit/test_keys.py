"""Named keys (edge/keys/): their rules, the store's records (hashed at rest), the rate buckets, budgets and
usage, the edge's middleware with stored keys, and `tritongate keys` with good and bad arguments."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from edge.app import create_app
from edge.keys.limits import duration, rate_headers
from edge.keys.policy import KeyPolicy, PolicyError, check_policy, digest, parse_period
from edge.keys.ring import KeyRing, Levels, Refusal
from edge.state import StoreUnavailable
from edge.state.memory import MemoryStore
from launcher.cli import main
from tritongate.settings import Settings


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def ring_with_clock() -> tuple[KeyRing, Clock]:
    store = MemoryStore()
    clock = Clock()
    store.clock = clock
    return KeyRing(store), clock


@pytest.mark.parametrize(("policy", "rule"), [
    (KeyPolicy("bad name"), "name"), (KeyPolicy("-x"), "name"), (KeyPolicy("default"), "default"),
    (KeyPolicy("a", rpm=0), "rpm"), (KeyPolicy("a", tpm=-1), "tpm"), (KeyPolicy("a", budget_period_s=60), "budget"),
    (KeyPolicy("a", priority=101), "priority"), (KeyPolicy("a", models=()), "models"),
    (KeyPolicy("a", models=("m", "")), "models"),
])
def test_a_rule_that_cannot_hold_is_refused_by_name(policy: KeyPolicy, rule: str) -> None:
    with pytest.raises(PolicyError, match=rule):
        check_policy(policy)


def test_a_store_that_loses_its_keys_does_not_open_the_gateway() -> None:
    """A restarted Valkey without persistence comes back empty: an edge that has seen stored keys keeps
    asking for one (and finds none valid) rather than letting everyone in."""
    async def run() -> None:
        ring, _ = ring_with_clock()
        key = await ring.create(KeyPolicy("team-a"))
        assert await ring.required()
        await ring.keys.delete("index")
        await ring.keys.delete("name:team-a")
        ring._any = (float("-inf"), True)  # the cached answer is older than a second in real time
        ring._cache.clear()
        assert await ring.required() and await ring.lookup(key.encode()) is None
        assert not await KeyRing(MemoryStore()).required()  # a fresh edge on an empty store: open

    asyncio.run(run())


def test_an_unreachable_store_keeps_the_last_answer_and_never_guesses_the_first() -> None:
    """Requests that need no store are still served while it is away (no keys were stored); an edge that has
    never reached it refuses (503) rather than guess."""
    async def unreachable() -> list[str]:
        raise StoreUnavailable("redis://example", "connection refused")

    async def run() -> None:
        ring, _ = ring_with_clock()
        assert not await ring.required()
        ring.names = unreachable  # type: ignore[method-assign]
        ring._any = (float("-inf"), False)
        with pytest.raises(StoreUnavailable):
            await ring.required()
        ring._any = (0.0, False)  # known, then the store went away
        assert not await ring.required()

    asyncio.run(run())


def test_budget_periods_parse_with_their_units() -> None:
    assert [parse_period(text) for text in ("30d", "12h", "90m", "3600", "2w")] == [
        30 * 86400, 12 * 3600, 90 * 60, 3600, 14 * 86400]
    for bad in ("", "0", "3x", "-1d", "1.5h"):
        with pytest.raises(PolicyError):
            parse_period(bad)


def test_a_created_key_is_kept_hashed_found_by_its_digest_and_gone_once_revoked() -> None:
    async def run() -> None:
        ring, _ = ring_with_clock()
        assert not await ring.required()
        key = await ring.create(KeyPolicy("team-a", models=("m1",), priority=5))
        assert key.startswith("tg-") and len(key) > 40
        stored = await ring.keys.get("name:team-a")
        assert stored is not None and key.encode() not in stored and digest(key.encode()).encode() in stored
        ring._any = (float("-inf"), False)  # the cached answer is older than a second in real time
        assert await ring.required()
        policy = await ring.lookup(key.encode())
        assert policy is not None and policy.name == "team-a" and policy.allows("m1") and not policy.allows("m2")
        assert await ring.lookup(b"tg-something-else") is None
        with pytest.raises(PolicyError, match="exists"):
            await ring.create(KeyPolicy("team-a"))
        await ring.revoke("team-a")
        ring._cache.clear()
        assert await ring.lookup(key.encode()) is None and await ring.by_name("team-a") is None
        with pytest.raises(PolicyError, match="revoked already"):
            await ring.revoke("team-a")
        again = await ring.create(KeyPolicy("team-a"))  # a revoked name can be given to a new key
        assert await ring.lookup(again.encode()) is not None and await ring.lookup(key.encode()) is None
        assert await ring.names() == ["team-a"]

    asyncio.run(run())


def test_requests_per_minute_drain_continuously() -> None:
    async def run() -> None:
        ring, clock = ring_with_clock()
        policy = KeyPolicy("k", rpm=2)
        first = await ring.admit(policy)
        assert isinstance(first, Levels) and first.requests_left == 1
        assert isinstance(await ring.admit(policy), Levels)
        refused = await ring.admit(policy)
        assert isinstance(refused, Refusal) and refused.kind == "requests" and refused.retry_after_s == 30
        clock.now += 30  # one request's worth drained
        assert isinstance(await ring.admit(policy), Levels)
        assert isinstance(await ring.admit(policy), Refusal)

    asyncio.run(run())


def test_tokens_per_minute_and_a_budget_count_the_usage_recorded() -> None:
    async def run() -> None:
        ring, clock = ring_with_clock()
        policy = KeyPolicy("k", tpm=100, budget=150, budget_period_s=3600)
        assert isinstance(await ring.admit(policy), Levels)
        await ring.record(policy, "m", 60, 40, 8)
        refused = await ring.admit(policy)
        assert isinstance(refused, Refusal) and refused.kind == "tokens"
        clock.now += 60  # the bucket has drained; the budget has not
        levels = await ring.admit(policy)
        assert isinstance(levels, Levels) and levels.tokens_left == 100
        await ring.record(policy, "m", 50, 0, 0)
        clock.now += 60
        budget = await ring.admit(policy)
        assert isinstance(budget, Refusal) and budget.kind == "budget" and 0 < budget.retry_after_s <= 3600
        clock.now += 3600  # a new budget period
        assert isinstance(await ring.admit(policy), Levels)
        assert await ring.usage("k") == {"m": {"requests": 2, "prompt_tokens": 110, "completion_tokens": 40,
                                               "cached_tokens": 8}}

    asyncio.run(run())


def test_the_rate_headers_are_openais() -> None:
    headers = dict(rate_headers(Levels(60, 59, 1.0, 1000, 900, 6.0)))
    assert headers == {b"x-ratelimit-limit-requests": b"60", b"x-ratelimit-remaining-requests": b"59",
                       b"x-ratelimit-reset-requests": b"1s", b"x-ratelimit-limit-tokens": b"1000",
                       b"x-ratelimit-remaining-tokens": b"900", b"x-ratelimit-reset-tokens": b"6s"}
    assert [duration(s) for s in (0.02, 1.5, 360)] == ["20ms", "1.5s", "6m0s"]


def test_the_edge_takes_stored_keys_and_refuses_revoked_ones(tmp_path: Path) -> None:
    state_url = f"sqlite://{tmp_path / 'state.sqlite3'}"
    with TestClient(create_app(Settings(state_url=state_url))) as client:
        assert client.get("/v1/no-such-route").status_code == 404  # no key anywhere: open
        ring = client.app.state.edge.keys  # type: ignore[attr-defined]
        key = client.portal.call(ring.create, KeyPolicy("team-a", rpm=1))  # type: ignore[union-attr]
        ring._any = (float("-inf"), False)
        assert client.get("/v1/no-such-route").status_code == 401
        served = client.get("/v1/no-such-route", headers={"Authorization": f"Bearer {key}"})
        assert served.status_code == 404 and served.headers["x-ratelimit-limit-requests"] == "1"
        limited = client.get("/v1/no-such-route", headers={"Authorization": f"Bearer {key}"})
        assert limited.status_code == 429 and int(limited.headers["retry-after"]) >= 1
        error = limited.json()["error"]
        assert error["code"] == "rate_limit_exceeded" and error["type"] == "requests" and key not in limited.text
        bad = client.get("/v1/no-such-route", headers={"Authorization": f"Bearer {key}",
                                                       "x-tritongate-priority": "101"})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "priority"
        client.portal.call(ring.revoke, "team-a")  # type: ignore[union-attr]
        ring._cache.clear()
        assert client.get("/v1/no-such-route", headers={"Authorization": f"Bearer {key}"}).status_code == 401


def test_a_priority_header_out_of_range_is_a_400_naming_it(tmp_path: Path) -> None:
    with TestClient(create_app(Settings(state_url="memory://"))) as client:
        for value in ("101", "-101", "high", "1.5"):
            response = client.get("/v1/models", headers={"x-tritongate-priority": value})
            assert response.status_code == 400, value
            assert response.json()["error"]["param"] == "priority"


def keys(capsys: pytest.CaptureFixture[str], state_url: str, *args: str) -> tuple[int, str, str]:
    """`tritongate keys *args` on `state_url`: exit status, stdout, stderr."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TRITONGATE_STATE_URL", state_url)
        try:
            main(["keys", *args])
            status = 0
        except SystemExit as exit_:
            status = exit_.code if isinstance(exit_.code, int) else 1
            if isinstance(exit_.code, str):
                print(exit_.code, file=__import__("sys").stderr)
    out, err = capsys.readouterr()
    return status, out, err


def test_the_keys_command_creates_lists_and_revokes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite://{tmp_path / 'state.sqlite3'}"
    status, out, _ = keys(capsys, url, "create", "team-a", "--models", "m1,m2", "--tpm", "1000", "--budget", "5000",
                          "--budget-period", "30d", "--priority", "-3", "--json")
    assert status == 0
    created = json.loads(out)
    assert created["name"] == "team-a" and created["key"].startswith("tg-")
    status, out, _ = keys(capsys, url, "list", "--json")
    (listed,) = json.loads(out)
    assert listed["models"] == ["m1", "m2"] and listed["tpm"] == 1000 and listed["budget_period_s"] == 30 * 86400
    assert listed["priority"] == -3 and not listed["revoked"] and created["key"] not in out
    status, out, _ = keys(capsys, url, "usage", "team-a", "--json")
    assert status == 0 and json.loads(out) == {"team-a": {}}
    assert keys(capsys, url, "revoke", "team-a")[0] == 0
    status, out, _ = keys(capsys, url, "list")
    assert "team-a (revoked)" in out


@pytest.mark.parametrize(("args", "message"), [
    (["create", "bad name"], "name"),
    (["create", "default"], "default"),
    (["create", "x", "--rpm", "0"], "at least 1"),
    (["create", "x", "--tpm", "many"], "whole number"),
    (["create", "x", "--priority", "200"], "priority"),
    (["create", "x", "--budget-period", "1d"], "budget"),
    (["create", "x", "--budget", "10", "--budget-period", "soon"], "budget period"),
    (["create", "x", "--models", ""], "models"),
    (["revoke", "nobody"], "no key named"),
    (["usage", "nobody"], "no key named"),
    (["rotate", "x"], "invalid choice"),
])
def test_bad_keys_arguments_are_a_clear_error_and_change_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str) -> None:
    url = f"sqlite://{tmp_path / 'state.sqlite3'}"
    status, _, err = keys(capsys, url, *args)
    assert status != 0 and message in err
    assert json.loads(keys(capsys, url, "list", "--json")[1]) == []


def test_the_keys_command_refuses_a_memory_store(capsys: pytest.CaptureFixture[str]) -> None:
    status, _, err = keys(capsys, "memory://", "create", "x")
    assert status != 0 and "memory://" in err


def _in_process(client: TestClient, key_name: str | None, path: str = "/v1/no-such-route") -> tuple[int, object]:
    """A request made inside the edge's process (as its batch runner makes them): no Authorization header,
    the key's name in the scope's extensions. Its status and the `api_key` the middleware set."""
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET", "path": path,
             "raw_path": path.encode(), "root_path": "", "scheme": "http", "query_string": b"", "headers": [],
             "client": None, "server": None, "state": {},
             "extensions": {"tritongate": {"key_name": key_name, "priority": "batch"}}}
    sent: list[dict[str, object]] = []

    async def receive() -> dict[str, object]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, object]) -> None:
        sent.append(message)

    client.portal.call(client.app, scope, receive, send)  # type: ignore[union-attr,arg-type]
    return int(sent[0]["status"]), scope["state"].get("api_key")  # type: ignore[call-overload,attr-defined]


def test_in_process_requests_carry_their_keys_name_instead_of_a_key(tmp_path: Path) -> None:
    state_url = f"sqlite://{tmp_path / 'state.sqlite3'}"
    with TestClient(create_app(Settings(state_url=state_url, api_key="configured"))) as client:
        ring = client.app.state.edge.keys  # type: ignore[attr-defined]
        client.portal.call(ring.create, KeyPolicy("team-a", models=("m1",)))  # type: ignore[union-attr]
        status, policy = _in_process(client, "team-a")
        assert status == 404 and isinstance(policy, KeyPolicy) and policy.name == "team-a"
        status, policy = _in_process(client, "default")
        assert status == 404 and isinstance(policy, KeyPolicy) and policy.models is None
        assert _in_process(client, None) == (404, None)  # a batch made while authentication was off
        assert _in_process(client, "nobody")[0] == 401
        client.portal.call(ring.revoke, "team-a")  # type: ignore[union-attr]
        ring._cache.clear()
        assert _in_process(client, "team-a")[0] == 401
        # Over the network the extension cannot be sent: a request without a key is refused.
        assert client.get("/v1/no-such-route").status_code == 401
