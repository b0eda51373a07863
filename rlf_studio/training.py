"""The Train tab's backend: a form's values as a checked trainer config, its command, and the run.

The config is the trainer's own (:mod:`rlf_trainer.config`, checked by its own loader), pointing
the env at the project's files; the run is ``python examples/train.py --config X`` (or
``accelerate launch ... examples/train.py --config X``) in a subprocess that writes into the
project's ``runs/<run name>/``.

Example:
    >>> import tempfile
    >>> from rlf_studio.project import create_project
    >>> project = create_project(Path(tempfile.mkdtemp()), "p")
    >>> _ = project.write_text(project.train_tasks, '{"question": "q", "answer": "a"}\\n')
    >>> data = config_dict(project, TrainForm(model="tiny-qwen3", run_name="r1", max_steps=2))
    >>> data["model"], data["env"]["kwargs"]["reward"], data["max_steps"]
    ({'path': '', 'prepare': 'tiny-qwen3'}, 'exact_match', 2)
    >>> config_dict(project, TrainForm(max_steps=-1))
    Traceback (most recent call last):
    ...
    rlf_studio.training.TrainConfigError: steps must be at least 1 (got -1)
    >>> form_problems(TrainForm(max_steps=0, group_size=1))
    ['steps must be at least 1 (got 0)', 'group size must be at least 2: GRPO-style losses compare the samples of one prompt with each other (got 1)']
    >>> config_dict(project, TrainForm(env_id="RLF/Codebook-v0"))["env"]
    {'id': 'RLF/Codebook-v0', 'kwargs': {}, 'import_kwargs': {}}
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from rlf_studio.project import Project, check_name
from rlf_studio.rewards import load_spec
from rlf_trainer.config import ConfigError, from_dict
from rlf_trainer.names import LOSS_NAMES

# rlf-models names the trainer can build offline (model.prepare)
PREPARED_MODELS = ("tiny-qwen3", "smollm2-135m")
PROJECT_ENV = "RLF/ToolUse-v0"  # the project's own tools, tasks and reward
SIMULATED_ENV = "RLF/CustomerService-v0"  # takes a user simulator endpoint
SFT = "sft"  # the form's algorithm choice for algorithm.name: sft (docs/sft.md)
ALGORITHM_CHOICES = (*LOSS_NAMES, SFT)  # the GRPO-family losses, then supervised fine-tuning
ENV_CHOICES = (
    PROJECT_ENV,
    "RLF/Codebook-v0",
    "RLF/DeepSearch-v0",
    "RLF/SQL-v0",
    "RLF/PythonTool-v0",
    SIMULATED_ENV,
)
REWARD_MODULE = "studio_reward"
REWARD_MODULE_TEXT = '''"""Written by RLF Studio: the project's reward.json as the env's reward (rlf_studio.rewards)."""

from pathlib import Path

from rlf_studio.rewards import load_project_reward

reward = load_project_reward(Path(__file__).resolve().parent)
'''


class TrainConfigError(ValueError):
    """The form does not make a valid trainer config."""


@dataclass
class TrainForm:
    """What the Train tab's form holds."""

    model: str = "tiny-qwen3"
    run_name: str = "run1"
    loss: str = "grpo"
    group_size: int = 2
    prompts_per_step: int = 2
    lr: float = 1e-5
    max_steps: int = 2
    max_turns: int = 2
    max_new_tokens: int = 64
    max_total_tokens: int = 1024
    beta: float = 0.0
    backend: str = "hf"
    launcher: str = "python"
    accelerate_config: str = ""
    eval_every: int = 0
    checkpoint_every: int = 1
    env_id: str = PROJECT_ENV
    sim_base_url: str = ""
    sim_model: str = ""
    sft_data: str = ""  # algorithm sft: a chat-messages JSONL (rlf-collect writes one)

    @classmethod
    def from_values(cls, values: list[Any]) -> TrainForm:
        """The form from the widgets' values, in field order."""
        names = [f.name for f in dataclasses.fields(cls)]
        form = cls(**dict(zip(names, values, strict=True)))
        for f in dataclasses.fields(cls):
            value = getattr(form, f.name)
            if f.type == "int":
                setattr(form, f.name, int(value))
            elif f.type == "float":
                setattr(form, f.name, float(value))
            elif value is None:
                setattr(form, f.name, "")
        return form

    def values(self) -> list[Any]:
        return [getattr(self, f.name) for f in dataclasses.fields(self)]


def _model_section(model: str) -> dict[str, Any]:
    model = (model or "").strip()
    if not model:
        raise TrainConfigError("give a model: a folder, a Hugging Face id, or tiny-qwen3 / smollm2-135m")
    if model in PREPARED_MODELS:
        return {"path": "", "prepare": model}
    return {"path": model, "prepare": None}


