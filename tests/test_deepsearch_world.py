"""The generated world, the real-data loaders, the BM25 index and the DeepSearch task (no server here)."""

from __future__ import annotations

import asyncio
import dataclasses
import gzip
import json
import multiprocessing
import os
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rlf_envs.rewards.rules import normalize_answer
from rlf_envs.tasks.deepsearch import build_index as build_index_cli
from rlf_envs.tasks.deepsearch.data import DataFormatError, Document, load_qa, load_qa_splits, read_corpus
from rlf_envs.tasks.deepsearch.index import (
    IndexCorruptError,
    IndexNotFoundError,
    SearchIndex,
    ensure_world_index,
    read_meta,
)
from rlf_envs.tasks.deepsearch.kind_claims import false_kind_claims
from rlf_envs.tasks.deepsearch.oracle import oracle_turns
from rlf_envs.tasks.deepsearch.task import DeepSearchTask
from rlf_envs.tasks.deepsearch.world import World, WorldConsistencyError
from rlf_envs.tasks.deepsearch.world_builder import generate_world
from rlf_envs.types import Episode

REPO_ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def world_index(world: World) -> SearchIndex:
    return SearchIndex.build(world.documents)


# --- the world ---------------------------------------------------------------------------------


def _hash_in_fresh_process(seed: int, hash_seed: str) -> str:
    code = (
        "from rlf_envs.tasks.deepsearch.world_builder import generate_world;"
        f"print(generate_world({seed}).content_hash())"
    )
    env = {**os.environ, "PYTHONHASHSEED": hash_seed, "PYTHONPATH": str(REPO_ROOT)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return out.stdout.strip()


def test_same_seed_same_world_in_any_process(world: World) -> None:
    # another process with another str-hash seed: catches any dependence on set iteration order
    hash_seed = "1" if os.environ.get("PYTHONHASHSEED") != "1" else "2"
    assert _hash_in_fresh_process(0, hash_seed) == world.content_hash()


def test_different_seed_different_world(world: World) -> None:
    other = generate_world(1)
    assert other.content_hash() != world.content_hash()
    assert other.corpus_hash() != world.corpus_hash()


def test_world_size_splits_and_hops(world: World) -> None:
    assert 2000 <= len(world.documents) <= 5000
    train, test = world.split("train"), world.split("test")
    assert len(train) >= 2000 and 150 <= len(test) <= 500
    assert len(train) + len(test) == len(world.questions)
    assert Counter(q.hops for q in test).keys() == {1, 2, 3}
    assert len({q.id for q in world.questions}) == len(world.questions)
    # split by start entity: no test question starts from an entity a train question starts from
    train_starts = {q.supporting_doc_ids[0] for q in train}
    assert not any(q.supporting_doc_ids[0] in train_starts for q in test)


@pytest.mark.parametrize("seed", [0, 1, 7])
def test_world_passes_its_consistency_check(seed: int) -> None:
    generate_world(seed).check()


def test_names_and_aliases_are_unique_answers(world: World) -> None:
    owners: dict[str, set[str]] = {}
    for entity in world.entities.values():
        for name in entity.answer_names:
            owners.setdefault(normalize_answer(name), set()).add(entity.id)
    assert all(len(ids) == 1 for ids in owners.values())
    for question in world.questions:
        # all golden answers of a question name one and the same entity
        assert len(set().union(*(owners[normalize_answer(a)] for a in question.golden_answers))) == 1


def test_check_catches_a_fact_stated_twice(world: World) -> None:
    person = next(e for e in world.entities.values() if e.kind == "person")
    documents = [
        dataclasses.replace(d, text=d.text + " Others say she was born in Elsewhere.")
        if d.id == person.id
        else d
        for d in world.documents
    ]
    broken = World(world.seed, world.config, world.entities, documents, world.questions)
    with pytest.raises(WorldConsistencyError, match="does not state born_in once"):
        broken.check()


def test_check_catches_a_wrong_golden_answer(world: World) -> None:
    questions = list(world.questions)
    questions[0] = dataclasses.replace(questions[0], golden_answers=("Nowhere",))
    broken = World(world.seed, world.config, world.entities, world.documents, questions)
    with pytest.raises(WorldConsistencyError, match="golden answers"):
        broken.check()


def test_solve_gives_one_query_per_hop(world: World) -> None:
    for question in world.split("test")[:50]:
        solution = world.solve(question.id)
        assert len(solution.queries) == question.hops
        assert solution.queries[0] in question.question
        assert solution.answer == question.golden_answers[0]
    with pytest.raises(KeyError):
        world.solve("no-such-question")


def test_every_hop_of_multihop_test_questions_is_retrievable(world: World, world_index: SearchIndex) -> None:
    multi_hop = [q for q in world.split("test") if q.hops >= 2]
    assert len(multi_hop) >= 100
    for question in multi_hop[:120]:
        for query, doc_id in zip(world.solve(question.id).queries, question.supporting_doc_ids, strict=True):
            top3 = [hit["id"] for hit in world_index.search(query, top_k=3)]
            assert doc_id in top3, (question.question, query, top3)
        # and the last supporting document names the answer
        assert question.golden_answers[0] in world.document(question.supporting_doc_ids[-1]).text


def test_to_instances_carry_golden_answers_and_hops(world: World) -> None:
    instances = world.to_instances("test")
    assert len(instances) == len(world.split("test"))
    first = instances[0]
    question = world.question(first.id)
    assert first.answer == list(question.golden_answers)
    assert first.metadata["hops"] == question.hops
    assert first.metadata["supporting_doc_ids"] == list(question.supporting_doc_ids)


# --- loaders -----------------------------------------------------------------------------------


def test_read_corpus_accepts_flashrag_and_title_text(tmp_path: Path) -> None:
    path = tmp_path / "corpus.jsonl"
    lines = [
        {"id": "0", "contents": '"Anarchism"\nAnarchism is a political philosophy.'},
        {"id": 1, "title": "Zorvia", "text": "Zorvia is a country."},
        {"contents": "A passage without a title line."},
    ]
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n\n", encoding="utf-8")
    docs = list(read_corpus(path))
    assert docs == [
        Document("0", "Anarchism", "Anarchism is a political philosophy."),
        Document("1", "Zorvia", "Zorvia is a country."),
        Document("2", "", "A passage without a title line."),
    ]
    gz_path = tmp_path / "corpus.jsonl.gz"
    with gzip.open(gz_path, "wt", encoding="utf-8") as out:
        out.write(path.read_text(encoding="utf-8"))
    assert list(read_corpus(gz_path, limit=2)) == docs[:2]


def test_read_corpus_names_the_bad_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"id": "0", "contents": "ok"}\n{"id": "1", "body": "no text"}\n', encoding="utf-8")
    with pytest.raises(DataFormatError, match=r"bad.jsonl:2"):
        list(read_corpus(path))


