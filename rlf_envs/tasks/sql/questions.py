"""Natural-language questions with gold SQL: templates over the generated company, and real-data files.

Each template names the exact columns to return (column order counts in the execution match)
and says so when row order matters. Generated questions are kept only if their gold query runs,
returns an informative result (not empty, not all NULL or zero) and gives the same answer when
sqlite scans tables in reverse (``PRAGMA reverse_unordered_selects``), which rules out answers
that depend on how ties happen to be broken.

Real data (Spider / BIRD style) is a JSONL or JSON-array file of ``{"question", "sql"}`` records
(``query`` and ``SQL`` are accepted for ``sql``), all over one database; see docs/sql.md.

Example:
    >>> from rlf_envs.tasks.sql.data import generate_company
    >>> questions = template_questions(generate_company(0))
    >>> sorted({q.kind for q in questions})[:3]
    ['aggregate', 'filter', 'group_by']
"""

from __future__ import annotations

import contextlib
import json
import random
import sqlite3
import urllib.parse
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlf_envs.tasks.sql.compare import has_top_level_order_by, results_match
from rlf_envs.tasks.sql.data import PRODUCTS, REGIONS, YEARS, Company

TEST_FRACTION = 0.2  # of each template's questions (at least one when it has two) go to the test split
CHECK_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class SQLQuestion:
    """A question, its gold query and where it came from."""

    id: str
    question: str
    sql: str
    kind: str = "real"  # filter, join, aggregate, group_by, having, order_limit, nested, real
    template: str = ""
    split: str = "train"


Template = Callable[[Company, random.Random], Iterator[tuple[str, str]]]
TEMPLATES: dict[str, tuple[str, Template]] = {}


def template(kind: str) -> Callable[[Template], Template]:
    def register(fn: Template) -> Template:
        TEMPLATES[fn.__name__] = (kind, fn)
        return fn

    return register


def _q(text: str) -> str:
    """A SQL string literal."""
    return "'" + text.replace("'", "''") + "'"


def _pick(rng: random.Random, items: list[Any], k: int) -> list[Any]:
    return rng.sample(items, min(k, len(items)))


def _dept_names(c: Company) -> list[str]:
    return [d[1] for d in c.departments]


def _people(c: Company) -> list[tuple[int, str, str]]:
    return [(e[0], e[1], e[2]) for e in c.employees]


def _where_person(first: str, last: str, alias: str = "e") -> str:
    return f"{alias}.first_name = {_q(first)} AND {alias}.last_name = {_q(last)}"


EMP_DEPT = "employees AS e JOIN departments AS d ON e.department_id = d.id"
EMP_PROJECT = (
    "employees AS e JOIN assignments AS a ON a.employee_id = e.id JOIN projects AS p ON p.id = a.project_id"
)


# --- filters -----------------------------------------------------------------------------------


