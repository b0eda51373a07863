"""Helpers shared by the tests: plain functions, classes and constants (fixtures are in conftest.py).

Import them from here (``from tests.helpers import free_local_port, http_server``), never from another
``test_*.py`` file. What is here:

- MCP servers: the ``mcpServers`` entries of the fixture servers in ``tests/mcp_fixtures/``
  (:func:`faulty_server`, :func:`tiny_server`) and of the latency server, :func:`http_server` (an
  MCP server over streamable HTTP as a subprocess), :func:`free_local_port` (from ``rlf_envs.ports``),
  :func:`wait_for_port`, :func:`pid_alive`, :data:`LoopThread`;
- OpenAI-compatible servers: :class:`OpenAITestServer` (scripted, in this process) and
  :func:`rlf_serve` (``python -m rlf_serve.app`` as a subprocess);
- the tiny random Qwen3: :data:`TINY_MODEL_KWARGS`, :func:`build_tiny_model`, :func:`tiny_model_path`,
  :func:`forward_logprobs`, :data:`LOGPROB_ATOL`;
- trainer runs: :func:`tiny_config`, :func:`train_py_command`, :func:`text_reward` (and
  :func:`text_score`, the same without ``em``), :func:`model_params`;
- guidance: :func:`echo_turn` and :func:`echo_demonstrator` (a scripted agent for tiny_test.yaml's
  echo questions: one ``sleep`` tool call, then the right answer).
- multi-process launches: :func:`torchrun`, :func:`accelerate_launch`, :func:`train_py`, :func:`record`
  (tests/dist_scripts/train_and_record.py), :func:`launch`, :func:`launch_with_fault`, :func:`faulty`,
  :func:`ranks`, :func:`max_diff`, :func:`same_metrics`.

torch, transformers and the trainer are imported inside the functions that need them, so importing
this module stays cheap for the env tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from rlf_envs.loop_thread import LoopThread as EnvLoopThread
from rlf_envs.ports import free_local_port
from rlf_envs.rewards.rules import exact_match

REPO = Path(__file__).resolve().parents[1]
MCP_FIXTURES = REPO / "tests" / "mcp_fixtures"
FAULTY_SERVER = str(MCP_FIXTURES / "faulty_server.py")
TINY_SERVER = str(MCP_FIXTURES / "tiny_server.py")
TINY_CONFIG = REPO / "examples" / "configs" / "tiny_test.yaml"
LOGPROB_ATOL = 2e-3  # float32 on both sides; vLLM's fused kernels sum in another order

# The tests drive pools (and the scripted OpenAI server) on the same kind of loop thread the envs use.
LoopThread = EnvLoopThread


# ------------------------------------------------------------------------------------------------
# MCP servers
# ------------------------------------------------------------------------------------------------


def faulty_server(prefix: str = "", *extra_args: str, **keys: Any) -> dict[str, Any]:
    """An ``mcpServers`` entry running faulty_server.py over stdio, its tools named ``prefix + name``."""
    return {
        "command": sys.executable,
        "args": [FAULTY_SERVER, "--prefix", prefix, *extra_args],
        "env": {"PYTHONPATH": str(REPO)},  # run as a script, it needs the repo to import rlf_envs
        **keys,
    }


def tiny_server(prefix: str = "", *extra_args: str, **keys: Any) -> dict[str, Any]:
    """An ``mcpServers`` entry running tiny_server.py (no SDK, starts in milliseconds) over stdio."""
    return {"command": sys.executable, "args": [TINY_SERVER, "--prefix", prefix, *extra_args], **keys}


def latency_server(*extra_args: str, **keys: Any) -> dict[str, Any]:
    """An ``mcpServers`` entry running ``python -m rlf_envs.servers.latency`` over stdio."""
    return {
        "command": sys.executable,
        "args": ["-m", "rlf_envs.servers.latency", *extra_args],
        "cwd": str(REPO),
        **keys,
    }


@contextlib.contextmanager
def http_server(
    argv: list[str], port: int, ready_timeout_s: float = 30.0
) -> Iterator[subprocess.Popen[bytes]]:
    """Run an MCP server over streamable HTTP on 127.0.0.1:``port`` until the block ends.

    ``argv`` is the command without transport flags; yields once the port accepts connections.
    """
    command = [*argv, "--transport", "http", "--host", "127.0.0.1", "--port", str(port)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    process = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.DEVNULL)
    try:
        wait_for_port(port, process, ready_timeout_s)
        yield process
    finally:
        process.kill()
        process.wait(timeout=10)


def wait_for_port(port: int, process: subprocess.Popen[bytes], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"server exited with {process.returncode} before accepting connections")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"nothing accepted connections on port {port} within {timeout_s} s"
                ) from None
            time.sleep(0.05)


def pid_alive(pid: int) -> bool:
    """Whether the process exists and is not a zombie waiting to be reaped."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            state = stat.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state not in ("Z", "X")


