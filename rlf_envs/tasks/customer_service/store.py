"""The shop's read and write operations on one episode's sqlite file, shared by the server and the reward.

The MCP server (:mod:`rlf_envs.tasks.customer_service.server`) exposes these as tools; the task
replays an instance's gold actions with the same functions to build its goal state, so "the agent
did the right thing" is "the final database equals the goal database" (:func:`snapshot`). Rule
violations the tools enforce (cancel only pending orders, refund only delivered ones, ...) raise
:class:`StoreError` with a message the model can act on.

Example:
    >>> import sqlite3
    >>> from rlf_envs.tasks.customer_service.data import generate_shop, write_shop
    >>> import tempfile, os
    >>> path = write_shop(generate_shop(0), os.path.join(tempfile.mkdtemp(), "shop.sqlite"))
    >>> conn = connect(path)
    >>> order = next(o for o in generate_shop(0).orders if o.status == "pending")
    >>> cancel_order(conn, order.order_id, "no longer needed")["status"]
    'cancelled'
    >>> cancel_order(conn, order.order_id, "no longer needed")
    Traceback (most recent call last):
    ...
    rlf_envs.tasks.customer_service.store.StoreError: order ... is cancelled: only pending orders can be cancelled
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["CANCEL_REASONS", "OPERATIONS", "StoreError", "apply_action", "connect", "snapshot"]

CANCEL_REASONS = ("no longer needed", "ordered by mistake")
MUTABLE_TABLES = ("users", "orders", "refunds")


class StoreError(Exception):
    """A lookup found nothing, or a write broke a shop rule; the message is for the agent."""


def connect(path: str | Path, timeout_s: float = 10.0) -> sqlite3.Connection:
    """A connection to an existing episode database (writes commit per operation)."""
    if not Path(path).is_file():
        raise StoreError("this episode's database does not exist (the episode is over)")
    conn = sqlite3.connect(path, timeout=timeout_s, isolation_level=None)
    conn.row_factory = sqlite3.Row
    return conn


def _money(cents: int) -> str:
    return f"${cents / 100:.2f}"


def find_user_by_email(conn: sqlite3.Connection, email: str) -> dict[str, Any]:
    row = conn.execute("SELECT user_id FROM users WHERE email = ?", (email.strip().lower(),)).fetchone()
    if row is None:
        raise StoreError(f"no user with email {email!r}")
    return {"user_id": row["user_id"]}


def get_user(conn: sqlite3.Connection, user_id: str) -> dict[str, Any]:
    row = conn.execute("SELECT * FROM users WHERE user_id = ?", (user_id,)).fetchone()
    if row is None:
        raise StoreError(f"no user {user_id!r}")
    orders = [r["order_id"] for r in conn.execute("SELECT order_id FROM orders WHERE user_id = ? ORDER BY order_id", (user_id,))]  # fmt: skip
    return {**dict(row), "orders": orders}


def get_order(conn: sqlite3.Connection, order_id: str) -> dict[str, Any]:
    row = conn.execute("SELECT * FROM orders WHERE order_id = ?", (_order_id(order_id),)).fetchone()
    if row is None:
        raise StoreError(f"no order {order_id!r}")
    items = conn.execute(
        "SELECT p.name, i.quantity, i.price_cents FROM order_items i JOIN products p USING (product_id) "
        "WHERE i.order_id = ? ORDER BY p.name",
        (row["order_id"],),
    ).fetchall()
    total = sum(i["quantity"] * i["price_cents"] for i in items)
    return {
        "order_id": row["order_id"],
        "user_id": row["user_id"],
        "status": row["status"],
        "address": row["address"],
        "items": [
            {"name": i["name"], "quantity": i["quantity"], "price": _money(i["price_cents"])} for i in items
        ],
        "total": _money(total),
    }


def _order_id(order_id: str) -> str:
    order_id = order_id.strip()
    return order_id if order_id.startswith("#") else f"#{order_id}"


def _order_in(conn: sqlite3.Connection, order_id: str, status: str, action: str) -> dict[str, Any]:
    order = get_order(conn, order_id)
    if order["status"] != status:
        raise StoreError(
            f"order {order['order_id']} is {order['status']}: only {status} orders can be {action}"
        )
    return order


def cancel_order(conn: sqlite3.Connection, order_id: str, reason: str) -> dict[str, Any]:
    if reason not in CANCEL_REASONS:
        raise StoreError(f"reason must be one of {list(CANCEL_REASONS)}, got {reason!r}")
    order = _order_in(conn, order_id, "pending", "cancelled")
    conn.execute("UPDATE orders SET status = 'cancelled', cancel_reason = ? WHERE order_id = ?",
                 (reason, order["order_id"]))  # fmt: skip
    return get_order(conn, order["order_id"])


def change_address(conn: sqlite3.Connection, order_id: str, address: str) -> dict[str, Any]:
    if not address.strip():
        raise StoreError("the new address is empty")
    order = _order_in(conn, order_id, "pending", "changed")
    conn.execute("UPDATE orders SET address = ? WHERE order_id = ?", (address.strip(), order["order_id"]))
    return get_order(conn, order["order_id"])


def refund_order(conn: sqlite3.Connection, order_id: str) -> dict[str, Any]:
    order = _order_in(conn, order_id, "delivered", "refunded")
    total = conn.execute("SELECT SUM(quantity * price_cents) FROM order_items WHERE order_id = ?",
                         (order["order_id"],)).fetchone()[0]  # fmt: skip
    conn.execute("BEGIN IMMEDIATE")  # both rows or neither
    try:
        conn.execute("UPDATE orders SET status = 'refunded' WHERE order_id = ?", (order["order_id"],))
        conn.execute("INSERT INTO refunds VALUES (?, ?)", (order["order_id"], int(total)))
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
    return {**get_order(conn, order["order_id"]), "refunded": _money(int(total))}


OPERATIONS: dict[str, Callable[..., dict[str, Any]]] = {
    "find_user_by_email": find_user_by_email,
    "get_user": get_user,
    "get_order": get_order,
    "cancel_order": cancel_order,
    "change_address": change_address,
    "refund_order": refund_order,
}


def apply_action(conn: sqlite3.Connection, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """Run operation ``name`` with ``arguments`` (how gold actions are replayed)."""
    return OPERATIONS[name](conn, **arguments)


def snapshot(conn: sqlite3.Connection) -> dict[str, list[tuple[Any, ...]]]:
    """The rows of every table a write can change, sorted: equal snapshots are equal shop states."""
    return {
        table: sorted(tuple(row) for row in conn.execute(f"SELECT * FROM {table}"))  # noqa: S608
        for table in MUTABLE_TABLES
    }
