"""PythonTool: generated large-number math problems solved with a sandboxed ``run_python`` tool.

Example:
    >>> from rlf_envs.tasks.python_tool import PythonToolTask
    >>> PythonToolTask(kind="mixed", num_train=4, num_test=2).instances("train")[0].metadata["kind"]
    'mixed'
"""

from rlf_envs.tasks.python_tool.problems import KINDS, WORD_TEMPLATES, Problem, generate_problems
from rlf_envs.tasks.python_tool.task import SYSTEM_PROMPT, PythonToolTask

__all__ = ["KINDS", "SYSTEM_PROMPT", "WORD_TEMPLATES", "Problem", "PythonToolTask", "generate_problems"]