def _reward_kwargs(project: Project) -> tuple[dict[str, Any], dict[str, Any]]:
    """(env.kwargs entries, env.import_kwargs entries) for the project's reward."""
    spec = load_spec(project.reward_path)
    parts = [c for c in spec.get("components", []) if float(c.get("weight", 1)) != 0]
    rules = ("exact_match", "f1", "contains", "math")
    if len(parts) == 1 and parts[0]["name"] in rules and float(parts[0].get("weight", 1)) == 1.0:
        return {"reward": parts[0]["name"]}, {}
    project.write_text(project.root / f"{REWARD_MODULE}.py", REWARD_MODULE_TEXT)
    return {}, {"reward": f"{REWARD_MODULE}:reward"}


def _env_section(project: Project, form: TrainForm) -> dict[str, Any]:
    """The config's ``env``: the project's tools, tasks and reward, or a bundled env with its own."""
    env_id = (form.env_id or PROJECT_ENV).strip()
    if env_id not in ENV_CHOICES:
        raise TrainConfigError(f"unknown env {env_id!r}; the studio trains: {', '.join(ENV_CHOICES)}")
    if env_id != PROJECT_ENV:
        kwargs: dict[str, Any] = {}
        url, model = (form.sim_base_url or "").strip(), (form.sim_model or "").strip()
        if env_id == SIMULATED_ENV and (url or model):
            if not (url and model):
                raise TrainConfigError("the user simulator needs both an endpoint URL and a model name")
            kwargs["user_simulator"] = {"base_url": url, "model": model}
        return {"id": env_id, "kwargs": kwargs, "import_kwargs": {}}
    if not project.has_tasks:
        raise TrainConfigError("the project has no tasks yet: save some in the Data tab")
    kwargs = {"tasks": str(project.train_tasks)}
    if project.test_tasks.is_file():
        kwargs["test_tasks"] = str(project.test_tasks)
    if (project.read_json(project.mcp_path, {}) or {}).get("mcpServers"):
        kwargs["mcp_servers"] = str(project.mcp_path)
    reward_kwargs, import_kwargs = _reward_kwargs(project)
    kwargs.update(reward_kwargs)
    return {"id": PROJECT_ENV, "kwargs": kwargs, "import_kwargs": import_kwargs}


def _algorithm_sections(project: Project, form: TrainForm) -> dict[str, Any]:
    """``algorithm`` (a GRPO-family loss, or ``name: sft``) and, for SFT, ``sft.data`` (relative: to the project)."""
    if form.loss != SFT:
        return {"algorithm": {"loss": form.loss, "group_size": form.group_size, "beta": form.beta}}
    data = (form.sft_data or "").strip()
    if data and not Path(data).expanduser().is_absolute():
        data = str(project.root / data)
    return {
        "algorithm": {"name": SFT, "group_size": form.group_size, "beta": form.beta},
        "sft": {"data": str(Path(data).expanduser()) if data else ""},
    }


def form_problems(form: TrainForm) -> list[str]:
    """The studio's own rules on the form, stricter than the config loader's (which allows
    ``max_steps: 0`` to evaluate only, and a group of one for SFT): a run the studio starts trains.

    :func:`config_dict` checks them, so Preview, Save and Start give a number one rule in one
    wording (the loader's ``max_steps must be >= 0`` for -1 and then "at least 1" for 0 did not).
    """
    problems = []
    if int(form.max_steps) < 1:
        problems.append(f"steps must be at least 1 (got {form.max_steps})")
    if int(form.group_size) < 2 and form.loss != SFT:
        problems.append(
            "group size must be at least 2: GRPO-style losses compare the samples of one prompt "
            f"with each other (got {form.group_size})"
        )
    return problems


def config_dict(project: Project, form: TrainForm) -> dict[str, Any]:
    """The trainer config (a plain dict) for the project and the form; :class:`TrainConfigError`
    when the form breaks one of the studio's rules (:func:`form_problems`), checked after the
    sections are built (a bad env, model or run name is said first, as the loader's checks come after)."""
    env = _env_section(project, form)
    group = int(form.group_size) * int(form.prompts_per_step)
    data = {
        "model": _model_section(form.model),
        "env": env,
        "rollout": {"prompts_per_step": form.prompts_per_step, "max_turns": form.max_turns,
                    "max_new_tokens": form.max_new_tokens, "max_total_tokens": form.max_total_tokens},
        **_algorithm_sections(project, form),
        "optim": {"lr": form.lr},
        "policy": {"backend": form.backend},
        "eval": {"every": form.eval_every, "num_prompts": max(1, form.prompts_per_step)},
        "checkpoint": {"every": form.checkpoint_every, "resume": "auto"},
        "logging": {"dir": str(project.runs_dir), "run_name": check_name(form.run_name, "run"),
                    "samples_per_step": group, "progress_bar": False},
        "max_steps": form.max_steps,
    }  # fmt: skip
    problems = form_problems(form)
    if problems:
        raise TrainConfigError("; ".join(problems))
    return data


