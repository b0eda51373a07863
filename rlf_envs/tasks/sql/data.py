"""The generated company database: rows deterministic from a seed, written once to a cached sqlite file.

Five tables with a few hundred rows of fictional people and firms: ``departments``, ``employees``
(with a ``manager_id`` self reference), ``projects``, ``assignments`` (employee x project) and
``sales``. Values are chosen so that template questions have one unambiguous answer: salaries and
project budgets are distinct, full names are unique, some employees have no project and some
projects have no end date (NULL).

The file lives at ``$RLF_CACHE_DIR/sql/seed{N}.sqlite`` (default ``~/.cache/rlf``). Its
``PRAGMA user_version`` holds a fingerprint of the generated rows, so a changed generator rebuilds
it; builds go to a temporary file that is renamed into place, so concurrent builders are safe.

Example:
    >>> company = generate_company(0)
    >>> len(company.employees) > 100, len(company.departments)
    (True, 8)
    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as cache:   # default: $RLF_CACHE_DIR or ~/.cache/rlf
    ...     ensure_database(seed=0, cache_dir=cache).relative_to(cache).as_posix()
    'sql/seed0.sqlite'
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import os
import random
import sqlite3
import tempfile
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

Row = tuple[Any, ...]

SCHEMA = """\
CREATE TABLE departments (
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL UNIQUE,
    city TEXT NOT NULL,
    budget INTEGER NOT NULL
);
CREATE TABLE employees (
    id INTEGER PRIMARY KEY,
    first_name TEXT NOT NULL,
    last_name TEXT NOT NULL,
    department_id INTEGER NOT NULL REFERENCES departments(id),
    title TEXT NOT NULL,
    salary INTEGER NOT NULL,
    hire_date TEXT NOT NULL,
    manager_id INTEGER REFERENCES employees(id)
);
CREATE TABLE projects (
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL UNIQUE,
    department_id INTEGER NOT NULL REFERENCES departments(id),
    status TEXT NOT NULL,
    budget INTEGER NOT NULL,
    start_date TEXT NOT NULL,
    end_date TEXT
);
CREATE TABLE assignments (
    employee_id INTEGER NOT NULL REFERENCES employees(id),
    project_id INTEGER NOT NULL REFERENCES projects(id),
    role TEXT NOT NULL,
    hours INTEGER NOT NULL,
    PRIMARY KEY (employee_id, project_id)
);
CREATE TABLE sales (
    id INTEGER PRIMARY KEY,
    employee_id INTEGER NOT NULL REFERENCES employees(id),
    customer TEXT NOT NULL,
    region TEXT NOT NULL,
    product TEXT NOT NULL,
    amount REAL NOT NULL,
    sale_date TEXT NOT NULL
);
"""

DEPARTMENTS = ("Research", "Engineering", "Sales", "Marketing", "Finance", "Operations", "Support", "Legal")
CITIES = ("Norhaven", "Estmoor", "Calder Bay", "Vellport", "Ashfield", "Brightwater")
FIRST_NAMES = (
    "Alia", "Bram", "Cosima", "Dario", "Elin", "Farid", "Greta", "Hollis", "Ines", "Jory", "Kalla", "Lucan",
    "Mirela", "Nesta", "Orrin", "Petra", "Quill", "Rosalind", "Soren", "Talia", "Ulric", "Vesna", "Wren",
    "Xander", "Yara", "Zeno", "Amara", "Birgit", "Cassian", "Delphine", "Emrys", "Fenna", "Gideon", "Hesper",
)  # fmt: skip
LAST_NAMES = (
    "Arkwell", "Brannick", "Corvane", "Dunmore", "Elderby", "Falkrest", "Garrow", "Hethersett", "Ivensworth",
    "Jessop", "Kestrel", "Lorimer", "Marchbank", "Nettleford", "Oakhurst", "Pellow", "Quarrington", "Rowntree",
    "Stavely", "Thistlewood", "Underhill", "Vantreight", "Whitlock", "Yarrowby", "Zellweger", "Ambrose",
)  # fmt: skip
STAFF_TITLES = ("Engineer", "Senior Engineer", "Analyst", "Specialist", "Coordinator", "Associate")
SALES_TITLES = ("Sales Representative", "Senior Sales Representative", "Account Manager")
PROJECT_CODENAMES = (
    "Aurora", "Basalt", "Cobalt", "Driftwood", "Ember", "Fjord", "Granite", "Harbor", "Indigo", "Juniper",
    "Kestrel", "Lantern", "Meridian", "Nimbus", "Obsidian", "Prism", "Quartz", "Riverbend", "Sable", "Tundra",
    "Umber", "Vortex", "Willow", "Zephyr", "Atlas", "Beacon", "Cinder", "Dune", "Echo", "Falcon",
)  # fmt: skip
PROJECT_STATUSES = ("planned", "active", "completed", "cancelled")
ROLES = ("lead", "member", "reviewer")
CUSTOMERS = (
    "Quillon Foods", "Marrowgate Ltd", "Brisk Harbor Co", "Tallow & Vine", "Orchid Lane Hotels",
    "Copperfield Mills", "Nightjar Logistics", "Saltmarsh Energy", "Bellwether Books", "Greyfen Clinics",
    "Starling Freight", "Hollowbrook Farms", "Ironclad Tools", "Lumen Glassworks", "Pinecrest Schools",
    "Redkite Media", "Silverbirch Bank", "Thornbury Cafes", "Wayfarer Travel", "Yellowhammer Press",
)  # fmt: skip
REGIONS = ("North", "South", "East", "West")
PRODUCTS = ("Widget", "Gadget", "Sprocket", "Gizmo", "Doohickey", "Contraption", "Thingamajig", "Whatsit")
YEARS = (2022, 2023, 2024)


@dataclass(frozen=True)
class Company:
    """The generated rows of every table, in insertion order (tuples in column order)."""

    seed: int
    departments: list[Row]  # (id, name, city, budget)
    employees: list[Row]  # (id, first_name, last_name, department_id, title, salary, hire_date, manager_id)
    projects: list[Row]  # (id, name, department_id, status, budget, start_date, end_date)
    assignments: list[Row]  # (employee_id, project_id, role, hours)
    sales: list[Row]  # (id, employee_id, customer, region, product, amount, sale_date)

    def tables(self) -> dict[str, list[Row]]:
        return {
            "departments": self.departments,
            "employees": self.employees,
            "projects": self.projects,
            "assignments": self.assignments,
            "sales": self.sales,
        }

    def fingerprint(self) -> int:
        """A positive 31-bit hash of the schema and every row (stored as ``PRAGMA user_version``)."""
        digest = hashlib.sha256(SCHEMA.encode())
        for name, rows in self.tables().items():
            digest.update(name.encode())
            digest.update(repr(rows).encode())
        return int.from_bytes(digest.digest()[:4], "big") & 0x7FFFFFFF


def _date(rng: random.Random, first: dt.date, last: dt.date) -> dt.date:
    return first + dt.timedelta(days=rng.randrange((last - first).days + 1))


def _distinct_ints(rng: random.Random, low: int, high: int, count: int, step: int) -> list[int]:
    return rng.sample(range(low, high, step), count)


def generate_company(seed: int = 0, *, staff_per_department: tuple[int, int] = (10, 18)) -> Company:
    """Every row of the company database, the same for the same seed.

    Example:
        >>> generate_company(3) == generate_company(3)
        True
    """
    rng = random.Random(f"rlf-sql-{seed}")
    cities = [rng.choice(CITIES) for _ in DEPARTMENTS]
    budgets = _distinct_ints(rng, 200_000, 2_000_000, len(DEPARTMENTS), 10_000)
    departments = [(i + 1, name, cities[i], budgets[i]) for i, name in enumerate(DEPARTMENTS)]

    names = rng.sample([(f, last) for f in FIRST_NAMES for last in LAST_NAMES], 200)
    sizes = [rng.randint(*staff_per_department) for _ in DEPARTMENTS]
    sizes[DEPARTMENTS.index("Sales")] += 8  # enough sellers for the sales table
    employees = _employees(rng, sizes, names)
    projects = _projects(rng)
    assignments = _assignments(rng, employees, projects)
    sales = _sales(rng, employees)
    return Company(seed, departments, employees, projects, assignments, sales)


def _employees(rng: random.Random, sizes: list[int], names: list[tuple[str, str]]) -> list[Row]:
    """Per department, by falling salary: a director, two managers, then staff under a manager."""
    salaries = iter(_distinct_ints(rng, 38_000, 150_000, sum(sizes), 50))
    employees: list[Row] = []
    for dept_id, size in enumerate(sizes, start=1):
        is_sales = DEPARTMENTS[dept_id - 1] == "Sales"
        dept_salaries = sorted((next(salaries) for _ in range(size)), reverse=True)
        director_id = len(employees) + 1
        manager_ids: list[int] = []
        for rank, salary in enumerate(dept_salaries):
            emp_id = len(employees) + 1
            if rank == 0:
                title, manager = "Director", None
            elif rank <= 2:
                title, manager = "Manager", director_id
                manager_ids.append(emp_id)
            else:
                title = rng.choice(SALES_TITLES if is_sales else STAFF_TITLES)
                manager = rng.choice(manager_ids)
            hired = _date(rng, dt.date(2012, 1, 1), dt.date(2024, 6, 30)).isoformat()
            first, last = names[emp_id - 1]
            employees.append((emp_id, first, last, dept_id, title, salary, hired, manager))
    return employees


def _projects(rng: random.Random) -> list[Row]:
    project_names = rng.sample(PROJECT_CODENAMES, 26)
    project_budgets = _distinct_ints(rng, 20_000, 900_000, len(project_names), 500)
    projects: list[Row] = []
    for i, codename in enumerate(project_names, start=1):
        status = PROJECT_STATUSES[i % len(PROJECT_STATUSES)]
        start = _date(rng, dt.date(2019, 1, 1), dt.date(2024, 6, 30))
        end = (
            start + dt.timedelta(days=rng.randint(60, 700)) if status in ("completed", "cancelled") else None
        )
        dept_id = rng.randint(1, len(DEPARTMENTS))
        projects.append(
            (i, f"Project {codename}", dept_id, status, project_budgets[i - 1], start.isoformat(), end and end.isoformat())
        )  # fmt: skip
    return projects


def _assignments(rng: random.Random, employees: list[Row], projects: list[Row]) -> list[Row]:
    assignments: list[Row] = []
    for emp in employees:
        if emp[4] == "Director" or rng.random() < 0.2:
            continue  # directors and a fifth of the staff are on no project
        for project in sorted(rng.sample(projects, rng.randint(1, 4))):
            assignments.append((emp[0], project[0], rng.choice(ROLES), rng.randint(8, 400)))
    return assignments


def _sales(rng: random.Random, employees: list[Row]) -> list[Row]:
    sellers = [e[0] for e in employees if e[3] == DEPARTMENTS.index("Sales") + 1 and e[4] != "Director"]
    sales: list[Row] = []
    for sale_id in range(1, 401):
        amount = round(rng.uniform(120, 9_800), 2)
        sold_on = _date(rng, dt.date(YEARS[0], 1, 1), dt.date(YEARS[-1], 12, 31)).isoformat()
        sale = (
            sale_id,
            rng.choice(sellers),
            rng.choice(CUSTOMERS),
            rng.choice(REGIONS),
            rng.choice(PRODUCTS),
        )
        sales.append((*sale, amount, sold_on))
    return sales


def write_database(company: Company, path: str | Path) -> None:
    """Write ``company`` as a new sqlite file at ``path`` (which must not exist yet)."""
    with contextlib.closing(sqlite3.connect(path)) as connection:
        # a fresh file that is renamed into place only when complete needs no journal or fsync
        connection.execute("PRAGMA journal_mode = OFF")
        connection.execute("PRAGMA synchronous = OFF")
        connection.executescript(SCHEMA)
        for table, rows in company.tables().items():
            if rows:
                marks = ", ".join("?" * len(rows[0]))
                connection.executemany(f"INSERT INTO {table} VALUES ({marks})", rows)
        connection.execute(f"PRAGMA user_version = {company.fingerprint()}")
        connection.commit()


def default_cache_dir() -> Path:
    """``$RLF_CACHE_DIR``, else ``~/.cache/rlf``."""
    return Path(os.environ.get("RLF_CACHE_DIR") or Path.home() / ".cache" / "rlf")


def database_path(seed: int, cache_dir: str | Path | None = None) -> Path:
    """Where the database of ``seed`` is cached: ``<cache>/sql/seed{seed}.sqlite``."""
    return Path(cache_dir if cache_dir is not None else default_cache_dir()) / "sql" / f"seed{seed}.sqlite"


def _stored_fingerprint(path: Path) -> int | None:
    try:
        uri = f"file:{urllib.parse.quote(str(path.resolve()))}?mode=ro"
        with contextlib.closing(sqlite3.connect(uri, uri=True)) as connection:
            return int(connection.execute("PRAGMA user_version").fetchone()[0])
    except sqlite3.Error:
        return None  # missing or not a database: rebuild


def ensure_database(seed: int = 0, cache_dir: str | Path | None = None) -> Path:
    """The cached database file of ``seed``, (re)built when missing or made by another generator.

    Example:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as cache:
        ...     first = ensure_database(0, cache_dir=cache)
        ...     mtime = first.stat().st_mtime_ns
        ...     again = ensure_database(0, cache_dir=cache)   # same rows: the file is reused
        ...     first.name, again == first and again.stat().st_mtime_ns == mtime
        ('seed0.sqlite', True)
    """
    company = generate_company(seed)
    path = database_path(seed, cache_dir)
    if path.exists() and _stored_fingerprint(path) == company.fingerprint():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{path.name}.", dir=path.parent) as tmp_dir:
        tmp = Path(tmp_dir) / path.name
        write_database(company, tmp)
        os.replace(tmp, path)  # atomic: readers see the old file or the complete new one
    return path
