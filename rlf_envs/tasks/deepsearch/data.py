"""Real-data loaders: retrieval corpora and QA files in the FlashRAG / Search-R1 formats.

Corpus JSONL, one passage a line: ``{"id": "0", "contents": "\\"Title\\"\\ntext"}`` (FlashRAG,
Search-R1's wiki-18) or ``{"id": ..., "title": ..., "text": ...}``; ``.jsonl.gz`` is read too.
QA files, JSONL or parquet: ``question`` plus ``golden_answers`` (Search-R1's NQ+HotpotQA
``train.parquet`` / ``test.parquet``), or ``answers`` / ``answer``, or Search-R1's
``reward_model.ground_truth.target``.

Example:
    >>> doc = parse_corpus_record({"id": "7", "contents": '"Zorvia"\\nZorvia is a country.'})
    >>> doc.title, doc.text
    ('Zorvia', 'Zorvia is a country.')
"""

from __future__ import annotations

import gzip
import hashlib
import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from rlf_envs.types import TaskInstance

QA_SUFFIXES = (".jsonl", ".json", ".parquet", ".jsonl.gz")


class DataFormatError(ValueError):
    """A corpus or QA record lacks the fields we need; the message names the file and line."""


@dataclass(frozen=True)
class Document:
    """One retrievable passage. ``contents`` is the FlashRAG form, title line first."""

    id: str
    title: str
    text: str

    @property
    def contents(self) -> str:
        return f'"{self.title}"\n{self.text}'

    def to_record(self) -> dict[str, str]:
        """The passage as a FlashRAG/Search-R1 corpus line (``id``, ``contents``)."""
        return {"id": self.id, "contents": self.contents}

    def canonical_line(self) -> str:
        """The one JSON line (no newline) that stores this passage in an index and feeds its hash."""
        return json.dumps(
            {"id": self.id, "title": self.title, "text": self.text}, ensure_ascii=False, sort_keys=True
        )


def corpus_hash(documents: Iterable[Document]) -> str:
    """SHA-256 over the passages' canonical lines, in order: equal hashes mean an equal corpus."""
    digest = hashlib.sha256()
    for document in documents:
        digest.update(document.canonical_line().encode("utf-8"))
        digest.update(b"\n")
    return digest.hexdigest()


def _split_contents(contents: str) -> tuple[str, str]:
    # wiki-18 quotes the title on the first line; a one-line passage has no title
    first, newline, rest = contents.partition("\n")
    if not newline:
        return "", contents.strip()
    title = first.strip()
    if len(title) >= 2 and title[0] == title[-1] == '"':
        title = title[1:-1]
    return title, rest.strip()


def parse_corpus_record(record: Mapping[str, Any], fallback_id: str = "") -> Document:
    """A corpus line (``contents`` or ``title``/``text``) as a :class:`Document`."""
    doc_id = record.get("id", record.get("_id", record.get("doc_id", fallback_id)))
    if "contents" in record:
        title, text = _split_contents(str(record["contents"]))
        title = str(record.get("title") or title)
    elif "text" in record:
        title, text = str(record.get("title") or ""), str(record["text"])
    else:
        raise DataFormatError(
            f"corpus record {doc_id!r} has neither 'contents' nor 'text': keys {sorted(record)}"
        )
    return Document(id=str(doc_id), title=title, text=text)


def _open_text(path: Path) -> TextIO:
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8")
    return path.open("r", encoding="utf-8")


