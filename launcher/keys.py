"""`tritongate keys create|list|revoke|usage`: the named keys in the shared state store
(TRITONGATE_STATE_URL, the edges' own), which every edge reads. A key is printed once, at creation; the
store keeps only its SHA-256 digest. A bad argument changes nothing and exits with a message."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any

from edge.keys.policy import KeyPolicy, PolicyError, check_policy, parse_period
from edge.keys.ring import USAGE_FIELDS, KeyRing
from edge.state import StateUrlError, StoreUnavailable, open_store


def _positive(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"{value} must be at least 1")
    return number


def _integer(value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number") from None


def add_arguments(keys: argparse.ArgumentParser) -> None:
    actions = keys.add_subparsers(dest="keys_command", required=True, metavar="ACTION")
    create = actions.add_parser("create", help="create a named key with its rules; the key is printed once")
    create.add_argument("name", help="the key's name (letters, digits, . _ -), which usage and metrics show")
    create.add_argument("--models", help="the model ids the key may use, separated by commas (default: every "
                        "model); others answer 404 as unknown models do")
    create.add_argument("--rpm", type=_positive, help="requests per minute")
    create.add_argument("--tpm", type=_positive, help="tokens per minute (prompt + completion)")
    create.add_argument("--budget", type=_positive, help="tokens in all, or per --budget-period")
    create.add_argument("--budget-period", help="the budget starts again each period: e.g. 30d, 12h, 90m, 3600")
    create.add_argument("--priority", type=_integer, default=0,
                        help="the default priority of its requests, -100 to 100, lower first (default 0)")
    listing = actions.add_parser("list", help="the keys and their rules (never the keys themselves)")
    revoke = actions.add_parser("revoke", help="revoke a key: every edge refuses it within a second")
    revoke.add_argument("name")
    usage = actions.add_parser("usage", help="requests and tokens by key and model")
    usage.add_argument("name", nargs="?", help="one key (default: every key)")
    for command in (create, listing, usage):
        command.add_argument("--json", action="store_true", help="print JSON")


def _policy(args: argparse.Namespace) -> KeyPolicy:
    models = None
    if args.models is not None:
        models = tuple(model.strip() for model in args.models.split(","))
    period = parse_period(args.budget_period) if args.budget_period is not None else None
    return check_policy(KeyPolicy(args.name, models, args.rpm, args.tpm, args.budget, period, args.priority))


def _rules(policy: KeyPolicy) -> dict[str, Any]:
    rules = {name: value for name, value in asdict(policy).items() if name != "digest"}
    rules["models"] = list(policy.models) if policy.models is not None else None
    rules["created"] = datetime.fromtimestamp(policy.created, UTC).isoformat(timespec="seconds")
    return rules


async def _create(ring: KeyRing, args: argparse.Namespace) -> None:
    policy = _policy(args)
    key = await ring.create(policy)
    if args.json:
        print(json.dumps({"name": policy.name, "key": key}))
    else:
        print(key)
        print(f"# the key {policy.name!r}: shown this once, keep it now", file=sys.stderr)


async def _list(ring: KeyRing, args: argparse.Namespace) -> None:
    policies = [policy for name in await ring.names() if (policy := await ring.policy(name)) is not None]
    if args.json:
        print(json.dumps([_rules(policy) for policy in policies]))
        return
    for policy in policies:
        rules = _rules(policy)
        shown = " ".join(f"{name}={','.join(value) if isinstance(value, list) else value}"
                         for name, value in rules.items() if name != "name" and value not in (None, False))
        print(f"{policy.name}{' (revoked)' if policy.revoked else ''}  {shown}")


async def _revoke(ring: KeyRing, args: argparse.Namespace) -> None:
    await ring.revoke(args.name)
    print(f"revoked {args.name!r}")


async def _usage(ring: KeyRing, args: argparse.Namespace) -> None:
    if args.name is not None and await ring.policy(args.name) is None:
        raise PolicyError(f"no key named {args.name!r}")
    names = [args.name] if args.name is not None else await ring.names()
    usage = {name: await ring.usage(name) for name in names}
    if args.json:
        print(json.dumps(usage))
        return
    print("key\tmodel\t" + "\t".join(USAGE_FIELDS))
    for name, models in usage.items():
        for model, counts in sorted(models.items()):
            print(f"{name}\t{model}\t" + "\t".join(str(counts[field]) for field in USAGE_FIELDS))


ACTIONS: dict[str, Callable[[KeyRing, argparse.Namespace], Awaitable[None]]] = {
    "create": _create, "list": _list, "revoke": _revoke, "usage": _usage}


def run_keys(args: argparse.Namespace, state_url: str) -> None:
    if state_url.startswith("memory:"):
        sys.exit(f"tritongate keys {args.keys_command}: error: TRITONGATE_STATE_URL=memory:// is each edge's own "
                 "memory, which this command cannot reach; use the edges' sqlite:// or redis:// store")

    async def run() -> None:
        store = open_store(state_url)
        try:
            await ACTIONS[args.keys_command](KeyRing(store), args)
        finally:
            await store.close()

    try:
        asyncio.run(run())
    except (PolicyError, StateUrlError, StoreUnavailable) as exc:
        sys.exit(f"tritongate keys {args.keys_command}: error: {exc}")