def start_problems(form: TrainForm, data: dict[str, Any] | None = None) -> list[str]:
    """What makes a valid config of a valid form still impossible to start: with the config ``data``,
    an SFT data file that is not there (a config may be saved before its data is collected)."""
    problems = []
    sft_data = ((data or {}).get("sft") or {}).get("data") if form.loss == SFT else None
    if sft_data and not Path(sft_data).is_file():
        problems.append(
            f"the SFT data file {sft_data!r} does not exist (rlf-collect writes one, docs/sft.md)"
        )
    return problems


def check_config(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` checked by the trainer's own config loader; :class:`TrainConfigError` says why not."""
    try:
        from_dict(data).validate()
    except (ConfigError, TypeError, ValueError) as exc:
        raise TrainConfigError(str(exc)) from None
    return data


def save_config(project: Project, data: dict[str, Any]) -> Path:
    """Write ``configs/<run name>.yaml`` (checked first)."""
    check_config(data)
    path = project.configs_dir / f"{data['logging']['run_name']}.yaml"
    project.write_text(path, yaml.safe_dump(data, sort_keys=False))
    return path


def load_form(project: Project, name: str) -> TrainForm:
    """The form values of a saved config (fields the form does not show are kept in the file)."""
    path = project.configs_dir / f"{check_name(name, 'config')}.yaml"
    if not path.is_file():
        raise TrainConfigError(f"no saved config {name!r}; saved: {', '.join(project.configs()) or 'none'}")
    data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    check_config(data)
    model = data.get("model", {})
    get = lambda section, key, default: (data.get(section) or {}).get(key, default)  # noqa: E731
    defaults = TrainForm()
    simulator = get("env", "kwargs", {}).get("user_simulator") or {}
    simulator = simulator if isinstance(simulator, dict) else {}
    return TrainForm(
        model=model.get("prepare") or model.get("path") or "",
        run_name=get("logging", "run_name", name),
        loss=SFT if get("algorithm", "name", "grpo") == SFT else get("algorithm", "loss", defaults.loss),
        group_size=get("algorithm", "group_size", defaults.group_size),
        prompts_per_step=get("rollout", "prompts_per_step", defaults.prompts_per_step),
        lr=get("optim", "lr", defaults.lr),
        max_steps=data.get("max_steps", defaults.max_steps),
        max_turns=get("rollout", "max_turns", defaults.max_turns),
        max_new_tokens=get("rollout", "max_new_tokens", defaults.max_new_tokens),
        max_total_tokens=get("rollout", "max_total_tokens", defaults.max_total_tokens),
        beta=get("algorithm", "beta", defaults.beta),
        backend=get("policy", "backend", defaults.backend),
        eval_every=get("eval", "every", defaults.eval_every),
        checkpoint_every=get("checkpoint", "every", defaults.checkpoint_every),
        env_id=get("env", "id", defaults.env_id),
        sim_base_url=str(simulator.get("base_url") or ""),
        sim_model=str(simulator.get("model") or ""),
        sft_data=str(get("sft", "data", "") or ""),
    )


def train_script() -> list[str]:
    """``examples/train.py`` of a checkout, else the installed trainer module."""
    script = Path(__file__).resolve().parents[1] / "examples" / "train.py"
    return [str(script)] if script.is_file() else ["-m", "rlf_trainer.cli"]


def command(config_path: Path, form: TrainForm, overrides: list[str] | None = None) -> list[str]:
    """The command line that trains ``config_path``."""
    entry = train_script()
    if form.launcher == "accelerate":
        launch = [sys.executable, "-m", "accelerate.commands.launch"]
        if form.accelerate_config:
            launch += ["--config_file", form.accelerate_config]
        if entry[0] == "-m":
            launch.append("-m")
            entry = entry[1:]
        return [*launch, *entry, "--config", str(config_path), *(overrides or [])]
    return [sys.executable, *entry, "--config", str(config_path), *(overrides or [])]


def command_text(cmd: list[str]) -> str:
    return " ".join(shlex.quote(part) for part in cmd)


def run_env(project: Project) -> dict[str, str]:
    """The subprocess environment: the project folder (its studio_reward.py) and this checkout importable."""
    root = str(Path(__file__).resolve().parents[1])
    paths = [str(project.root), root, os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p), "PYTHONUNBUFFERED": "1"}