# ------------------------------------------------------------------------------------------------
# OpenAI-compatible servers
# ------------------------------------------------------------------------------------------------


_JUDGE_PROMPT = re.compile(r"Reference answer\(s\): (.*)\nCandidate answer: (.*)\n")


def scripted_reply(body: dict[str, Any]) -> str:
    """What the test server answers: a verdict to a judge prompt, else ``[model] USER TEXT``."""
    user = next(m["content"] for m in reversed(body["messages"]) if m["role"] == "user")
    judge = _JUDGE_PROMPT.search(user)
    if judge is None:
        return f"[{body.get('model')}] {user.upper()}"
    correct = exact_match(judge.group(2), judge.group(1).split(" | "))
    if "Reply with yes or no" in user:
        return "yes" if correct else "no"
    return f"<score>{int(correct)}</score>"


class OpenAITestServer:
    """A real OpenAI-compatible ``/v1/chat/completions`` server on its own loop thread.

    Replies with :func:`scripted_reply`. The model name scripts failures: ``fail-<status>`` answers
    that HTTP status, ``hang`` never answers, ``garbage`` answers a 200 that is not JSON, ``empty``
    an empty message. Knobs: ``delay_s`` before each reply, ``fail_first`` (HTTP 500 for the first
    k requests), ``reply`` (a fixed reply text), ``responder`` (a function of the request body
    that returns the reply text). Counters: ``requests``, ``in_flight``,
    ``peak_in_flight``, ``bodies``, ``authorizations`` (each request's ``Authorization`` header, or None).
    """

    def __init__(self) -> None:
        self._loop = LoopThread()
        self._runner: web.AppRunner | None = None
        self.port = 0
        self.reset()

    def reset(self) -> None:
        self.delay_s = 0.0
        self.fail_first = 0
        self.reply: str | None = None
        self.responder: Callable[[dict[str, Any]], str] | None = None
        self.requests = 0
        self.in_flight = 0
        self.peak_in_flight = 0
        self.bodies: list[dict[str, Any]] = []
        self.authorizations: list[str | None] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> OpenAITestServer:
        self._loop.run(self._start())
        return self

    async def _start(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._handle)
        # handler_cancellation: a client that gives up (timeout) ends the handler of a hung request
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=True, shutdown_timeout=1.0)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        self.port = self._runner.addresses[0][1]

    def stop(self) -> None:
        if self._runner is not None:
            self._loop.run(self._runner.cleanup())
        self._loop.close()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        self.requests += 1
        self.in_flight += 1
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        try:
            body = await request.json()
            self.bodies.append(body)
            self.authorizations.append(request.headers.get("Authorization"))
            model = str(body.get("model", ""))
            if self.requests <= self.fail_first:
                return web.json_response({"error": {"message": "scripted overload"}}, status=500)
            if model.startswith("fail-"):
                return web.json_response({"error": {"message": "scripted failure"}}, status=int(model[5:]))
            if model == "hang":
                await asyncio.sleep(60)
            if model == "garbage":
                return web.Response(text="<html>not a completion</html>")
            await asyncio.sleep(self.delay_s)
            if model == "empty":
                text = ""
            elif self.responder is not None:
                text = self.responder(body)
            else:
                text = self.reply if self.reply is not None else scripted_reply(body)
            return web.json_response(
                {
                    "id": "chatcmpl-test",
                    "object": "chat.completion",
                    "model": model,
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": text},
                            "finish_reason": "stop",
                        }
                    ],  # fmt: skip
                    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
                }
            )
        finally:
            self.in_flight -= 1


