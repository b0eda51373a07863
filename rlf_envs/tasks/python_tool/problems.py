"""Generated math problems with integer answers and numbers too large for reliable mental arithmetic.

Two kinds: ``arithmetic`` chains such as ``(48,213 × 379 − 1,204,557) ÷ 7 + 99,841`` (every division
exact) and ``word`` problems from templates (a warehouse's cans, compound growth, digit sums,
divisibility counts, ...). Every problem carries a Python program that prints its answer, which
tests use as an oracle and which shows what a good tool call looks like.

Generation is deterministic: the same ``(seed, kind)`` always gives the same problems, and the test
split is generated first, so it does not change with the size of the train split.

Example:
    >>> problems = generate_problems(seed=0, kind="arithmetic", count=2)
    >>> [type(p.answer) for p in problems]
    [<class 'int'>, <class 'int'>]
    >>> problems == generate_problems(seed=0, kind="arithmetic", count=2)
    True
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass

KINDS = ("arithmetic", "word", "mixed")


@dataclass(frozen=True)
class Problem:
    """A question, its integer answer and a Python program that prints the answer."""

    question: str
    answer: int
    solution_code: str
    template: str


# --- arithmetic chains -------------------------------------------------------------------------

_PRECEDENCE = {"+": 1, "-": 1, "*": 2, "//": 2}
_SYMBOL = {"+": "+", "-": "−", "*": "×", "//": "÷"}


def arithmetic_chain(rng: random.Random) -> Problem:
    """A left-to-right chain of 3-5 operations on 3-6 digit numbers, with at least one product.

    Parentheses appear only where precedence needs them, so the text reads like a textbook
    exercise and the Python program is the same expression.
    """
    value = rng.randint(10_000, 99_999)
    text, code, top = f"{value:,}", str(value), 3  # 3: a bare number binds tighter than any operator
    operations = ["*", *rng.choices(["+", "-", "*", "//"], k=rng.randint(2, 4))]
    rng.shuffle(operations)
    for op in operations:
        operand = _operand(rng, op, value)
        if operand is None:  # no small exact divisor, or too little left to subtract: add instead
            op, operand = "+", rng.randint(1_000, 999_999)
        if _PRECEDENCE[op] > top:
            text, code = f"({text})", f"({code})"
        text, code = f"{text} {_SYMBOL[op]} {operand:,}", f"{code} {op} {operand}"
        value = _apply(op, value, operand)
        top = _PRECEDENCE[op]
    return Problem(
        question=f"Compute {text}. Give the exact integer value.",
        answer=value,
        solution_code=f"print({code})",
        template="chain",
    )


def _operand(rng: random.Random, op: str, value: int) -> int | None:
    if op == "+":
        return rng.randint(1_000, 999_999)
    if op == "-":
        return rng.randint(1_000, min(999_999, value - 1)) if value > 2_000 else None
    if op == "*":
        return rng.randint(12, 9_999)
    divisors = [d for d in range(3, 100) if value % d == 0]
    return rng.choice(divisors) if divisors else None


def _apply(op: str, value: int, operand: int) -> int:
    if op == "+":
        return value + operand
    if op == "-":
        return value - operand
    if op == "*":
        return value * operand
    return value // operand


# --- word problems -----------------------------------------------------------------------------


def warehouse(rng: random.Random) -> Problem:
    boxes, per_box, trucks = rng.randint(10_000, 99_999), rng.randint(12, 96), rng.randint(7, 97)
    total = boxes * per_box
    per_truck = rng.randint(total * 3 // (10 * trucks), total * 9 // (10 * trucks))
    shipped = total - trucks * per_truck
    return Problem(
        question=(
            f"A warehouse holds {boxes:,} boxes with {per_box} cans in each box. After {shipped:,} cans "
            f"are shipped out, the remaining cans are split equally among {trucks} trucks. "
            "How many cans does each truck carry?"
        ),
        answer=per_truck,
        solution_code=f"print(({boxes} * {per_box} - {shipped}) // {trucks})",
        template="warehouse",
    )


def factory(rng: random.Random) -> Problem:
    per = rng.choice([40, 50, 80, 125, 200, 250])
    daily, days = per * rng.randint(40, 400), rng.randint(13, 59)
    defective, box = rng.randint(1, 7), rng.randint(24, 144)
    total = daily * days
    good = total - total // per * defective
    return Problem(
        question=(
            f"A factory makes {daily:,} bolts a day for {days} days. {defective} out of every {per} bolts "
            f"are defective and thrown away. The good bolts are packed in boxes of {box}. "
            "How many boxes can be filled completely?"
        ),
        answer=good // box,
        solution_code=(
            f"total = {daily} * {days}\ngood = total - total // {per} * {defective}\nprint(good // {box})"
        ),
        template="factory",
    )


def savings(rng: random.Random) -> Problem:
    start, step, months = rng.randint(120, 2_500), rng.randint(7, 95), rng.randint(25, 120)
    return Problem(
        question=(
            f"Maria saves ${start:,} in the first month, and every month after that she saves ${step} "
            f"more than in the month before. How many dollars has she saved in total after {months} months?"
        ),
        answer=sum(start + step * month for month in range(months)),
        solution_code=f"print(sum({start} + {step} * month for month in range({months})))",
        template="savings",
    )


def divisible_count(rng: random.Random) -> Problem:
    limit = rng.randint(100_000, 400_000)
    a, b = rng.sample([7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43], 2)
    answer = limit // a + limit // b - limit // math.lcm(a, b)
    return Problem(
        question=f"How many integers from 1 to {limit:,} (inclusive) are divisible by {a} or by {b}?",
        answer=answer,
        solution_code=f"print(sum(1 for k in range(1, {limit} + 1) if k % {a} == 0 or k % {b} == 0))",
        template="divisible_count",
    )


def power_remainder(rng: random.Random) -> Problem:
    base, exponent, modulus = rng.randint(13, 997), rng.randint(101, 9_999), rng.randint(1_000, 99_999)
    return Problem(
        question=f"What is the remainder when {base}^{exponent:,} is divided by {modulus:,}?",
        answer=pow(base, exponent, modulus),
        solution_code=f"print(pow({base}, {exponent}, {modulus}))",
        template="power_remainder",
    )


def stadium(rng: random.Random) -> Problem:
    sections, rows, seats = rng.randint(12, 48), rng.randint(18, 60), rng.randint(16, 44)
    price = rng.randint(17, 149)
    capacity = sections * rows * seats
    unsold = rng.randint(capacity // 20, capacity // 3)
    return Problem(
        question=(
            f"A stadium has {sections} sections, each with {rows} rows of {seats} seats. Tickets cost "
            f"${price} each. If {unsold:,} seats stay unsold, how many dollars do the ticket sales bring in?"
        ),
        answer=(capacity - unsold) * price,
        solution_code=f"print(({sections} * {rows} * {seats} - {unsold}) * {price})",
        template="stadium",
    )


def digit_sum(rng: random.Random) -> Problem:
    a, b = rng.randint(100_000, 9_999_999), rng.randint(10_000, 999_999)
    return Problem(
        question=f"What is the sum of the digits of {a:,} × {b:,}?",
        answer=sum(int(digit) for digit in str(a * b)),
        solution_code=f"print(sum(int(digit) for digit in str({a} * {b})))",
        template="digit_sum",
    )


def population(rng: random.Random) -> Problem:
    people, percent, years = rng.randint(20_000, 900_000), rng.randint(2, 9), rng.randint(6, 25)
    value = people
    for _ in range(years):
        value = value * (100 + percent) // 100
    return Problem(
        question=(
            f"A town has {people:,} people. Every year its population grows by {percent}%, rounded down to "
            f"a whole number of people. How many people live there after {years} years?"
        ),
        answer=value,
        solution_code=(
            f"people = {people}\nfor year in range({years}):\n"
            f"    people = people * (100 + {percent}) // 100\nprint(people)"
        ),
        template="population",
    )


WORD_TEMPLATES: tuple[Callable[[random.Random], Problem], ...] = (
    warehouse,
    factory,
    savings,
    divisible_count,
    power_remainder,
    stadium,
    digit_sum,
    population,
)


def generate_problems(seed: int, kind: str, count: int) -> list[Problem]:
    """``count`` distinct problems of ``kind`` ("arithmetic", "word" or "mixed"), the same for the same seed."""
    if kind not in KINDS:
        raise ValueError(f"unknown problem kind {kind!r}; known: {list(KINDS)}")
    rng = random.Random(f"rlf-python-tool:{seed}:{kind}")
    problems: list[Problem] = []
    seen: set[str] = set()
    while len(problems) < count:
        use_chain = kind == "arithmetic" or (kind == "mixed" and len(problems) % 2 == 0)
        problem = arithmetic_chain(rng) if use_chain else rng.choice(WORD_TEMPLATES)(rng)
        if problem.question not in seen:
            seen.add(problem.question)
            problems.append(problem)
    return problems
