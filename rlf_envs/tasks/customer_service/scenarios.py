"""The users' hidden goals: one scenario per shop user, with its gold actions and the user's persona.

Each :class:`Scenario` is what one simulated customer wants (cancel a pending order, change its
address, get a refund for a delivered order, learn an order's total, or cancel an order that can
no longer be cancelled), the facts the customer can tell when asked, the instructions an LLM user
simulator plays, and the gold write actions whose result is the goal database state. A fixed
share of users is the test split.

Example:
    >>> from rlf_envs.tasks.customer_service.data import generate_shop
    >>> scenarios = make_scenarios(generate_shop(0))
    >>> [s.kind for s in scenarios[:5]]
    ['cancel', 'address', 'refund', 'total', 'refuse_cancel']
    >>> scenarios[0].gold_actions[0][0], sorted({s.split for s in scenarios})
    ('cancel_order', ['test', 'train'])
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from rlf_envs.tasks.customer_service.data import CITIES, STREETS, Order, Shop, User
from rlf_envs.tasks.customer_service.store import CANCEL_REASONS

__all__ = ["KINDS", "Scenario", "make_scenarios"]

KINDS = ("cancel", "address", "refund", "total", "refuse_cancel")
TEST_EVERY = 6  # every 6th user is a test scenario

OPENINGS = {
    "cancel": "Hi, I would like to cancel one of my orders.",
    "address": "Hello, I need to change the shipping address of an order.",
    "refund": "Hi, I received an order and I would like a refund for it.",
    "total": "Hi, can you tell me how much one of my orders cost in total?",
    "refuse_cancel": "Hello, please cancel my order.",
}
GOALS = {
    "cancel": "You want to cancel your order {order_id}. If asked for a reason, say: {reason}.",
    "address": "You want the shipping address of your order {order_id} changed to: {address}.",
    "refund": "You want a refund for your delivered order {order_id}.",
    "total": "You want to know the total price of your order {order_id}.",
    "refuse_cancel": "You want to cancel your order {order_id}, which was already delivered. If the "
    "agent says it cannot be cancelled, accept that and do not ask for anything else.",
}


@dataclass(frozen=True)
class Scenario:
    """One customer's goal. ``gold_actions``: ``(operation, arguments)`` pairs of the correct writes."""

    id: str
    kind: str
    split: str
    opening: str
    persona: str
    instructions: str
    facts: dict[str, str]
    gold_actions: tuple[tuple[str, dict[str, Any]], ...]
    required_outputs: tuple[str, ...] = field(default=())


def _order(shop: Shop, user: User, status: str) -> Order:
    return next(o for o in shop.orders if o.user_id == user.user_id and o.status == status)


def _scenario(shop: Shop, k: int, user: User, rng: random.Random) -> Scenario:
    kind = KINDS[k % len(KINDS)]
    order = _order(shop, user, "pending" if kind in ("cancel", "address") else "delivered")
    facts = {"name": user.name, "email": user.email, "order_id": order.order_id}
    gold: tuple[tuple[str, dict[str, Any]], ...] = ()
    required: tuple[str, ...] = ()
    if kind == "cancel":
        facts["reason"] = rng.choice(CANCEL_REASONS)
        gold = (("cancel_order", {"order_id": order.order_id, "reason": facts["reason"]}),)
    elif kind == "address":
        city, zip_code = rng.choice(CITIES)
        facts["address"] = f"{rng.randint(100, 199)} {rng.choice(STREETS)}, {city} {zip_code}"
        gold = (("change_address", {"order_id": order.order_id, "address": facts["address"]}),)
    elif kind == "refund":
        gold = (("refund_order", {"order_id": order.order_id}),)
    elif kind == "total":
        required = (f"${shop.total_cents(order) / 100:.2f}",)
    persona = (
        f"You are {user.name}, a customer of the shop. Your email is {user.email}. You are polite "
        "and brief, and you answer the agent's questions with the facts below only when asked."
    )
    instructions = GOALS[kind].format(**facts)
    return Scenario(
        id=f"cs{k:03d}",
        kind=kind,
        split="test" if k % TEST_EVERY == TEST_EVERY - 1 else "train",
        opening=OPENINGS[kind],
        persona=persona,
        instructions=instructions,
        facts=facts,
        gold_actions=gold,
        required_outputs=required,
    )


def make_scenarios(shop: Shop, seed: int = 0) -> list[Scenario]:
    """One scenario per user of ``shop``, kinds in turn, deterministic for ``seed``."""
    rng = random.Random(seed + 7919)
    return [_scenario(shop, k, user, rng) for k, user in enumerate(shop.users)]