@template("filter")
def title_and_salary(c: Company, rng: random.Random) -> Iterator[tuple[str, str]]:
    by_title: dict[str, list[int]] = defaultdict(list)
    for e in c.employees:
        by_title[e[4]].append(e[5])
    for title, salaries in sorted(by_title.items()):
        threshold = round(sorted(salaries)[len(salaries) // 2], -3)
        yield (
            f"Which employees have the title '{title}' and a salary above {threshold}? "
            "Return their first name and last name.",
            f"SELECT first_name, last_name FROM employees WHERE title = {_q(title)} AND salary > {threshold}",
        )


@template("filter")
def hired_in_year(c: Company, rng: random.Random) -> Iterator[tuple[str, str]]:
    for year in _pick(rng, list(range(2012, 2025)), 8):
        yield (
            f"Which employees were hired in {year}? Return their first name, last name and hire date.",
            f"SELECT first_name, last_name, hire_date FROM employees "
            f"WHERE hire_date BETWEEN '{year}-01-01' AND '{year}-12-31'",
        )


@template("filter")
def projects_by_status_and_budget(c: Company, rng: random.Random) -> Iterator[tuple[str, str]]:
    for status in sorted({p[3] for p in c.projects}):
        for threshold in (100_000, 400_000):
            yield (
                f"Which projects have the status '{status}' and a budget of more than {threshold}? "
                "Return the project name and its budget.",
                f"SELECT name, budget FROM projects WHERE status = {_q(status)} AND budget > {threshold}",
            )


@template("filter")
def open_projects_of_department(c: Company, rng: random.Random) -> Iterator[tuple[str, str]]:
    for dept in _dept_names(c):
        yield (
            f"Which projects run by the {dept} department have no end date recorded? Return the project names.",
            f"SELECT p.name FROM projects AS p JOIN departments AS d ON p.department_id = d.id "
            f"WHERE d.name = {_q(dept)} AND p.end_date IS NULL",
        )


@template("filter")
def large_sales_of_product(c: Company, rng: random.Random) -> Iterator[tuple[str, str]]:
    for product in _pick(rng, list(PRODUCTS), 6):
        region = rng.choice(REGIONS)
        yield (
            f"List the sales of {product} in the {region} region worth more than 5000. "
            "Return the sale id, the customer and the amount.",
            f"SELECT id, customer, amount FROM sales "
            f"WHERE product = {_q(product)} AND region = {_q(region)} AND amount > 5000",
        )


# --- joins -------------------------------------------------------------------------------------


@template("join")
def projects_of_employee(c: Company, rng: random.Random) -> Iterator[tuple[str, str]]:
    assigned = {a[0] for a in c.assignments}
    for _, first, last in _pick(rng, [p for p in _people(c) if p[0] in assigned], 20):
        yield (
            f"Which projects is {first} {last} assigned to? Return the project names.",
            f"SELECT p.name FROM {EMP_PROJECT} WHERE {_where_person(first, last)}",
        )


@template("join")
def people_on_project_with_role(c: Company, rng: random.Random) -> Iterator[tuple[str, str]]:
    for project in _pick(rng, c.projects, 12):
        role = rng.choice(("member", "reviewer", "lead"))
        yield (
            f"Who works on {project[1]} with the role '{role}'? Return their first name and last name.",
            f"SELECT e.first_name, e.last_name FROM {EMP_PROJECT} WHERE p.name = {_q(project[1])} AND a.role = {_q(role)}",
        )


@template("join")
def department_of_employee(c: Company, rng: random.Random) -> Iterator[tuple[str, str]]:
    for _, first, last in _pick(rng, _people(c), 12):
        yield (
            f"In which department does {first} {last} work, and in which city is it located? "
            "Return the department name and the city.",
            f"SELECT d.name, d.city FROM {EMP_DEPT} WHERE {_where_person(first, last)}",
        )


@template("join")
def manager_of_employee(c: Company, rng: random.Random) -> Iterator[tuple[str, str]]:
    managed = [e for e in c.employees if e[7] is not None]
    for e in _pick(rng, managed, 15):
        yield (
            f"Who is the direct manager of {e[1]} {e[2]}? Return the manager's first name and last name.",
            f"SELECT m.first_name, m.last_name FROM employees AS e JOIN employees AS m ON e.manager_id = m.id "
            f"WHERE {_where_person(e[1], e[2])}",
        )


@template("join")
def customers_of_seller(c: Company, rng: random.Random) -> Iterator[tuple[str, str]]:
    sellers = sorted({s[1] for s in c.sales})
    names = {e[0]: (e[1], e[2]) for e in c.employees}
    for seller in _pick(rng, sellers, 12):
        first, last = names[seller]
        yield (
            f"Which customers has {first} {last} sold to? Return each customer name once.",
            f"SELECT DISTINCT s.customer FROM sales AS s JOIN employees AS e ON s.employee_id = e.id "
            f"WHERE {_where_person(first, last)}",
        )


# --- aggregates --------------------------------------------------------------------------------


@template("aggregate")
def headcount_of_department(c: Company, rng: random.Random) -> Iterator[tuple[str, str]]:
    for dept in _dept_names(c):
        yield (
            f"How many employees work in the {dept} department? Return a single number.",
            f"SELECT COUNT(*) FROM {EMP_DEPT} WHERE d.name = {_q(dept)}",
        )


@template("aggregate")
def average_salary_of_department(c: Company, rng: random.Random) -> Iterator[tuple[str, str]]:
    for dept in _dept_names(c):
        yield (
            f"What is the average salary of the employees in the {dept} department? Return a single number.",
            f"SELECT AVG(e.salary) FROM {EMP_DEPT} WHERE d.name = {_q(dept)}",
        )


@template("aggregate")
def top_salary_in_city(c: Company, rng: random.Random) -> Iterator[tuple[str, str]]:
    for city in sorted({d[2] for d in c.departments}):
        yield (
            f"What is the highest salary of any employee whose department is located in {city}? "
            "Return a single number.",
            f"SELECT MAX(e.salary) FROM {EMP_DEPT} WHERE d.city = {_q(city)}",
        )


@template("aggregate")
def hours_of_employee(c: Company, rng: random.Random) -> Iterator[tuple[str, str]]:
    assigned = {a[0] for a in c.assignments}
    for _, first, last in _pick(rng, [p for p in _people(c) if p[0] in assigned], 12):
        yield (
            f"How many hours in total has {first} {last} logged across all projects? Return a single number.",
            f"SELECT SUM(a.hours) FROM assignments AS a JOIN employees AS e ON a.employee_id = e.id "
            f"WHERE {_where_person(first, last)}",
        )


@template("aggregate")
def sales_total_of_region_year(c: Company, rng: random.Random) -> Iterator[tuple[str, str]]:
    for region in REGIONS:
        for year in YEARS:
            yield (
                f"What was the total amount of sales in the {region} region in {year}? Return a single number.",
                f"SELECT SUM(amount) FROM sales WHERE region = {_q(region)} "
                f"AND sale_date BETWEEN '{year}-01-01' AND '{year}-12-31'",
            )


@template("aggregate")
def distinct_customers_of_product(c: Company, rng: random.Random) -> Iterator[tuple[str, str]]:
    for product in PRODUCTS:
        yield (
            f"How many different customers have bought {product}? Return a single number.",
            f"SELECT COUNT(DISTINCT customer) FROM sales WHERE product = {_q(product)}",
        )


# --- group by ----------------------------------------------------------------------------------


@template("group_by")
def headcount_per_department(c: Company, rng: random.Random) -> Iterator[tuple[str, str]]:
    yield (
        "For each department, how many employees does it have? Return the department name and the number of employees.",
        "SELECT d.name, COUNT(e.id) FROM departments AS d LEFT JOIN employees AS e ON e.department_id = d.id "
        "GROUP BY d.id, d.name",
    )
    yield (
        "For each job title, what is the average salary? Return the title and the average salary.",
        "SELECT title, AVG(salary) FROM employees GROUP BY title",
    )
    yield (
        "For each project status, how many projects have it? Return the status and the number of projects.",
        "SELECT status, COUNT(*) FROM projects GROUP BY status",
    )


@template("group_by")
def titles_in_department(c: Company, rng: random.Random) -> Iterator[tuple[str, str]]:
    for dept in _dept_names(c):
        yield (
            f"For each job title in the {dept} department, how many employees hold it? "
            "Return the title and the count.",
            f"SELECT e.title, COUNT(*) FROM {EMP_DEPT} WHERE d.name = {_q(dept)} GROUP BY e.title",
        )


@template("group_by")
def sales_per_product_in_year(c: Company, rng: random.Random) -> Iterator[tuple[str, str]]:
    for year in YEARS:
        yield (
            f"For each product, what was the total sales amount in {year}? Return the product and the total amount.",
            f"SELECT product, SUM(amount) FROM sales WHERE sale_date BETWEEN '{year}-01-01' AND '{year}-12-31' "
            "GROUP BY product",
        )
    for product in PRODUCTS:
        yield (
            f"For each region, how many sales of {product} were made? Return the region and the number of sales.",
            f"SELECT region, COUNT(*) FROM sales WHERE product = {_q(product)} GROUP BY region",
        )


@template("group_by")
def hours_per_project_of_department(c: Company, rng: random.Random) -> Iterator[tuple[str, str]]:
    for dept in _dept_names(c):
        yield (
            f"For each project run by the {dept} department, how many hours have been logged on it in total? "
            "Return the project name and the total hours (leave out projects with no hours logged).",
            f"SELECT p.name, SUM(a.hours) FROM projects AS p JOIN departments AS d ON p.department_id = d.id "
            f"JOIN assignments AS a ON a.project_id = p.id WHERE d.name = {_q(dept)} GROUP BY p.id, p.name",
        )


# --- group by + having -------------------------------------------------------------------------


@template("having")
def departments_with_many_employees(c: Company, rng: random.Random) -> Iterator[tuple[str, str]]:
    sizes = sorted(Counter(e[3] for e in c.employees).values())
    for n in sorted({sizes[len(sizes) // 4], sizes[len(sizes) // 2], sizes[3 * len(sizes) // 4]}):
        yield (
            f"Which departments have more than {n} employees? Return the department names.",
            f"SELECT d.name FROM {EMP_DEPT} GROUP BY d.id, d.name HAVING COUNT(*) > {n}",
        )


@template("having")
def big_spending_customers(c: Company, rng: random.Random) -> Iterator[tuple[str, str]]:
    for threshold in (80_000, 100_000, 120_000):
        yield (
            f"Which customers have spent more than {threshold} in total across all sales? "
            "Return the customer name and the total amount spent.",
            f"SELECT customer, SUM(amount) FROM sales GROUP BY customer HAVING SUM(amount) > {threshold}",
        )
    for year in YEARS:
        yield (
            f"Which customers made at least 8 purchases in {year}? Return the customer name and the number of purchases.",
            f"SELECT customer, COUNT(*) FROM sales WHERE sale_date BETWEEN '{year}-01-01' AND '{year}-12-31' "
            "GROUP BY customer HAVING COUNT(*) >= 8",
        )


@template("having")
def busy_employees(c: Company, rng: random.Random) -> Iterator[tuple[str, str]]:
    for n in (3, 4):
        yield (
            f"Which employees are assigned to at least {n} projects? Return their first name and last name.",
            f"SELECT e.first_name, e.last_name FROM {EMP_PROJECT} GROUP BY e.id, e.first_name, e.last_name "
            f"HAVING COUNT(*) >= {n}",
        )
    for dept in _dept_names(c):
        yield (
            f"Which employees of the {dept} department have logged more than 400 hours in total on projects? "
            "Return their first name, last name and total hours.",
            f"SELECT e.first_name, e.last_name, SUM(a.hours) FROM {EMP_PROJECT} JOIN departments AS d "
            f"ON e.department_id = d.id WHERE d.name = {_q(dept)} GROUP BY e.id, e.first_name, e.last_name "
            "HAVING SUM(a.hours) > 400",
        )


@template("having")
def popular_products_in_region(c: Company, rng: random.Random) -> Iterator[tuple[str, str]]:
    for region in REGIONS:
        yield (
            f"Which products were sold more than 12 times in the {region} region? Return the product names.",
            f"SELECT product FROM sales WHERE region = {_q(region)} GROUP BY product HAVING COUNT(*) > 12",
        )


# --- order by / limit --------------------------------------------------------------------------


@template("order_limit")
def top_paid_in_department(c: Company, rng: random.Random) -> Iterator[tuple[str, str]]:
    for dept in _dept_names(c):
        k = rng.choice((3, 5))
        yield (
            f"Who are the {k} highest-paid employees of the {dept} department? "
            "Return their first name, last name and salary, highest salary first.",
            f"SELECT e.first_name, e.last_name, e.salary FROM {EMP_DEPT} WHERE d.name = {_q(dept)} "
            f"ORDER BY e.salary DESC LIMIT {k}",
        )


@template("order_limit")
def largest_sales_in_region(c: Company, rng: random.Random) -> Iterator[tuple[str, str]]:
    for region in REGIONS:
        year = rng.choice(YEARS)
        yield (
            f"What were the 3 largest sales in the {region} region in {year}? "
            "Return the customer, the product and the amount, largest amount first.",
            f"SELECT customer, product, amount FROM sales WHERE region = {_q(region)} "
            f"AND sale_date BETWEEN '{year}-01-01' AND '{year}-12-31' ORDER BY amount DESC LIMIT 3",
        )


@template("order_limit")
def projects_by_budget(c: Company, rng: random.Random) -> Iterator[tuple[str, str]]:
    for status in sorted({p[3] for p in c.projects}):
        yield (
            f"List the projects with the status '{status}' from the largest budget to the smallest. "
            "Return the project name and the budget.",
            f"SELECT name, budget FROM projects WHERE status = {_q(status)} ORDER BY budget DESC",
        )


@template("order_limit")
def earliest_hires_of_department(c: Company, rng: random.Random) -> Iterator[tuple[str, str]]:
    for dept in _dept_names(c):
        yield (
            f"Who are the 3 longest-serving employees of the {dept} department (earliest hire date)? "
            "Return their first name, last name and hire date, earliest first.",
            f"SELECT e.first_name, e.last_name, e.hire_date FROM {EMP_DEPT} WHERE d.name = {_q(dept)} "
            "ORDER BY e.hire_date ASC LIMIT 3",
        )


@template("order_limit")
def department_extremes(c: Company, rng: random.Random) -> Iterator[tuple[str, str]]:
    for word, direction in (("largest", "DESC"), ("smallest", "ASC")):
        yield (
            f"Which department has the {word} total salary bill? Return the department name and the total.",
            f"SELECT d.name, SUM(e.salary) FROM {EMP_DEPT} GROUP BY d.id, d.name ORDER BY SUM(e.salary) {direction} LIMIT 1",
        )
        yield (
            f"Which product brought in the {word} total sales amount? Return the product and the total.",
            f"SELECT product, SUM(amount) FROM sales GROUP BY product ORDER BY SUM(amount) {direction} LIMIT 1",
        )
    yield (
        "Which 5 sellers have the highest total sales amount? Return first name, last name and total, highest first.",
        "SELECT e.first_name, e.last_name, SUM(s.amount) FROM sales AS s JOIN employees AS e ON s.employee_id = e.id "
        "GROUP BY e.id, e.first_name, e.last_name ORDER BY SUM(s.amount) DESC LIMIT 5",
    )


# --- nested ------------------------------------------------------------------------------------


@template("nested")
def above_company_average(c: Company, rng: random.Random) -> Iterator[tuple[str, str]]:
    for dept in _dept_names(c):
        yield (
            f"Which employees of the {dept} department earn more than the average salary of the whole company? "
            "Return their first name and last name.",
            f"SELECT e.first_name, e.last_name FROM {EMP_DEPT} WHERE d.name = {_q(dept)} "
            "AND e.salary > (SELECT AVG(salary) FROM employees)",
        )


@template("nested")
def above_own_department_average(c: Company, rng: random.Random) -> Iterator[tuple[str, str]]:
    titles = sorted({e[4] for e in c.employees} - {"Director", "Manager"})
    for title in titles:
        yield (
            f"Which employees with the title '{title}' earn more than the average salary of their own department? "
            "Return their first name, last name and salary.",
            f"SELECT e.first_name, e.last_name, e.salary FROM employees AS e WHERE e.title = {_q(title)} "
            "AND e.salary > (SELECT AVG(o.salary) FROM employees AS o WHERE o.department_id = e.department_id)",
        )


@template("nested")
def without_project(c: Company, rng: random.Random) -> Iterator[tuple[str, str]]:
    for dept in _dept_names(c):
        yield (
            f"Which employees of the {dept} department are not assigned to any project? "
            "Return their first name and last name.",
            f"SELECT e.first_name, e.last_name FROM {EMP_DEPT} WHERE d.name = {_q(dept)} "
            "AND e.id NOT IN (SELECT employee_id FROM assignments)",
        )


@template("nested")
def report_count(c: Company, rng: random.Random) -> Iterator[tuple[str, str]]:
    managers = sorted({e[7] for e in c.employees if e[7] is not None})
    names = {e[0]: (e[1], e[2]) for e in c.employees}
    for manager in _pick(rng, managers, 12):
        first, last = names[manager]
        yield (
            f"How many employees report directly to {first} {last}? Return a single number.",
            f"SELECT COUNT(*) FROM employees WHERE manager_id = "
            f"(SELECT e.id FROM employees AS e WHERE {_where_person(first, last)})",
        )


@template("nested")
def customers_never_buying(c: Company, rng: random.Random) -> Iterator[tuple[str, str]]:
    for product in PRODUCTS:
        yield (
            f"Which customers have never bought {product}? Return each customer name once.",
            f"SELECT DISTINCT customer FROM sales WHERE customer NOT IN "
            f"(SELECT customer FROM sales WHERE product = {_q(product)})",
        )


@template("nested")
def projects_above_average_budget(c: Company, rng: random.Random) -> Iterator[tuple[str, str]]:
    for dept in _dept_names(c):
        yield (
            f"Which projects of the {dept} department have a budget above the average budget of all projects? "
            "Return the project name and budget.",
            f"SELECT p.name, p.budget FROM projects AS p JOIN departments AS d ON p.department_id = d.id "
            f"WHERE d.name = {_q(dept)} AND p.budget > (SELECT AVG(budget) FROM projects)",
        )


# --- generation, checking and splitting --------------------------------------------------------


def template_questions(company: Company) -> list[SQLQuestion]:
    """Every template's questions for ``company`` (unchecked), with seeded train/test splits.

    Within each template the questions are shuffled with the company's seed and the first
    ``TEST_FRACTION`` of them go to ``test``, so both splits cover every template with two or more.
    """
    questions: list[SQLQuestion] = []
    for name, (kind, make) in TEMPLATES.items():
        rng = random.Random(f"rlf-sql-questions-{company.seed}-{name}")
        items = list(dict.fromkeys(make(company, rng)))  # drop duplicates, keep order
        order = list(range(len(items)))
        rng.shuffle(order)
        test_count = max(1, round(len(items) * TEST_FRACTION)) if len(items) >= 2 else 0
        for rank, index in enumerate(order):
            text, sql = items[index]
            split = "test" if rank < test_count else "train"
            questions.append(SQLQuestion(f"{name}-{index}", text, sql, kind, name, split))
    return questions


def _uri(path: Path) -> str:
    return f"file:{urllib.parse.quote(str(Path(path).resolve()))}?mode=ro"


def _informative(rows: list[tuple[Any, ...]]) -> bool:
    return bool(rows) and any(v not in (None, 0, "") for row in rows for v in row)


def question_problem(connection: sqlite3.Connection, question: SQLQuestion) -> str | None:
    """Why ``question`` is unusable on this database (an error, an empty or tie-dependent answer), or None."""
    try:
        connection.execute("PRAGMA reverse_unordered_selects = OFF")
        forward = connection.execute(question.sql).fetchall()
        connection.execute("PRAGMA reverse_unordered_selects = ON")
        backward = connection.execute(question.sql).fetchall()
    except sqlite3.Error as error:
        return f"gold SQL fails: {error}"
    if not _informative(forward):
        return "gold SQL returns nothing informative"
    if not results_match(forward, backward, ordered=has_top_level_order_by(question.sql)):
        return "answer depends on how ties are broken"
    return None


def checked_questions(company: Company, db_path: str | Path) -> list[SQLQuestion]:
    """The template questions whose gold query passes :func:`question_problem` on ``db_path``.

    Example:
        >>> from rlf_envs.tasks.sql.data import ensure_database, generate_company
        >>> company = generate_company(0)
        >>> checked = checked_questions(company, ensure_database(0))
        >>> 0 < len(checked) <= len(template_questions(company))
        True
    """
    with contextlib.closing(sqlite3.connect(_uri(Path(db_path)), uri=True)) as connection:
        connection.execute("PRAGMA query_only = ON")
        return [q for q in template_questions(company) if question_problem(connection, q) is None]


# --- real data ---------------------------------------------------------------------------------

SQL_FIELDS = ("sql", "query", "SQL")


class QuestionFileError(ValueError):
    """A questions file record lacks ``question`` or a gold query; the message names file and line."""


def _records(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    text = path.read_text(encoding="utf-8")
    if text.lstrip().startswith("["):  # Spider's dev.json / BIRD's dev.json: one JSON array
        for number, record in enumerate(json.loads(text), start=1):
            yield number, record
        return
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            try:
                yield number, json.loads(line)
            except json.JSONDecodeError as error:
                raise QuestionFileError(f"{path}:{number}: invalid JSON ({error.msg})") from error


def load_question_file(path: str | Path, *, db_id: str | None = None) -> list[SQLQuestion]:
    """Questions with gold SQL from a JSONL (or JSON array) file in Spider/BIRD style.

    Each record needs ``question`` and one of ``sql`` / ``query`` / ``SQL``; optional ``id``,
    ``split`` (default ``train``; records without one are used for every split by the task) and
    ``db_id`` (with ``db_id=...`` only records of that database are kept).

    Example:
        >>> import json, os, tempfile
        >>> records = [{"question": "How many singers?", "query": "SELECT count(*) FROM singer;",
        ...             "db_id": "concert_singer"},
        ...            {"question": "How many cars?", "query": "SELECT count(*) FROM cars", "db_id": "car_1"}]
        >>> with tempfile.TemporaryDirectory() as tmp:   # a Spider-style dev.json: one JSON array
        ...     path = os.path.join(tmp, "dev.json")
        ...     with open(path, "w") as out:
        ...         json.dump(records, out)
        ...     [(q.id, q.question, q.sql) for q in load_question_file(path, db_id="concert_singer")]
        [('1', 'How many singers?', 'SELECT count(*) FROM singer')]
    """
    path = Path(path)
    questions: list[SQLQuestion] = []
    for number, record in _records(path):
        if not isinstance(record, dict):
            raise QuestionFileError(f"{path}:{number}: expected a JSON object, got {type(record).__name__}")
        if db_id is not None and record.get("db_id") != db_id:
            continue
        sql = next((record[f] for f in SQL_FIELDS if isinstance(record.get(f), str)), None)
        if not isinstance(record.get("question"), str) or sql is None:
            raise QuestionFileError(
                f"{path}:{number}: a record needs 'question' and one of {list(SQL_FIELDS)}; keys {sorted(record)}"
            )
        question_id = str(record.get("id", record.get("question_id", number)))
        split = str(record.get("split", ""))
        questions.append(SQLQuestion(question_id, record["question"], sql.strip().rstrip(";"), split=split))
    return questions