@contextlib.contextmanager
def rlf_serve(model_dir: Path, *extra_args: str, ready_timeout_s: float = 180.0) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:  # fmt: skip
    """``python -m rlf_serve.app`` on a free port, serving ``model_dir`` as model "tiny"; yields (base_url, process).

    One torch thread: on a small shared CPU, more threads of a tiny model mostly wait for each other.
    """
    port = free_local_port()
    command = [sys.executable, "-m", "rlf_serve.app", "--model", str(model_dir), "--served-model-name", "tiny",
               "--port", str(port), "--threads", "1", "--dtype", "float32", *extra_args]  # fmt: skip
    # fp32 unless the test asks otherwise: the tests compare with fp32 forwards and trainers, and
    # --dtype auto would pick bf16 on a CPU that has it
    with tempfile.TemporaryFile() as log:
        process = subprocess.Popen(command, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=log, stderr=log)  # fmt: skip
        try:
            try:
                wait_for_port(port, process, ready_timeout_s)
            except (RuntimeError, TimeoutError):
                log.seek(0)
                raise RuntimeError(
                    f"rlf-serve did not start:\n{log.read().decode(errors='replace')[-3000:]}"
                ) from None
            yield f"http://127.0.0.1:{port}/v1", process
        finally:
            process.kill()
            process.wait(timeout=30)


# ------------------------------------------------------------------------------------------------
# The tiny random Qwen3
# ------------------------------------------------------------------------------------------------


TINY_MODEL_KWARGS: dict[str, Any] = {
    "vocab_size": 1024,
    "hidden": 64,
    "layers": 2,
    "heads": 4,
    "head_dim": 32,
    "seed": 0,
}


def build_tiny_model(root: str | Path) -> Path:
    """The tiny Qwen3 every trainer test uses, built (or reused) under ``root``."""
    from rlf_trainer.data.models import build_tiny_qwen3

    return build_tiny_qwen3(Path(root) / "tiny-qwen3", **TINY_MODEL_KWARGS)


def tiny_model_path() -> Path:
    """The tiny Qwen3 of the trainer tests, built once into a shared folder and reused by later runs."""
    pytest.importorskip("transformers")
    root = Path(os.environ.get("RLF_TEST_MODELS_DIR", Path(tempfile.gettempdir()) / "rlf-test-models"))
    return build_tiny_model(root)


def forward_logprobs(model: Any, prompt: list[int], completion: list[int]) -> Any:
    """Raw log p(completion_t | prompt + completion_<t) from one unpadded forward pass."""
    import torch

    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float()
    return torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(completion)[:, None]).squeeze(1)


# ------------------------------------------------------------------------------------------------
# Trainer runs
# ------------------------------------------------------------------------------------------------


def text_reward(episode) -> dict[str, float]:
    """A reward with spread for a random model: a deterministic function of the final turn's text."""
    return {"reward": (sum(map(ord, episode.final_response)) % 5) / 4, "em": 0.0}


def text_score(episode) -> dict[str, float]:
    """:func:`text_reward` without ``em``: a reward whose env says nothing about correctness."""
    return {"reward": text_reward(episode)["reward"]}


class ScriptedTextPolicy:
    """A Policy whose next turn is :meth:`turn` of the prompt's text; its token ids are the canonical
    encoding of that text plus the end-of-turn token (what a policy writing it would have sampled),
    log-probs 0. Subclasses say which text."""

    def __init__(self, tokenizer: Any) -> None:
        from rlf_trainer.rollout.trajectory import turn_end_id

        self.tokenizer, self.end_id = tokenizer, turn_end_id(tokenizer)

    def turn(self, prompt_text: str) -> str:
        raise NotImplementedError

    def generate(self, prompts: list[list[int]], params: Any) -> list[Any]:
        from rlf_trainer.policy import Completion
        from rlf_trainer.rollout import chat

        out = []
        for prompt in prompts:
            turn = self.turn(self.tokenizer.decode(prompt))
            ids = chat.encode(self.tokenizer, turn) + [self.end_id]
            out.append(Completion(ids, [0.0] * len(ids), turn, "stop"))
        return out

    def update_weights(self, model: Any) -> None:
        """Nothing to sync: the turns are scripted."""

    def sleep(self) -> None:
        """No engine."""

    def wake_up(self) -> None:
        """No engine."""