def test_load_qa_jsonl_with_answer_variants(tmp_path: Path) -> None:
    path = tmp_path / "qa.jsonl"
    rows = [
        {"id": "nq-1", "question": "who wrote it?", "golden_answers": ["Ann", "Ann B."], "data_source": "nq"},
        {"question": "where?", "answers": ["Paris"]},
        {"question": "when?", "answer": "1999"},
        {"question": "what?", "reward_model": {"ground_truth": {"target": ["x"]}}},
    ]
    path.write_text("\n".join(json.dumps(row) for row in rows), encoding="utf-8")
    instances = load_qa(path)
    assert [i.answer for i in instances] == [["Ann", "Ann B."], ["Paris"], ["1999"], ["x"]]
    assert instances[0].id == "nq-1" and instances[1].id == "qa-1"
    assert instances[0].metadata == {"data_source": "nq"}
    as_array = tmp_path / "qa.json"
    as_array.write_text(json.dumps(rows), encoding="utf-8")
    assert [i.answer for i in load_qa(as_array)] == [i.answer for i in instances]
    path.write_text(json.dumps({"question": "no answer"}), encoding="utf-8")
    with pytest.raises(DataFormatError, match="no answers"):
        load_qa(path)


def test_load_qa_parquet_in_search_r1_layout(tmp_path: Path) -> None:
    table = pa.table(
        {
            "id": ["train_0", "train_1"],
            "question": ["total number of death row inmates in the us?", "who sang it?"],
            "golden_answers": [["2,718"], ["Zed", "The Zeds"]],
            "data_source": ["nq", "hotpotqa"],
            "reward_model": [
                {"ground_truth": {"target": ["2,718"]}, "style": "rule"},
                {"ground_truth": {"target": ["Zed", "The Zeds"]}, "style": "rule"},
            ],
        }
    )
    directory = tmp_path / "nq_hotpotqa_train"
    directory.mkdir()
    pq.write_table(table, directory / "train.parquet")
    pq.write_table(table.slice(1), directory / "test.parquet")
    splits = load_qa_splits(directory)
    assert sorted(splits) == ["test", "train"]
    assert [i.answer for i in splits["train"]] == [["2,718"], ["Zed", "The Zeds"]]
    assert splits["test"][0].id == "train_1" and splits["test"][0].metadata["data_source"] == "hotpotqa"
    assert load_qa(directory / "train.parquet", limit=1)[0].question.startswith("total number")
    with pytest.raises(FileNotFoundError):
        load_qa_splits(tmp_path / "missing")


