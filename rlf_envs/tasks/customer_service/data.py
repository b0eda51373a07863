"""The generated shop behind ``RLF/CustomerService-v0``: users, products and orders, from a seed.

Everything is embedded (no download) and deterministic: :func:`generate_shop` builds the same
:class:`Shop` for a seed on every machine, and :func:`write_shop` writes it as a sqlite file, the
template each episode's private copy starts from. Money is in integer cents.

Example:
    >>> shop = generate_shop(0)
    >>> len(shop.users), len(shop.products), shop.orders[0].order_id
    (30, 12, '#W1000')
    >>> generate_shop(0) == shop
    True
"""

from __future__ import annotations

import random
import sqlite3
from dataclasses import dataclass
from pathlib import Path

__all__ = ["SCHEMA", "STATUSES", "Order", "Product", "Shop", "User", "generate_shop", "write_shop"]

FIRST = ("Ann", "Bo", "Chen", "Dara", "Eli", "Fay", "Gus", "Hana", "Ivo", "Jun", "Kai", "Lena",
         "Mo", "Nia", "Omar", "Pia", "Quinn", "Rosa", "Sam", "Tara")  # fmt: skip
LAST = ("Alder", "Brook", "Castell", "Dunmore", "Ellery", "Fenwick", "Garrow", "Holt", "Ingram",
        "Jessop", "Kerrow", "Lusk")  # fmt: skip
STREETS = ("Oak Street", "Mill Lane", "Harbour Road", "Station Avenue", "Elm Court", "River Walk",
           "King Street", "Market Square")  # fmt: skip
CITIES = (("Velmora", "10115"), ("Zorvia", "20220"), ("Eastbrook", "30330"), ("Northam", "40440"))
PRODUCTS = (("Desk lamp", 2499), ("Water bottle", 1299), ("Backpack", 5999), ("Headphones", 8950),
            ("Notebook set", 899), ("Coffee mug", 1150), ("Phone case", 1999), ("Wool scarf", 3400),
            ("Running shoes", 7900), ("Board game", 3250), ("Tea kettle", 4575), ("Yoga mat", 2800))  # fmt: skip
STATUSES = ("pending", "processing", "delivered", "cancelled", "refunded")

SCHEMA = """
CREATE TABLE users (user_id TEXT PRIMARY KEY, name TEXT NOT NULL, email TEXT NOT NULL UNIQUE,
                    zip TEXT NOT NULL, address TEXT NOT NULL);
CREATE TABLE products (product_id TEXT PRIMARY KEY, name TEXT NOT NULL, price_cents INTEGER NOT NULL);
CREATE TABLE orders (order_id TEXT PRIMARY KEY, user_id TEXT NOT NULL REFERENCES users(user_id),
                     status TEXT NOT NULL, address TEXT NOT NULL, cancel_reason TEXT);
CREATE TABLE order_items (order_id TEXT NOT NULL REFERENCES orders(order_id),
                          product_id TEXT NOT NULL REFERENCES products(product_id),
                          quantity INTEGER NOT NULL, price_cents INTEGER NOT NULL);
CREATE TABLE refunds (order_id TEXT PRIMARY KEY REFERENCES orders(order_id),
                      amount_cents INTEGER NOT NULL);
"""


@dataclass(frozen=True)
class User:
    user_id: str
    name: str
    email: str
    zip: str
    address: str


@dataclass(frozen=True)
class Product:
    product_id: str
    name: str
    price_cents: int


@dataclass(frozen=True)
class Order:
    order_id: str
    user_id: str
    status: str
    address: str
    items: tuple[tuple[str, int], ...]  # (product_id, quantity)


@dataclass(frozen=True)
class Shop:
    users: tuple[User, ...]
    products: tuple[Product, ...]
    orders: tuple[Order, ...]

    def price(self, product_id: str) -> int:
        return next(p.price_cents for p in self.products if p.product_id == product_id)

    def total_cents(self, order: Order) -> int:
        """What an order costs: the sum of its items' prices times quantities."""
        return sum(self.price(pid) * qty for pid, qty in order.items)


def _address(rng: random.Random) -> tuple[str, str]:
    city, zip_code = rng.choice(CITIES)
    return f"{rng.randint(1, 99)} {rng.choice(STREETS)}, {city} {zip_code}", zip_code


def generate_shop(seed: int = 0, *, num_users: int = 30) -> Shop:
    """A shop of ``num_users`` users with 2-3 orders each (every user has a pending and a delivered one)."""
    rng = random.Random(seed)
    products = tuple(Product(f"P{k:02d}", name, price) for k, (name, price) in enumerate(PRODUCTS))
    users, orders = [], []
    names = [(f, la) for f in FIRST for la in LAST]
    rng.shuffle(names)
    for k in range(num_users):
        first, last = names[k]
        address, zip_code = _address(rng)
        user_id = f"{first.lower()}_{last.lower()}_{k}"
        users.append(
            User(user_id, f"{first} {last}", f"{first}.{last}{k}@example.com".lower(), zip_code, address)
        )
        statuses = [
            "pending",
            "delivered",
            *rng.sample(["processing", "cancelled", "delivered"], rng.randint(0, 1)),
        ]
        rng.shuffle(statuses)
        for status in statuses:
            picks = rng.sample(products, rng.randint(1, 3))
            items = tuple((p.product_id, rng.randint(1, 2)) for p in picks)
            orders.append(Order(f"#W{1000 + len(orders)}", user_id, status, address, items))
    return Shop(tuple(users), products, tuple(orders))


def write_shop(shop: Shop, path: str | Path) -> Path:
    """Write ``shop`` as a fresh sqlite file at ``path`` (replacing any file there)."""
    path = Path(path)
    path.unlink(missing_ok=True)
    with sqlite3.connect(path) as conn:
        conn.executescript(SCHEMA)
        conn.executemany("INSERT INTO users VALUES (?, ?, ?, ?, ?)",
                         [(u.user_id, u.name, u.email, u.zip, u.address) for u in shop.users])  # fmt: skip
        conn.executemany("INSERT INTO products VALUES (?, ?, ?)",
                         [(p.product_id, p.name, p.price_cents) for p in shop.products])  # fmt: skip
        conn.executemany("INSERT INTO orders VALUES (?, ?, ?, ?, NULL)",
                         [(o.order_id, o.user_id, o.status, o.address) for o in shop.orders])  # fmt: skip
        conn.executemany(
            "INSERT INTO order_items VALUES (?, ?, ?, ?)",
            [(o.order_id, pid, qty, shop.price(pid)) for o in shop.orders for pid, qty in o.items],
        )
    conn.close()
    return path
