"""The python sandbox behind ``rlf_envs.tasks.python_tool.server``: limits, runner, results.

Example:
    >>> import asyncio
    >>> result = asyncio.run(PythonSandbox().run("print(2 ** 100)"))
    >>> result.stdout
    '1267650600228229401496703205376\\n'
"""

from rlf_envs.tasks.python_tool.sandbox.limits import SandboxConfigError, SandboxLimits
from rlf_envs.tasks.python_tool.sandbox.result import Outcome, SandboxResult
from rlf_envs.tasks.python_tool.sandbox.runner import PythonSandbox, SandboxInputError, SandboxStartError

__all__ = [
    "Outcome",
    "PythonSandbox",
    "SandboxConfigError",
    "SandboxInputError",
    "SandboxLimits",
    "SandboxResult",
    "SandboxStartError",
]
