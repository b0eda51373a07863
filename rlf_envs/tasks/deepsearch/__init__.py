"""DeepSearch: multi-hop search QA over a generated world (default) or Search-R1 style real data.

Example:
    >>> from rlf_envs.tasks.deepsearch import DeepSearchTask, generate_world
    >>> generate_world(0).check()  # every question has one unambiguous answer
"""

from rlf_envs.tasks.deepsearch.data import Document, load_qa, load_qa_splits, read_corpus
from rlf_envs.tasks.deepsearch.index import SearchIndex, build_index_dir, ensure_world_index
from rlf_envs.tasks.deepsearch.task import SYSTEM_PROMPT, DeepSearchTask
from rlf_envs.tasks.deepsearch.world import OracleSolution, Question, World, WorldConfig
from rlf_envs.tasks.deepsearch.world_builder import generate_world

__all__ = [
    "SYSTEM_PROMPT",
    "DeepSearchTask",
    "Document",
    "OracleSolution",
    "Question",
    "SearchIndex",
    "World",
    "WorldConfig",
    "build_index_dir",
    "ensure_world_index",
    "generate_world",
    "load_qa",
    "load_qa_splits",
    "read_corpus",
]