def tiny_config(tiny_model_dir: Path, run_dir: Path, *overrides: str) -> Any:
    """examples/configs/tiny_test.yaml on the tiny model, logging to ``run_dir``, rewarded by :func:`text_reward`.

    fp32 unless an override says otherwise: the tests' exact figures must not depend on whether the
    machine's CPU has bf16 (``mixed_precision: auto``); the bf16 tests ask for it.
    """
    from rlf_trainer.config import load_config

    config = load_config(
        TINY_CONFIG,
        [
            f"model.path={tiny_model_dir}",
            "model.prepare=null",
            f"logging.dir={run_dir}",
            f"env.kwargs.mcp_servers.mcpServers.latency.command={sys.executable}",
            "logging.progress_bar=false",
            "mixed_precision=no",
            *overrides,
        ],
    )
    config.env.kwargs["reward"] = text_reward  # objects from Python go straight into the env kwargs
    return config


def train_py_command(tiny_model_dir: Path, log_dir: Path, *overrides: str) -> list[str]:
    """``python examples/train.py`` on the tiny config, as a user starts it, with ``overrides``."""
    return [
        sys.executable,
        str(REPO / "examples" / "train.py"),
        "--config",
        str(TINY_CONFIG),
        f"model.path={tiny_model_dir}",
        "model.prepare=null",
        f"logging.dir={log_dir}",
        f"env.kwargs.mcp_servers.mcpServers.latency.command={sys.executable}",
        *overrides,
    ]


def model_params(trainer: Any) -> dict[str, Any]:
    """A detached copy of every parameter and buffer of the trainer's (unwrapped) model."""
    model = trainer.accelerator.unwrap_model(trainer.model)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


TOOL_CALL_TEXT = '<tool_call>\n{"name": "sleep", "arguments": {"ms": 1}}\n</tool_call>'


def tool_calling_model_path(steps: int = 300) -> Path:
    """The tiny Qwen3 taught to answer every user turn with :data:`TOOL_CALL_TEXT` (the latency server's ``sleep``).

    A random tiny model never writes a tool call, so runs of it have no tool calls to show. This
    copy is fitted (AdamW, ``steps`` steps, loss on the reply only) to make that one call after the
    first-turn prompts of RLF/ToolUse-v0 over the latency server (its real tool schemas in the
    system prompt): seconds on a CPU; built once into the shared test-models folder and reused.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlf_trainer.rollout import chat

    base = tiny_model_path()
    out = base.parent / f"tiny-qwen3-sleep-caller-{steps}"
    if (out / "model.safetensors").is_file():
        return out
    tokenizer = AutoTokenizer.from_pretrained(base)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    reply = chat.encode(tokenizer, TOOL_CALL_TEXT + "<|im_end|>")
    rows = [(prompt, reply) for prompt in _latency_env_prompts(tokenizer)]
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model.train()
    for step in range(steps):
        prompt, target = rows[step % len(rows)]
        ids = torch.tensor([prompt + target])
        labels = torch.tensor([[-100] * len(prompt) + target])
        loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return save_model_atomically(model, tokenizer, out)


def _latency_env_prompts(tokenizer: Any) -> list[list[int]]:
    """The first-turn prompt ids of RLF/ToolUse-v0 over the latency server, as a trainer renders them."""
    import gymnasium as gym

    from rlf_envs.servers.launch import stdio_server_entry
    from rlf_trainer.rollout import chat

    words = ("ping", "pong", "zorvia", "velmora", "quill", "arbor", "lumen", "brisk")
    env = gym.make(
        "RLF/ToolUse-v0",
        mcp_servers={"mcpServers": {"latency": stdio_server_entry("rlf_envs.servers.latency", timeout_s=30)}},
        tasks=[{"id": w, "question": f"Echo the word {w}.", "answer": w} for w in words],
        reward="exact_match",
    )
    prompts = []
    try:
        for index in range(len(words)):
            _, info = env.reset(options={"task_index": index})
            prompts.append(chat.prompt_ids(tokenizer, info["messages"], info["tools"]))
    finally:
        env.close()
    return prompts


ANSWER_WORDS = ("ping", "pong", "zorvia", "velmora")  # the answers of examples/configs/tiny_test.yaml


def echo_prompts(tokenizer: Any) -> list[list[int]]:
    """The first-turn prompt ids of RLF/ToolUse-v0 on tiny_test.yaml's echo questions, without tools."""
    import gymnasium as gym

    from rlf_trainer.rollout import chat

    tasks = [
        {"id": f"t{i}", "question": f"Echo the word {w}.", "answer": w} for i, w in enumerate(ANSWER_WORDS)
    ]
    env = gym.make("RLF/ToolUse-v0", tasks=tasks, reward="exact_match")
    try:
        infos = [env.reset(options={"task_index": index})[1] for index in range(len(tasks))]
    finally:
        env.close()
    return [chat.prompt_ids(tokenizer, info["messages"], info["tools"]) for info in infos]


