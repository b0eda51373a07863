"""SQL: text-to-SQL over a generated company database (default) or a Spider/BIRD-style database.

Example:
    >>> from rlf_envs.tasks.sql import SQLTask, generate_company
    >>> len(generate_company(0).departments)
    8
"""

from rlf_envs.tasks.sql.compare import has_top_level_order_by, normalize_rows, results_match
from rlf_envs.tasks.sql.data import Company, database_path, ensure_database, generate_company, write_database
from rlf_envs.tasks.sql.questions import (
    QuestionFileError,
    SQLQuestion,
    checked_questions,
    load_question_file,
    template_questions,
)
from rlf_envs.tasks.sql.sandbox import (
    ForbiddenQueryError,
    QueryError,
    QueryResult,
    QueryTimeoutError,
    ReadOnlyDatabase,
    SQLError,
    check_single_select,
    format_table,
)
from rlf_envs.tasks.sql.task import SYSTEM_PROMPT, SQLTask, strip_sql

__all__ = [
    "SYSTEM_PROMPT",
    "Company",
    "ForbiddenQueryError",
    "QueryError",
    "QueryResult",
    "QueryTimeoutError",
    "QuestionFileError",
    "ReadOnlyDatabase",
    "SQLError",
    "SQLQuestion",
    "SQLTask",
    "check_single_select",
    "checked_questions",
    "database_path",
    "ensure_database",
    "format_table",
    "generate_company",
    "has_top_level_order_by",
    "load_question_file",
    "normalize_rows",
    "results_match",
    "strip_sql",
    "template_questions",
    "write_database",
]
