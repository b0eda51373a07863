"""DeepSearch with an agent tool: ``summarize(text)`` (another model, over MCP) next to ``search``.

The summarizer is ``rlf_envs.servers.agent`` in front of any OpenAI-compatible endpoint
(``rlf-serve``, vLLM, a hosted model): the policy can condense long search results before
reasoning over them. Two ways to use it:

* any DeepSearch env, tools replaced by the config (the env's ``mcp_servers`` wins over the task's)::

    import gymnasium as gym, rlf_envs
    from rlf_envs.tasks.deepsearch.summarizer import summarizer_mcp_config
    servers = summarizer_mcp_config("http://127.0.0.1:8000/v1", "qwen3-8b")
    env = gym.make("RLF/DeepSearch-v0", mcp_servers=servers)   # tools: search, summarize

* the task variant, whose system prompt also tells the policy about ``summarize``::

    from rlf_envs.core.env import ToolEnv
    env = ToolEnv(SummarizingDeepSearchTask(summarizer_url="http://127.0.0.1:8000/v1",
                                            summarizer_model="qwen3-8b"))

Example:
    >>> config = summarizer_mcp_config("http://127.0.0.1:8000/v1", "tiny", task=DeepSearchTask(world_seed=0))
    >>> sorted(config["mcpServers"])
    ['search', 'summarizer']
"""

from __future__ import annotations

from typing import Any

from rlf_envs.servers.agent import agent_server_config
from rlf_envs.tasks.deepsearch.task import SYSTEM_PROMPT, DeepSearchTask

SUMMARIZE_TOOL = "summarize"
SUMMARIZE_SYSTEM_PROMPT = (
    "You condense text for a researcher who is answering a question. Keep every name, place, "
    "date and number; drop everything else. Reply with the summary only, at most three sentences."
)
SUMMARIZE_DESCRIPTION = (
    "Summarize a long text (for example search results) into a few sentences that keep the names, "
    "places, dates and numbers. Pass the whole text to condense."
)
SUMMARIZER_SYSTEM_PROMPT = (
    SYSTEM_PROMPT
    + "\nWhen search results are long, you may call the `summarize` tool with their text to get "
    "a short summary that keeps names, places, dates and numbers."
)


def summarizer_server_config(
    base_url: str, model: str, *, max_tokens: int = 256, timeout_s: float = 60.0, **agent_kwargs: Any
) -> dict[str, Any]:
    """The ``mcpServers`` entry of the ``summarize(text)`` tool (see :func:`agent_server_config`)."""
    return agent_server_config(
        base_url,
        model,
        name=SUMMARIZE_TOOL,
        arg_name="text",
        description=SUMMARIZE_DESCRIPTION,
        system_prompt=SUMMARIZE_SYSTEM_PROMPT,
        max_tokens=max_tokens,
        timeout_s=timeout_s,
        **agent_kwargs,
    )


def summarizer_mcp_config(
    base_url: str,
    model: str,
    *,
    task: DeepSearchTask | None = None,
    max_tokens: int = 256,
    timeout_s: float = 60.0,
    **agent_kwargs: Any,
) -> dict[str, Any]:
    """``{"mcpServers": {"search": ..., "summarizer": ...}}``: ``task``'s search server plus the summarizer.

    ``task`` defaults to ``DeepSearchTask()`` (the generated world, seed 0); pass the task whose
    index the search server should use. Building the config builds that index if needed.
    """
    # DeepSearchTask's own config, not a subclass override (SummarizingDeepSearchTask calls this)
    config = DeepSearchTask.mcp_config(task if task is not None else DeepSearchTask())
    servers = dict(config["mcpServers"])
    servers["summarizer"] = summarizer_server_config(
        base_url, model, max_tokens=max_tokens, timeout_s=timeout_s, **agent_kwargs
    )
    return {"mcpServers": servers}


class SummarizingDeepSearchTask(DeepSearchTask):
    """DeepSearch whose default tools are ``search`` and ``summarize`` (an agent tool).

    Args:
        summarizer_url: the summarizer model's OpenAI-compatible base URL.
        summarizer_model: its model name.
        summarizer_max_tokens, summarizer_timeout_s: the summary's length and the per-attempt timeout.
        **deepsearch_kwargs: everything :class:`DeepSearchTask` accepts (world_seed, qa_path, reward, ...).
    """

    name = "deepsearch_summarizer"
    system_prompt = SUMMARIZER_SYSTEM_PROMPT

    def __init__(
        self,
        *,
        summarizer_url: str,
        summarizer_model: str,
        summarizer_max_tokens: int = 256,
        summarizer_timeout_s: float = 60.0,
        **deepsearch_kwargs: Any,
    ) -> None:
        super().__init__(**deepsearch_kwargs)
        self.summarizer_url = summarizer_url
        self.summarizer_model = summarizer_model
        self.summarizer_max_tokens = summarizer_max_tokens
        self.summarizer_timeout_s = summarizer_timeout_s

    def mcp_config(self) -> dict[str, Any]:
        return summarizer_mcp_config(
            self.summarizer_url,
            self.summarizer_model,
            task=self,
            max_tokens=self.summarizer_max_tokens,
            timeout_s=self.summarizer_timeout_s,
        )
