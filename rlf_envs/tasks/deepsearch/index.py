"""A BM25 search index over passages (bm25s), saved as a directory and shared read-only by threads.

Directory layout (``SearchIndex.save`` / ``build_index_dir`` write it, ``SearchIndex.load`` reads it):

    *.index.npy, vocab.index.json, params.index.json   the bm25s sparse score matrix and vocabulary
    corpus.jsonl                                       one canonical passage a line (id, title, text)
    corpus.offsets.npy                                 byte offset of each line, so hits are read
                                                       with ``os.pread`` instead of holding the corpus
    meta.json                                          format, doc count, content hash, source

Example:
    >>> from rlf_envs.tasks.deepsearch.data import Document
    >>> index = SearchIndex.build([Document("a", "Zorvia", "Zorvia is a country."),
    ...                            Document("b", "Velmora", "Velmora is a city in Zorvia.")])
    >>> [hit["id"] for hit in index.search("Zorvia", top_k=2)]
    ['a', 'b']
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import threading
import uuid
from array import array
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Protocol

import bm25s
import numpy as np

from rlf_envs.tasks.deepsearch.data import Document, corpus_hash
from rlf_envs.tasks.deepsearch.tokens import tokenize
from rlf_envs.tasks.deepsearch.world_builder import generate_world

INDEX_FORMAT = "rlf-bm25/1"
META_FILE = "meta.json"
CORPUS_FILE = "corpus.jsonl"
OFFSETS_FILE = "corpus.offsets.npy"


logger = logging.getLogger(__name__)


class SearchIndexError(RuntimeError):
    """Base class of the errors raised when opening a saved index."""


class IndexNotFoundError(SearchIndexError, FileNotFoundError):
    """The directory holds no index we can read."""


class IndexCorruptError(SearchIndexError):
    """The index files disagree with each other or with meta.json."""


class _Passages(Protocol):
    def __len__(self) -> int: ...

    def get(self, position: int) -> Document: ...

    def close(self) -> None: ...


class _InMemoryPassages:
    def __init__(self, documents: list[Document]) -> None:
        self._documents = documents

    def __len__(self) -> int:
        return len(self._documents)

    def get(self, position: int) -> Document:
        return self._documents[position]

    def close(self) -> None:
        pass


class _FilePassages:
    """Passages read on demand from corpus.jsonl; ``os.pread`` keeps concurrent reads independent."""

    def __init__(self, corpus_path: Path, offsets: np.ndarray) -> None:
        self._fd = os.open(corpus_path, os.O_RDONLY)
        self._offsets = offsets

    def __len__(self) -> int:
        return len(self._offsets) - 1

    def get(self, position: int) -> Document:
        start, end = int(self._offsets[position]), int(self._offsets[position + 1])
        record = json.loads(os.pread(self._fd, end - start, start))
        return Document(id=record["id"], title=record["title"], text=record["text"])

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class _Vocabulary:
    """Token -> id, grown while indexing; ids are dense (0..n-1) as bm25s expects."""

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}

    def encode(self, tokens: list[str]) -> array:
        ids = self.ids
        return array("i", [ids.setdefault(token, len(ids)) for token in tokens])


def _index_tokens(document: Document) -> list[str]:
    return tokenize(f"{document.title}\n{document.text}")


def _fit_bm25(token_ids: list[array], vocabulary: _Vocabulary) -> bm25s.BM25:
    if not token_ids:
        raise ValueError("cannot build a search index over an empty corpus")
    if not vocabulary.ids:
        raise ValueError("the corpus has no indexable words (all passages empty or stopwords)")
    bm25 = bm25s.BM25()
    # token ids in compact arrays, not lists of str: a large corpus fits in a fraction of the memory
    bm25.index((token_ids, vocabulary.ids), create_empty_token=False, show_progress=False)
    return bm25


class SearchIndex:
    """BM25 over passages. ``search`` only reads shared state, so threads may call it at once.

    Build in memory with :meth:`build`, persist with :meth:`save`, reopen with :meth:`load`.
    """

    def __init__(self, bm25: bm25s.BM25, passages: _Passages, meta: dict[str, Any]) -> None:
        self._bm25 = bm25
        self._passages = passages
        self._vocab: dict[str, int] = bm25.vocab_dict
        self.meta = meta
        self._lock = threading.Lock()  # guards close() only; searches take no lock

    @classmethod
    def build(cls, documents: Iterable[Document], *, source: dict[str, Any] | None = None) -> SearchIndex:
        """Index ``documents`` in memory.

        Example:
            >>> SearchIndex.build([Document("1", "T", "some text")]).meta["doc_count"]
            1
        """
        docs, token_ids, vocabulary = [], [], _Vocabulary()
        for document in documents:
            docs.append(document)
            token_ids.append(vocabulary.encode(_index_tokens(document)))
        bm25 = _fit_bm25(token_ids, vocabulary)
        meta = _meta(len(docs), corpus_hash(docs), len(vocabulary.ids), source)
        return cls(bm25, _InMemoryPassages(docs), meta)

    @classmethod
    def load(cls, directory: str | Path, *, mmap: bool = False) -> SearchIndex:
        """Open a saved index. ``mmap=True`` leaves the score matrix on disk (for huge corpora).

        Example:
            >>> index = SearchIndex.load(ensure_world_index(seed=0))   # built and cached on first use
            >>> len(index) == index.meta["doc_count"] > 1000
            True
        """
        directory = Path(directory)
        meta = read_meta(directory)
        if meta is None:
            raise IndexNotFoundError(f"no search index at {directory} (missing or unreadable {META_FILE})")
        try:
            bm25 = bm25s.BM25.load(str(directory), mmap=mmap, load_corpus=False, show_progress=False)
            offsets = np.load(directory / OFFSETS_FILE)
        except FileNotFoundError as error:
            raise IndexCorruptError(f"index at {directory} is incomplete: {error}") from error
        if len(offsets) - 1 != meta["doc_count"] or bm25.scores["num_docs"] != meta["doc_count"]:
            raise IndexCorruptError(
                f"index at {directory}: meta says {meta['doc_count']} docs, corpus has {len(offsets) - 1}, "
                f"score matrix {bm25.scores['num_docs']}"
            )
        return cls(bm25, _FilePassages(directory / CORPUS_FILE, offsets), meta)

    def save(self, directory: str | Path) -> Path:
        """Write the index to ``directory`` atomically (readers never see half an index)."""
        directory = Path(directory)
        with _atomic_directory(directory) as staging:
            self._bm25.save(str(staging), show_progress=False)
            with (staging / CORPUS_FILE).open("wb") as out:
                offsets = _write_passages(out, (self._passages.get(i) for i in range(len(self))))
            np.save(staging / OFFSETS_FILE, offsets)
            _write_meta(staging, self.meta)
        return directory

    def __len__(self) -> int:
        return len(self._passages)

    @property
    def content_hash(self) -> str:
        return str(self.meta["content_hash"])

    def search(self, query: str, top_k: int = 3) -> list[dict[str, Any]]:
        """The best ``top_k`` passages for ``query``, best first; passages with no query word are left out.

        Each hit is ``{"id", "title", "contents", "score"}``, where ``contents`` is the passage text
        without its title line. Ties are broken by corpus order, so results are deterministic.

        Example:
            >>> index = SearchIndex.build([Document("1", "Kelmar", "The Kelmar River.")])
            >>> index.search("kelmar")[0]["title"], index.search("unknownword")
            ('Kelmar', [])
        """
        if top_k < 1:
            return []
        query_ids = [self._vocab[token] for token in tokenize(query) if token in self._vocab]
        if not query_ids:
            return []
        scores = self._bm25.get_scores_from_ids(query_ids)
        k = min(top_k, len(scores))
        kth_score = -np.partition(-scores, k - 1)[k - 1]
        above = np.flatnonzero(scores > kth_score)
        # among passages tied with the k-th score, the earliest in the corpus win
        tied = np.flatnonzero(scores == kth_score)[: k - len(above)]
        candidates = np.concatenate([above, tied])
        ranked = candidates[np.lexsort((candidates, -scores[candidates]))]
        hits = []
        for position in ranked:
            score = float(scores[position])
            if score <= 0.0:
                break
            document = self._passages.get(int(position))
            hits.append(
                {"id": document.id, "title": document.title, "contents": document.text, "score": score}
            )
        return hits

    def close(self) -> None:
        with self._lock:
            self._passages.close()

    def __enter__(self) -> SearchIndex:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --- building on disk -------------------------------------------------------------------------


def _meta(
    doc_count: int, content_hash: str, vocab_size: int, source: dict[str, Any] | None
) -> dict[str, Any]:
    return {
        "format": INDEX_FORMAT,
        "doc_count": doc_count,
        "content_hash": content_hash,
        "vocab_size": vocab_size,
        "bm25s_version": bm25s.__version__,
        "source": source or {},
    }


def _write_meta(directory: Path, meta: dict[str, Any]) -> None:
    (directory / META_FILE).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def read_meta(directory: str | Path) -> dict[str, Any] | None:
    """The index's meta.json, or None when there is no readable index of our format there."""
    try:
        meta = json.loads((Path(directory) / META_FILE).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None
    if not isinstance(meta, dict) or meta.get("format") != INDEX_FORMAT:
        return None
    return meta


def _write_passages(out: Any, documents: Iterable[Document]) -> np.ndarray:
    offsets = [0]
    for document in documents:
        line = (document.canonical_line() + "\n").encode("utf-8")
        out.write(line)
        offsets.append(offsets[-1] + len(line))
    return np.asarray(offsets, dtype=np.int64)


def build_index_dir(
    documents: Iterable[Document], directory: str | Path, *, source: dict[str, Any] | None = None
) -> Path:
    """Stream ``documents`` into an index at ``directory`` without holding the passages in memory.

    Written to a temporary sibling and renamed into place, so concurrent builders and readers are safe.

    Example:
        >>> import os, tempfile
        >>> from rlf_envs.tasks.deepsearch.data import Document
        >>> docs = [Document("a", "Zorvia", "Zorvia is a country."), Document("b", "Leidax", "The capital of Zorvia.")]
        >>> with tempfile.TemporaryDirectory() as tmp:   # e.g. read_corpus("wiki-18.jsonl"), "indexes/wiki18"
        ...     directory = build_index_dir(iter(docs), os.path.join(tmp, "index"))
        ...     [hit["id"] for hit in SearchIndex.load(directory).search("capital")]
        ['b']
    """
    directory = Path(directory)
    with _atomic_directory(directory) as staging:
        token_ids: list[array] = []
        vocabulary = _Vocabulary()
        digest = hashlib.sha256()

        def stream() -> Iterator[Document]:
            for document in documents:
                token_ids.append(vocabulary.encode(_index_tokens(document)))
                digest.update(document.canonical_line().encode("utf-8") + b"\n")
                yield document

        with (staging / CORPUS_FILE).open("wb") as out:
            offsets = _write_passages(out, stream())
        np.save(staging / OFFSETS_FILE, offsets)
        bm25 = _fit_bm25(token_ids, vocabulary)
        del token_ids[:]
        bm25.save(str(staging), show_progress=False)
        _write_meta(staging, _meta(len(offsets) - 1, digest.hexdigest(), len(vocabulary.ids), source))
    return directory


@contextlib.contextmanager
def _atomic_directory(final: Path) -> Iterator[Path]:
    """Yield a staging directory next to ``final``; on success it replaces ``final`` in one rename.

    If another process finished ``final`` first with the same content hash, its copy is kept and
    ours dropped; a stale or broken ``final`` is moved aside before the rename.
    """
    final.parent.mkdir(parents=True, exist_ok=True)
    staging = final.parent / f".{final.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    staging.mkdir()
    try:
        yield staging
        new_meta = read_meta(staging)
        for _ in range(3):
            try:
                os.rename(staging, final)
                return
            except OSError:
                # final exists (a non-empty directory cannot be renamed over)
                existing = read_meta(final)
                if existing is not None and new_meta is not None and existing == new_meta:
                    return  # someone else built the same index; keep theirs
                stale = final.parent / f".{final.name}.stale-{uuid.uuid4().hex[:8]}"
                with contextlib.suppress(FileNotFoundError):
                    os.rename(final, stale)
                    shutil.rmtree(stale, ignore_errors=True)
        raise OSError(f"could not move the new index into {final}")
    finally:
        shutil.rmtree(staging, ignore_errors=True)


# --- the generated world's index ----------------------------------------------------------------


def default_cache_dir() -> Path:
    """``$RLF_CACHE_DIR``, else ``~/.cache/rlf``."""
    return Path(os.environ.get("RLF_CACHE_DIR") or Path.home() / ".cache" / "rlf")


def ensure_world_index(seed: int = 0, cache_dir: str | Path | None = None) -> Path:
    """The directory of the generated world's index, built on first use and reused after.

    Reuse is decided by the content hash in meta.json, so a changed generator rebuilds. Safe when
    several processes call it at once: each builds into its own temporary directory and renames.

    Example:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as cache:   # default: $RLF_CACHE_DIR or ~/.cache/rlf
        ...     directory = ensure_world_index(seed=0, cache_dir=cache)
        ...     directory.relative_to(cache).as_posix(), ensure_world_index(seed=0, cache_dir=cache) == directory
        ('deepsearch/world-seed0', True)
    """

    world = generate_world(seed)
    directory = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    directory = directory / "deepsearch" / f"world-seed{seed}"
    meta = read_meta(directory)
    if meta is not None and meta.get("content_hash") == world.corpus_hash():
        return directory
    logger.info("building the DeepSearch world index (seed %d) in %s", seed, directory)
    return build_index_dir(world.documents, directory, source={"world_seed": seed})