# --- the index ---------------------------------------------------------------------------------


def test_index_save_load_round_trip(tmp_path: Path, world: World, world_index: SearchIndex) -> None:
    directory = world_index.save(tmp_path / "index")
    meta = read_meta(directory)
    assert meta is not None and meta["doc_count"] == len(world.documents)
    assert meta["content_hash"] == world.corpus_hash()
    with SearchIndex.load(directory) as loaded:
        assert len(loaded) == len(world_index)
        for query in ["Zorvia", world.documents[5].title, "capital city copper", "river sea"]:
            assert loaded.search(query, top_k=5) == world_index.search(query, top_k=5)
    with SearchIndex.load(directory, mmap=True) as mapped:
        assert mapped.search(world.documents[9].title, 1)[0]["id"] == world.documents[9].id


def test_search_hits_shape_order_and_misses() -> None:
    docs = [
        Document("a", "Kelmar River", "The Kelmar River rises near Tovi. The Kelmar River is long."),
        Document("b", "Tovi", "Tovi is a city. The Kelmar River flows past Tovi."),
        Document("c", "Other", "Nothing relevant here."),
    ]
    index = SearchIndex.build(docs)
    hits = index.search("Kelmar river", top_k=10)
    assert [h["id"] for h in hits] == ["a", "b"]  # "c" shares no word and is left out
    assert set(hits[0]) == {"id", "title", "contents", "score"}
    assert hits[0]["contents"] == docs[0].text and hits[0]["score"] > hits[1]["score"] > 0
    assert index.search("zzz unknown", 3) == [] and index.search("the of and", 3) == []
    assert index.search("Kelmar", top_k=0) == []
    with pytest.raises(ValueError, match="empty corpus"):
        SearchIndex.build([])


def test_concurrent_searches_match_sequential(tmp_path: Path, world: World, world_index: SearchIndex) -> None:
    with SearchIndex.load(world_index.save(tmp_path / "index")) as index:
        queries = [doc.title for doc in world.documents[:200]]
        expected = [index.search(q, 3) for q in queries]
        results: dict[int, list[list[dict]]] = {}

        def worker(n: int) -> None:
            results[n] = [index.search(q, 3) for q in queries]

        threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert all(results[n] == expected for n in range(4))


def test_load_reports_missing_and_inconsistent_indexes(tmp_path: Path, world_index: SearchIndex) -> None:
    with pytest.raises(IndexNotFoundError):
        SearchIndex.load(tmp_path / "nothing")
    directory = world_index.save(tmp_path / "index")
    meta = json.loads((directory / "meta.json").read_text())
    (directory / "meta.json").write_text(json.dumps({**meta, "doc_count": meta["doc_count"] + 1}))
    with pytest.raises(IndexCorruptError, match="meta says"):
        SearchIndex.load(directory)


