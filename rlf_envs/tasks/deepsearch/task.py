"""The DeepSearch task: answer multi-hop questions by calling a ``search`` tool, then ``<answer>``.

By default it runs on the generated world (no download); point it at Search-R1 style QA files
and a corpus or prebuilt index for real data (see docs/deepsearch.md).

Example:
    >>> task = DeepSearchTask(world_seed=0)
    >>> instance = task.instances("test")[0]
    >>> instance.metadata["hops"] in (1, 2, 3)
    True
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rlf_envs.answers import extract_answer
from rlf_envs.core.task import Task
from rlf_envs.rewards.judge import JudgeReward
from rlf_envs.rewards.rules import get_rule_reward
from rlf_envs.servers.launch import stdio_server_entry
from rlf_envs.tasks.deepsearch.data import load_qa_splits, read_corpus
from rlf_envs.tasks.deepsearch.index import build_index_dir, default_cache_dir, ensure_world_index, read_meta
from rlf_envs.tasks.deepsearch.kind_claims import false_kind_claims_in_chat
from rlf_envs.tasks.deepsearch.world import World
from rlf_envs.tasks.deepsearch.world_builder import generate_world
from rlf_envs.types import Episode, RewardValue, TaskInstance

SEARCH_SERVER_MODULE = "rlf_envs.tasks.deepsearch.server"  # this task's MCP server, run as `python -m`

SYSTEM_PROMPT = """\
You answer questions by searching a document collection.
Think step by step about what you need to know. Whenever you lack a fact, call the `search` tool \
with a short query (an entity name works best); it returns the most relevant documents. \
You may search as many times as you need, one fact at a time: the answer to one search often \
tells you what to search for next.
When you know the answer, reply with only the short answer inside <answer> and </answer>, \
without explanation, for example: <answer> Beijing </answer>."""


class DeepSearchTask(Task):
    """Multi-hop search QA scored by exact match of the final ``<answer>``.

    Args:
        world_seed: seed of the generated world used when ``qa_path`` is not given.
        qa_path: a QA file (JSONL/parquet, used for every split) or a directory with
            ``train.*`` / ``test.*`` files, e.g. Search-R1's ``nq_hotpotqa_train``.
        corpus_path: corpus JSONL to index (cached by file identity) for the search tool.
        index_dir: a prebuilt index directory (``rlf-search-index``); wins over ``corpus_path``.
        reward: a rule reward name from ``RULE_REWARDS`` ("exact_match", "f1", "contains", ...),
            or "judge": an LLM judge (:class:`~rlf_envs.rewards.judge.JudgeReward`) at ``judge_url``
            running ``judge_model`` scores the answer; ``em``/``f1`` are still reported.
        judge_url, judge_model, judge_kwargs: the judge's OpenAI-compatible base URL, model name and
            any further :class:`~rlf_envs.rewards.judge.JudgeReward` keyword arguments.
        format_reward: added when the answer is wrong (EM 0) but the final response has a
            well-formed ``<answer>`` block; 0.0 keeps a wrong answer at exactly 0.
        evidence_reward: added when the answer is wrong, times the share of the question's supporting
            documents that the episode's searches returned (``evidence``, reported for every episode of
            the generated world): a wrong answer after the right searches scores above one after too
            few, so a group whose samples all fail still ranks them (e.g. a third search on a 3-hop
            question). 0.0 keeps a wrong answer at the format bonus.
        redundant_search_cost: the step reward of a search made once the question's supporting
            documents had all been shown, negated, per call (a process reward of the generated world):
            a 1-hop answer after one search then scores above the same answer after two, so a group
            that always succeeds still teaches when to stop searching. ``redundant_searches`` in the
            reward info counts them for every episode of the generated world.
        kind_claim_cost: subtracted from the reward per statement of the kinds oracle's wording ("X is a
            city, not a capital.", "The question asks for a country.") that the generated world
            contradicts (:mod:`~rlf_envs.tasks.deepsearch.kind_claims`): without it GRPO learned to
            license needless searches with claims like "Roril is a city, not a city proper".
            ``false_kind_claims`` in the reward info counts them for every episode of the generated world.
        max_turns: assistant turns before the episode is truncated.
        top_k: documents a search returns when the model does not pass ``top_k``.
        train_hops: keep only train questions with these hop counts (e.g. ``[2, 3]`` for an RL stage
            after an SFT on 1-hop demonstrations); the test split keeps every question.
        cache_dir: where generated indexes live (default ``$RLF_CACHE_DIR`` or ``~/.cache/rlf``).
    """

    name = "deepsearch"
    system_prompt = SYSTEM_PROMPT
    answer_tag = "answer"

    def __init__(
        self,
        *,
        world_seed: int = 0,
        qa_path: str | Path | None = None,
        corpus_path: str | Path | None = None,
        index_dir: str | Path | None = None,
        reward: str = "exact_match",
        format_reward: float = 0.0,
        evidence_reward: float = 0.0,
        redundant_search_cost: float = 0.0,
        kind_claim_cost: float = 0.0,
        max_turns: int = 4,
        top_k: int = 3,
        cache_dir: str | Path | None = None,
        judge_url: str | None = None,
        judge_model: str | None = None,
        judge_kwargs: dict[str, Any] | None = None,
        tool_success_reward: float = 0.0,
        train_hops: list[int] | tuple[int, ...] | None = None,
    ) -> None:
        if qa_path is not None and corpus_path is None and index_dir is None:
            raise ValueError("qa_path needs the corpus to search: pass corpus_path or index_dir as well")
        self.world_seed = world_seed
        self.train_hops = frozenset(int(h) for h in train_hops) if train_hops is not None else None
        self.tool_success_reward = float(tool_success_reward)
        self.qa_path = Path(qa_path) if qa_path is not None else None
        self.corpus_path = Path(corpus_path) if corpus_path is not None else None
        self.index_dir = Path(index_dir) if index_dir is not None else None
        self.reward_name = reward
        self._judge: JudgeReward | None = None
        if reward == "judge":
            if judge_url is None or judge_model is None:
                raise ValueError('reward="judge" needs judge_url and judge_model')
            self._judge = JudgeReward(
                judge_url, judge_model, answer_tag=self.answer_tag, **(judge_kwargs or {})
            )
            reward = "exact_match"  # still reported (em, f1) next to the judge's verdict
        self._reward_fn = get_rule_reward(reward)
        self.format_reward = float(format_reward)
        self.evidence_reward = float(evidence_reward)
        self.redundant_search_cost = float(redundant_search_cost)
        self.kind_claim_cost = float(kind_claim_cost)
        self.max_turns = max_turns
        self.top_k = top_k
        self.cache_dir = Path(cache_dir) if cache_dir is not None else None
        self._index_path: Path | None = None

    @functools.cached_property
    def world(self) -> World:
        """The generated world (questions, documents, oracle solutions)."""
        return generate_world(self.world_seed)

    @functools.cached_property
    def split_instances(self) -> dict[str, list[TaskInstance]]:
        splits = (
            load_qa_splits(self.qa_path)
            if self.qa_path is not None
            else {split: self.world.to_instances(split) for split in ("train", "test")}
        )
        if self.train_hops is not None and "train" in splits:  # the test split always keeps every hop count
            splits["train"] = [i for i in splits["train"] if i.metadata.get("hops") in self.train_hops]
            if not splits["train"]:
                raise ValueError(
                    f"train_hops={sorted(self.train_hops)}: no train question has that many hops"
                )
        return splits

    def index_path(self) -> Path:
        """The search index directory, built (once, atomically) if it does not exist yet."""
        if self._index_path is None:
            self._index_path = self._ensure_index()
        return self._index_path

    def _ensure_index(self) -> Path:
        if self.index_dir is not None:
            if read_meta(self.index_dir) is None:
                raise FileNotFoundError(
                    f"no search index at {self.index_dir}; build one with rlf-search-index"
                )
            return self.index_dir
        cache = self.cache_dir if self.cache_dir is not None else default_cache_dir()
        if self.corpus_path is not None:
            stat = self.corpus_path.stat()
            identity = f"{self.corpus_path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}"
            directory = cache / "deepsearch" / f"corpus-{hashlib.sha256(identity.encode()).hexdigest()[:16]}"
            if read_meta(directory) is None:
                build_index_dir(
                    read_corpus(self.corpus_path), directory, source={"corpus": str(self.corpus_path)}
                )
            return directory
        return ensure_world_index(self.world_seed, cache)

    def mcp_config(self) -> dict[str, Any]:
        """``{"mcpServers": {"search": ...}}`` running our search server over this task's index."""
        args = ["--index", str(self.index_path()), "--top-k", str(self.top_k)]
        return {"mcpServers": {"search": stdio_server_entry(SEARCH_SERVER_MODULE, args, timeout_s=30)}}

    async def reward(self, episode: Episode) -> RewardValue:
        """The chosen rule reward (EM by default) with ``em``/``f1``, plus the format bonus.

        Example:
            >>> import asyncio
            >>> from rlf_envs.types import Episode, TaskInstance
            >>> task = DeepSearchTask(format_reward=0.1)
            >>> question = TaskInstance("q0", "What is the capital of Zorvia?", ["Leidax"])
            >>> def answered(reply):
            ...     return Episode(question, [], reply, None, [], 2, terminated=True, truncated=False)
            >>> asyncio.run(task.reward(answered("<answer>Leidax</answer>")))
            {'reward': 1.0, 'em': 1.0, 'f1': 1.0, 'format': 1.0}
            >>> asyncio.run(task.reward(answered("<answer>Paris</answer>")))["reward"]   # wrong but well formed
            0.1
        """
        scores = dict(self._reward_fn(episode))
        if self._judge is not None:
            scores.update(await self._judge(episode))  # "reward" becomes the judge's score
        well_formed = extract_answer(episode.final_response, self.answer_tag) not in (None, "")
        scores["format"] = float(well_formed)
        wrong = scores["reward"] == 0.0 if self._judge is not None else scores["em"] == 0.0
        if well_formed and wrong:
            scores["reward"] = scores["reward"] + self.format_reward
        evidence = self.evidence(episode)
        if evidence is not None:
            scores["evidence"] = evidence
            scores["redundant_searches"] = float(
                sum(self.redundant_calls(episode.instance, episode.messages))
            )
            if wrong:
                scores["reward"] = scores["reward"] + self.evidence_reward * evidence
            false_claims = false_kind_claims_in_chat(self.world, episode.instance.id, episode.messages)
            scores["false_kind_claims"] = float(false_claims)
            scores["reward"] = scores["reward"] - self.kind_claim_cost * false_claims
        return scores

    def turn_reward(
        self, instance: TaskInstance, messages: Sequence[Mapping[str, Any]], calls_ok: Sequence[bool]
    ) -> float:
        """The base turn reward, less ``redundant_search_cost`` per search of this turn made after the
        supporting documents had all been shown.

        Example:
            >>> task = DeepSearchTask(redundant_search_cost=0.3)
            >>> question = next(q for q in task.split_instances["train"] if q.metadata["hops"] == 1)
            >>> doc = task.world.document(question.metadata["supporting_doc_ids"][0])
            >>> search = {"role": "assistant", "content": "", "tool_calls": [{"name": "search"}]}
            >>> found = {"role": "tool", "content": f"Doc 1 (Title: {doc.title}): {doc.text}"}
            >>> task.turn_reward(question, [search, found], [True]), task.turn_reward(question, [search, found, search, found], [True])
            (0.0, -0.3)
        """
        reward = super().turn_reward(instance, messages, calls_ok)
        if self.redundant_search_cost:
            calls = self.redundant_calls(instance, messages)
            reward -= self.redundant_search_cost * (calls[-1] if calls else 0)
        return reward

    def redundant_calls(self, instance: TaskInstance, messages: Sequence[Mapping[str, Any]]) -> list[int]:
        """For each tool turn of ``messages``, how many of its calls came after every supporting
        document had been shown (all 0 for questions without supporting documents)."""
        titles = self._supporting_titles(instance)
        counts, shown = [], ""
        for message in messages:
            if message.get("role") == "tool":
                shown += "\n" + str(message.get("content", ""))
            elif message.get("role") == "assistant" and message.get("tool_calls"):
                complete = bool(titles) and all(f"(Title: {title})" in shown for title in titles)
                counts.append(len(message["tool_calls"]) if complete else 0)
        return counts

    def _supporting_titles(self, instance: TaskInstance) -> list[str]:
        doc_ids = instance.metadata.get("supporting_doc_ids")
        if not doc_ids or self.qa_path is not None:
            return []
        return [self.world.document(doc_id).title for doc_id in doc_ids]

    def evidence(self, episode: Episode) -> float | None:
        """The share of the question's supporting documents that the episode's tool results showed;
        None for questions without them (a ``qa_path`` dataset).

        Example:
            >>> import asyncio
            >>> from rlf_envs.types import Episode
            >>> task = DeepSearchTask(evidence_reward=0.3)
            >>> question = next(q for q in task.split_instances["train"] if q.metadata["hops"] == 2)
            >>> first = task.world.document(question.metadata["supporting_doc_ids"][0])
            >>> found = [{"role": "tool", "content": f"Doc 1 (Title: {first.title}): {first.text}"}]
            >>> episode = Episode(question, found, "<answer>no idea</answer>", "no idea", [], 2, True, False)
            >>> task.evidence(episode)
            0.5
            >>> asyncio.run(task.reward(episode))["reward"]   # wrong: 0.3 x half the evidence
            0.15
        """
        titles = self._supporting_titles(episode.instance)
        if not titles:
            return None
        shown = "\n".join(str(m.get("content", "")) for m in episode.messages if m.get("role") == "tool")
        return sum(f"(Title: {title})" in shown for title in titles) / len(titles)