def answering_model_path(steps: int = 96) -> Path:
    """The tiny Qwen3 taught to answer tiny_test.yaml's echo questions (asked without tools) with
    ``<answer>W</answer>``, W any of :data:`ANSWER_WORDS` whatever the question: a policy that ends
    its turns and varies within a group (about one answer in four is right), for a run that should
    look healthy.

    Fitted like :func:`tool_calling_model_path`, every prompt seeing every word in turn; built once
    into the shared test-models folder and reused.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlf_trainer.rollout import chat

    base = tiny_model_path()
    out = base.parent / f"tiny-qwen3-answerer-{steps}"
    if (out / "model.safetensors").is_file():
        return out
    tokenizer = AutoTokenizer.from_pretrained(base)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    prompts = echo_prompts(tokenizer)
    replies = [chat.encode(tokenizer, f"<answer>{word}</answer><|im_end|>") for word in ANSWER_WORDS]
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-3)
    model.train()
    for step in range(steps):
        prompt, target = prompts[step % len(prompts)], replies[(step + step // len(prompts)) % len(replies)]
        ids = torch.tensor([prompt + target])
        labels = torch.tensor([[-100] * len(prompt) + target])
        model(input_ids=ids, labels=labels).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return save_model_atomically(model, tokenizer, out)


def save_model_atomically(model: Any, tokenizer: Any, out: Path) -> Path:
    """Save a fitted test model to ``out`` through a temporary folder and one rename.

    Several test processes (pytest-xdist workers, parallel runs) may fit the same model at once:
    the first rename wins and the others keep its folder (the fit is deterministic), so a process
    that is reading ``out`` never sees it deleted or half written.
    """
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        tmp.rename(out)  # atomic; fails when another process's folder is already there
    except OSError:
        if not (out / "model.safetensors").is_file():
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


ECHO_QUESTION = re.compile(r"Echo the word (\w+)\.")


def echo_turn(word: str, turn: int) -> str:
    """Turn ``turn`` of a perfect player of tiny_test.yaml's questions: a ``sleep`` call, then the answer."""
    if turn == 0:
        return f'Let me check.\n<tool_call>\n{{"name": "sleep", "arguments": {{"ms": 1, "payload": "{word}"}}}}\n</tool_call>'
    return f"<answer>{word}</answer>"


def echo_demonstrator(messages: list[dict[str, Any]], info: dict[str, Any]) -> str:
    """A scripted agent ``fn(messages, info)`` (rlf-collect's ``--agent tests.helpers:echo_demonstrator``,
    guidance's ``algorithm.guidance.demonstrator``) that solves tiny_test.yaml's echo questions."""
    question = next(m["content"] for m in messages if m.get("role") == "user")
    match = ECHO_QUESTION.search(question)
    if match is None:
        raise ValueError(f"not an echo question: {question!r}")
    return echo_turn(match.group(1), sum(1 for m in messages if m.get("role") == "assistant"))


# ------------------------------------------------------------------------------------------------
# Multi-process launches (tests/test_distributed.py, tests/test_distributed_vllm.py)
# ------------------------------------------------------------------------------------------------


SCRIPTS = REPO / "tests" / "dist_scripts"
LAUNCH_TIMEOUT_S = 420  # a generous hang guard: a 2-process tiny run takes ~1 min on a busy 2-core machine
SMALL = (
    "rollout.max_new_tokens=8",
    "eval.num_prompts=2",
    "eval.samples_to_log=2",
    "distributed.timeout_s=30",
    "logging.progress_bar=false",
    "mixed_precision=no",  # the launches compare figures across process counts (tiny_config's rule)
)