def test_ensure_world_index_builds_once_then_reuses(tmp_path: Path, world: World) -> None:
    directory = ensure_world_index(seed=0, cache_dir=tmp_path)
    assert read_meta(directory)["content_hash"] == world.corpus_hash()
    marker = directory / "meta.json"
    inode = marker.stat().st_ino
    assert ensure_world_index(seed=0, cache_dir=tmp_path) == directory
    assert marker.stat().st_ino == inode  # reused, not rewritten
    # a stale index (other content hash) is rebuilt in place
    meta = json.loads(marker.read_text())
    marker.write_text(json.dumps({**meta, "content_hash": "stale"}))
    assert ensure_world_index(seed=0, cache_dir=tmp_path) == directory
    assert read_meta(directory)["content_hash"] == world.corpus_hash()
    assert [p.name for p in tmp_path.joinpath("deepsearch").iterdir()] == [
        directory.name
    ]  # no temp dirs left


def _first_use_in_child(cache_dir: str, results: Any) -> None:
    directory = ensure_world_index(0, cache_dir)
    with SearchIndex.load(directory) as index:
        results.put((str(directory), len(index)))


def test_concurrent_first_use_from_several_processes(tmp_path: Path, world: World) -> None:
    # fork: the children start at once with everything imported, so their builds really race
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    children = [context.Process(target=_first_use_in_child, args=(str(tmp_path), results)) for _ in range(4)]
    for child in children:
        child.start()
    for child in children:
        child.join(timeout=120)
    assert [child.exitcode for child in children] == [0, 0, 0, 0]
    outcomes = {results.get(timeout=5) for _ in children}
    assert outcomes == {(str(tmp_path / "deepsearch" / "world-seed0"), len(world.documents))}
    assert [p.name for p in tmp_path.joinpath("deepsearch").iterdir()] == ["world-seed0"]


def test_build_index_cli_from_corpus_and_world(
    tmp_path: Path, world: World, capsys: pytest.CaptureFixture
) -> None:
    corpus = world.write_corpus(tmp_path / "corpus.jsonl")
    assert build_index_cli.main(["--corpus", str(corpus), "--out", str(tmp_path / "from-corpus")]) == 0
    assert f"indexed {len(world.documents)} passages" in capsys.readouterr().out
    export = tmp_path / "export"
    args = ["--world-seed", "0", "--out", str(tmp_path / "from-world"), "--export-qa", str(export)]
    assert build_index_cli.main(args) == 0
    # the exported corpus round-trips through the loader into the same content hash
    assert (
        read_meta(tmp_path / "from-corpus")["content_hash"]
        == read_meta(tmp_path / "from-world")["content_hash"]
    )
    assert len(load_qa(export / "test.jsonl")) == len(world.split("test"))
    assert (
        build_index_cli.main(["--corpus", str(tmp_path / "missing.jsonl"), "--out", str(tmp_path / "x")]) == 2
    )


# --- the task ----------------------------------------------------------------------------------


def _episode(instance, response: str) -> Episode:
    return Episode(
        instance=instance,
        messages=[],
        final_response=response,
        final_answer=None,
        tool_calls=[],
        turns=2,
        terminated=True,
        truncated=False,
    )


def test_task_reward_em_f1_and_format_bonus() -> None:
    task = DeepSearchTask(world_seed=0, format_reward=0.1)
    instance = task.instances("test")[0]
    gold = instance.answer[0]

    def score(response: str, on: DeepSearchTask = task) -> dict:
        return asyncio.run(on.reward(_episode(instance, response)))

    assert score(f"<think>...</think><answer> {gold} </answer>") == {
        "reward": 1.0,
        "em": 1.0,
        "f1": 1.0,
        "format": 1.0,
        "evidence": 0.0,  # no search in these episodes
        "redundant_searches": 0.0,
        "false_kind_claims": 0.0,
    }
    assert score("<answer>Nowhere</answer>") == {
        "reward": 0.1,
        "em": 0.0,
        "f1": 0.0,
        "format": 1.0,
        "evidence": 0.0,
        "redundant_searches": 0.0,
        "false_kind_claims": 0.0,
    }
    assert score(f"I think it is {gold}") == {
        "reward": 0.0,
        "em": 0.0,
        "f1": 0.0,
        "format": 0.0,
        "evidence": 0.0,
        "redundant_searches": 0.0,
        "false_kind_claims": 0.0,
    }
    assert score("<answer>Nowhere</answer>", on=DeepSearchTask(world_seed=0))["reward"] == 0.0