def _iter_jsonl(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    with _open_text(path) as lines:
        for line_number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise DataFormatError(f"{path}:{line_number}: invalid JSON ({error.msg})") from error
            if not isinstance(record, dict):
                raise DataFormatError(
                    f"{path}:{line_number}: expected a JSON object, got {type(record).__name__}"
                )
            yield line_number, record


def read_corpus(path: str | Path, *, limit: int | None = None) -> Iterator[Document]:
    """Stream the passages of a corpus JSONL (or ``.jsonl.gz``) file.

    Example:
        >>> import json, os, tempfile
        >>> records = [{"id": "0", "contents": '"Zorvia"\\nZorvia is a country.'},
        ...            {"id": "1", "contents": '"Leidax"\\nLeidax is its capital.'}]
        >>> with tempfile.TemporaryDirectory() as tmp:   # e.g. wiki-18.jsonl: one {"id", "contents"} a line
        ...     path = os.path.join(tmp, "corpus.jsonl")
        ...     with open(path, "w") as out:
        ...         _ = out.write("".join(json.dumps(r) + "\\n" for r in records))
        ...     [(doc.id, doc.title) for doc in read_corpus(path, limit=1)]
        [('0', 'Zorvia')]
    """
    path = Path(path)
    for count, (line_number, record) in enumerate(_iter_jsonl(path)):
        if limit is not None and count >= limit:
            return
        try:
            yield parse_corpus_record(record, fallback_id=str(line_number - 1))
        except DataFormatError as error:
            raise DataFormatError(f"{path}:{line_number}: {error}") from error


def _plain(value: Any) -> Any:
    """numpy arrays / scalars from parquet as plain lists / Python values."""
    if hasattr(value, "tolist"):
        return value.tolist()
    return value


def _golden_answers(record: Mapping[str, Any]) -> list[str] | None:
    for key in ("golden_answers", "answers", "answer"):
        if key in record and record[key] is not None:
            value = _plain(record[key])
            return [str(value)] if isinstance(value, str | int | float) else [str(v) for v in value]
    ground_truth = (_plain(record.get("reward_model")) or {}).get("ground_truth") or {}
    if "target" in ground_truth:
        target = _plain(ground_truth["target"])
        return [str(target)] if isinstance(target, str) else [str(v) for v in target]
    return None


_METADATA_SKIP = frozenset(
    {"question", "golden_answers", "answers", "answer", "id", "prompt", "reward_model"}
)


def qa_record_to_instance(record: Mapping[str, Any], fallback_id: str) -> TaskInstance:
    """A QA row as a :class:`TaskInstance` whose ``answer`` is the list of golden answers."""
    question = record.get("question")
    if not isinstance(question, str) or not question.strip():
        raise DataFormatError(f"QA record {fallback_id!r} has no 'question' string: keys {sorted(record)}")
    answers = _golden_answers(record)
    if not answers:
        raise DataFormatError(
            f"QA record {fallback_id!r} has no answers (looked for golden_answers, answers, answer, "
            "reward_model.ground_truth.target)"
        )
    metadata = {key: _plain(value) for key, value in record.items() if key not in _METADATA_SKIP}
    return TaskInstance(
        id=str(record.get("id", fallback_id)), question=question.strip(), answer=answers, metadata=metadata
    )


def _iter_parquet(path: Path) -> Iterator[dict[str, Any]]:
    try:
        import pyarrow.parquet as pq
    except ImportError as error:  # pragma: no cover - pyarrow is in the dev and data extras
        raise ImportError("reading parquet QA files needs pyarrow: pip install 'rlf[data]'") from error
    for batch in pq.ParquetFile(path).iter_batches(batch_size=4096):
        yield from batch.to_pylist()


def _read_json_array(path: Path) -> list[dict[str, Any]]:
    """A ``.json`` QA file: a list of records (or ``{"data": [...]}``)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise DataFormatError(f"{path}: invalid JSON ({error.msg})") from error
    if isinstance(data, dict) and isinstance(data.get("data"), list):
        data = data["data"]
    if not isinstance(data, list) or not all(isinstance(row, dict) for row in data):
        raise DataFormatError(f"{path}: expected a JSON list of objects")
    return data


def load_qa(path: str | Path, *, limit: int | None = None) -> list[TaskInstance]:
    """Load a QA file (JSONL, ``.jsonl.gz``, a ``.json`` list, or parquet) as task instances.

    Example:
        >>> import os, tempfile
        >>> with tempfile.TemporaryDirectory() as tmp:   # also .jsonl.gz, a .json list, parquet
        ...     path = os.path.join(tmp, "qa.jsonl")
        ...     with open(path, "w") as out:
        ...         _ = out.write('{"question": "Capital of Zorvia?", "golden_answers": ["Leidax"]}\\n')
        ...     load_qa(path)
        [TaskInstance(id='qa-0', question='Capital of Zorvia?', answer=['Leidax'], metadata={})]
    """
    path = Path(path)
    rows: Iterable[dict[str, Any]]
    if path.suffix == ".parquet":
        rows = _iter_parquet(path)
    elif path.suffix == ".json":
        rows = _read_json_array(path)
    else:
        rows = (record for _, record in _iter_jsonl(path))
    instances = []
    for index, row in enumerate(rows):
        if limit is not None and index >= limit:
            break
        try:
            instances.append(qa_record_to_instance(row, fallback_id=f"{path.stem}-{index}"))
        except DataFormatError as error:
            raise DataFormatError(f"{path} row {index}: {error}") from error
    return instances


def find_split_file(directory: Path, split: str) -> Path | None:
    """``<dir>/<split>.parquet`` / ``.jsonl`` / ..., whichever exists first."""
    for suffix in QA_SUFFIXES:
        candidate = directory / f"{split}{suffix}"
        if candidate.is_file():
            return candidate
    return None


def load_qa_splits(path: str | Path, *, limit: int | None = None) -> dict[str, list[TaskInstance]]:
    """QA splits from a directory holding ``train.*`` / ``test.*`` files, or one file for every split.

    Example:
        >>> import os, tempfile
        >>> with tempfile.TemporaryDirectory() as tmp:   # e.g. nq_hotpotqa_train/{train,test}.parquet
        ...     for split in ("train", "test"):
        ...         with open(os.path.join(tmp, f"{split}.jsonl"), "w") as out:
        ...             _ = out.write('{"question": "Capital of Zorvia?", "answer": "Leidax"}\\n' * 2)
        ...     {split: len(instances) for split, instances in load_qa_splits(tmp).items()}
        {'train': 2, 'test': 2}
    """
    path = Path(path)
    if path.is_file():
        instances = load_qa(path, limit=limit)
        return {"train": instances, "test": instances}
    if not path.is_dir():
        raise FileNotFoundError(f"no QA file or directory at {path}")
    splits = {}
    for split in ("train", "test", "dev", "validation"):
        split_file = find_split_file(path, split)
        if split_file is not None:
            splits[split] = load_qa(split_file, limit=limit)
    if not splits:
        raise FileNotFoundError(f"{path} holds no train/test/dev QA file ({', '.join(QA_SUFFIXES)})")
    return splits