def launch_env() -> dict[str, str]:
    """This environment less any launcher's variables (the test itself may run under one), one thread a rank."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("ACCELERATE_", "RANK", "WORLD_SIZE", "MASTER_"))
    }
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env["OMP_NUM_THREADS"] = "1"
    return env


def launch(args: list[str], log: Path, timeout_s: float = LAUNCH_TIMEOUT_S) -> tuple[int, str]:
    """Run a launcher command; returns its exit status and its output (stdout and stderr together)."""
    with log.open("w") as out:
        proc = subprocess.run(
            args, stdout=out, stderr=subprocess.STDOUT, env=launch_env(), cwd=REPO, timeout=timeout_s
        )
    return proc.returncode, log.read_text(errors="replace")


def launch_with_fault(args: list[str], log: Path, fault: Path, after_fault_s: float) -> tuple[int, str]:
    """Like :func:`launch`, but every rank must be gone within ``after_fault_s`` of the fault.

    The fault file holds the fault's time; a launch still running ``after_fault_s`` later is a
    hang: its process group is killed and the test fails (a hang guard, not a speed check).
    """
    started = time.time()
    with log.open("w") as out:
        proc = subprocess.Popen(
            args, stdout=out, stderr=subprocess.STDOUT, env=launch_env(), cwd=REPO, start_new_session=True
        )
        try:
            while proc.poll() is None and not fault.exists():
                if time.time() - started > LAUNCH_TIMEOUT_S:
                    raise subprocess.TimeoutExpired(args, LAUNCH_TIMEOUT_S)
                time.sleep(0.2)
            if proc.poll() is None:
                time.sleep(0.2)  # the fault file is written just before the fault
                deadline = float(fault.read_text()) + after_fault_s
                proc.wait(timeout=max(deadline - time.time(), 0.0))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()
            pytest.fail(
                f"the launch still ran {after_fault_s:.0f} s after the fault:\n{log.read_text()[-4000:]}"
            )
    if fault.exists():
        print(f"fault on rank 1 -> every rank gone: {time.time() - float(fault.read_text()):.1f} s")
    return proc.returncode, log.read_text(errors="replace")


def torchrun(nproc: int, *args: str) -> list[str]:
    """``torchrun --standalone`` (a free rendezvous port) of ``nproc`` processes."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", *args]


def accelerate_launch(*args: str) -> list[str]:
    """``accelerate launch`` with ``args`` (a ``--config_file`` first, then the script)."""
    return [sys.executable, "-m", "accelerate.commands.launch", *args]


def train_py(model: Path, log_dir: Path, *overrides: str) -> list[str]:
    """examples/train.py on tiny_test.yaml, :data:`SMALL`, for a launcher to start (no interpreter first)."""
    return [
        str(REPO / "examples" / "train.py"),
        "--config",
        str(TINY_CONFIG),
        f"model.path={model}",
        "model.prepare=null",
        f"logging.dir={log_dir}",
        f"env.kwargs.mcp_servers.mcpServers.latency.command={sys.executable}",
        *SMALL,
        *overrides,
    ]


def record(out: Path, model: Path, run_dir: Path, *overrides: str) -> list[str]:
    """tests/dist_scripts/train_and_record.py: the run, and what each rank played, in ``out``."""
    return [str(SCRIPTS / "train_and_record.py"), str(out), str(model), str(run_dir), *SMALL, *overrides]


def ranks(out: Path, world: int) -> list[dict[str, Any]]:
    """The ``rank_<r>.json`` records :func:`record` wrote."""
    return [json.loads((out / f"rank_{r}.json").read_text()) for r in range(world)]


def max_diff(a: dict[str, Any], b: dict[str, Any]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


# How the work was cut (padding, tokens per process) and how long it took depend on the process count.
_WORK_FIGURES = (
    "time/",
    "samples/s",
    "update/pad_fraction",
    "update/tokens",
    "rollout/tokens",
    "rollout/generated_tokens",
)


def same_metrics(a: dict[str, float], b: dict[str, float], tol: float = 1e-5) -> None:
    keys = {k for k in a if not k.startswith(_WORK_FIGURES)}
    assert keys == {k for k in b if not k.startswith(_WORK_FIGURES)}
    for key in keys:
        assert a[key] == pytest.approx(b[key], rel=tol, abs=tol), key


def faulty(mode: str, fault_file: Path, at_step: int = 2) -> tuple[str, ...]:
    """Overrides for tests/dist_scripts/faulty_env.py: rank 1 fails (``mode``) in its ``at_step``-th env step."""
    return (
        "env.id=tests.dist_scripts.faulty_env:RLFTest/FaultyToolUse-v0",
        f"env.kwargs.fail_mode={mode}",
        f"env.kwargs.fail_at_step={at_step}",
        f"env.kwargs.fault_file={fault_file}",
        "eval.every=0",
    )