def test_kind_claims_the_world_contradicts_are_counted(world: World) -> None:
    """The kinds oracle's statements are all true on every question of the world (with and without
    its hop limit); each kind of false statement GRPO was seen to make counts once."""
    for question in world.questions:
        for max_hops in (None, 2, 1):
            turns = oracle_turns(world, question.id, max_hops=max_hops, style="kinds")
            assert false_kind_claims(world, question.id, turns) == 0, (question.id, max_hops)
    question = next(
        q for q in world.questions if q.hops == 3 and q.question.startswith("What is the capital")
    )
    city, country = world.solve(question.id).queries[1:]
    capital = question.golden_answers[0]
    false_statements = [
        "The question asks for a city. I need to look up X.",  # it asks for a capital
        f"{city} is a country, not a capital. I need to look up {city}.",  # a city
        f"{city} is a city, not a city proper. I need to look up {city}.",  # not the kind asked
        f"{country} is a capital, not a capital.",  # contradicts itself
        f"{city} is a city, as the question asks.",  # it asks for a capital
        "Nowhereland is a capital, as the question asks.",  # no such name
    ]
    for statement in false_statements:
        assert false_kind_claims(world, question.id, [statement]) == 1, statement
    assert false_kind_claims(world, question.id, [f"{capital} is a capital, as the question asks."]) == 0
    assert false_kind_claims(world, question.id, ["Free text: Sugli is a city. Maybe."]) == 0  # not judged
    task = DeepSearchTask(world_seed=0, kind_claim_cost=0.3)
    said = [{"role": "assistant", "content": statement} for statement in false_statements[:2]]
    instance = next(i for i in task.instances(question.split) if i.id == question.id)
    episode = Episode(instance, said, false_statements[1], None, [], 2, terminated=True, truncated=False)
    scores = asyncio.run(task.reward(episode))
    assert (scores["false_kind_claims"], scores["reward"]) == (2.0, pytest.approx(-0.6))


def test_task_instances_prompt_and_mcp_config(tmp_path: Path, world: World) -> None:
    task = DeepSearchTask(world_seed=0, cache_dir=tmp_path, top_k=5)
    assert task.splits() == ["train", "test"]
    assert [i.id for i in task.instances("test")] == [q.id for q in world.split("test")]
    assert "search" in task.system_prompt and "<answer>" in task.system_prompt
    server = task.mcp_config()["mcpServers"]["search"]
    assert server["command"] == sys.executable and server["timeout_s"] == 30
    assert server["args"][:2] == ["-m", "rlf_envs.tasks.deepsearch.server"]
    index_dir = Path(server["args"][server["args"].index("--index") + 1])
    assert read_meta(index_dir)["content_hash"] == world.corpus_hash()
    assert server["args"][server["args"].index("--top-k") + 1] == "5"
    with pytest.raises(KeyError, match="no split"):
        task.instances("validation")


def test_task_on_real_data_files(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(json.dumps({"id": "0", "contents": '"Zorvia"\nZorvia is a country.'}) + "\n")
    qa = tmp_path / "qa.jsonl"
    qa.write_text(json.dumps({"question": "Which country?", "golden_answers": ["Zorvia"]}) + "\n")
    task = DeepSearchTask(qa_path=qa, corpus_path=corpus, cache_dir=tmp_path / "cache")
    assert task.instances("train")[0].answer == ["Zorvia"]
    index_dir = task.index_path()
    assert SearchIndex.load(index_dir).search("Zorvia")[0]["id"] == "0"
    with pytest.raises(ValueError, match="corpus_path or index_dir"):
        DeepSearchTask(qa_path=qa)
    with pytest.raises(FileNotFoundError):
        DeepSearchTask(index_dir=tmp_path / "none").index_path()
