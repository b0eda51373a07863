"""rlf_trainer.config: YAML loading, dotted overrides, errors that name the key; the shipped configs load."""

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlf_trainer.config import Config, ConfigError, dump_config, from_dict, load_config, parse_override
from rlf_trainer.config_sections import Section

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "configs"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "cfg.yaml"
    path.write_text(text)
    return path


def test_yaml_values_land_in_nested_dataclasses_and_defaults_fill_the_rest(tmp_path):
    cfg = load_config(
        write(
            tmp_path,
            """
model: {path: /models/x, dtype: bfloat16}
env:
  id: RLF/ToolUse-v0
  kwargs: {tasks: tasks.jsonl, reward: f1}
algorithm: {loss: dapo, group_size: 8, clip_eps_high: 0.28, dynamic_sampling: true}
optim: {lr: 1.0e-6, schedule: cosine, gradient_accumulation_steps: 4}
lora: {enabled: true, target_modules: all-linear}
policy: {backend: vllm, vllm: {tensor_parallel_size: 2, gpu_memory_utilization: 0.5}}
max_steps: 7
""",
        )
    )
    assert cfg.model.dtype == "bfloat16" and cfg.env.kwargs == {"tasks": "tasks.jsonl", "reward": "f1"}
    assert (cfg.algorithm.loss, cfg.algorithm.group_size, cfg.algorithm.dynamic_sampling) == ("dapo", 8, True)
    assert cfg.optim.lr == 1e-6 and cfg.optim.schedule == "cosine"
    assert cfg.lora.target_modules == "all-linear"
    assert cfg.policy.vllm.tensor_parallel_size == 2
    assert cfg.policy.vllm.enable_sleep_mode is None  # untouched default: on under CUDA only
    assert cfg.max_steps == 7 and cfg.rollout.temperature == 1.0  # untouched default
    assert cfg.run_dir == Path("runs") / "grpo"


def test_overrides_follow_yaml_rules_and_win_over_the_file(tmp_path):
    path = write(tmp_path, "model: {path: a}\noptim: {lr: 0.1}\n")
    cfg = load_config(
        path,
        [
            "optim.lr=1e-5",  # YAML 1.1 would leave this a string
            "rollout.max_turns=3",
            "eval.every=0",
            "lora.enabled=true",
            "lora.target_modules=[q_proj, v_proj]",
            "env.kwargs.max_result_chars=500",
            "env.kwargs.mcp_servers={mcpServers: {s: {url: 'http://127.0.0.1:1/mcp'}}}",
            "checkpoint.dir=null",
            "logging.run_name=my run",
        ],
    )
    assert cfg.optim.lr == 1e-5 and isinstance(cfg.optim.lr, float)
    assert cfg.rollout.max_turns == 3 and cfg.lora.enabled is True
    assert cfg.lora.target_modules == ["q_proj", "v_proj"]
    assert cfg.env.kwargs["max_result_chars"] == 500
    assert cfg.env.kwargs["mcp_servers"]["mcpServers"]["s"]["url"] == "http://127.0.0.1:1/mcp"
    assert cfg.checkpoint.dir is None and cfg.logging.run_name == "my run"


OPTIM_KEYS = (
    "adam_beta1, adam_beta2, adam_eps, gradient_accumulation_steps, lr, max_grad_norm, min_lr_ratio, "
    "schedule, stochastic_rounding, warmup_steps, weight_decay"
)
TOP_KEYS = (
    "algorithm, checkpoint, compile, distributed, env, eval, gradient_checkpointing, health, logging, lora, max_steps, "
    "mixed_precision, model, optim, policy, rollout, seed"
)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        # unknown key: a did-you-mean (difflib) when one is close, and the valid keys at that level
        (["optim.lrr=1"], f"unknown key 'optim.lrr' (did you mean 'optim.lr'?); valid keys in 'optim': {OPTIM_KEYS}"),
        (["maxsteps=3"], f"unknown key 'maxsteps' (did you mean 'max_steps'?); valid keys at the top level: {TOP_KEYS}"),
        (["bogus=1"], f"unknown key 'bogus'; valid keys at the top level: {TOP_KEYS}"),
        (
            ["policy.vllm.tp=2"],
            "unknown key 'policy.vllm.tp'; valid keys in 'policy.vllm': dtype, enable_sleep_mode, "
            "gpu_memory_utilization, max_model_len, tensor_parallel_size",
        ),
        # a value outside a fixed set of choices
        (["algorithm.loss=ppo"], "algorithm.loss must be one of ['grpo', 'dr_grpo', 'dapo', 'gspo'], got 'ppo'"),
        (
            ["algorithm.loss=dapoo"],
            "algorithm.loss must be one of ['grpo', 'dr_grpo', 'dapo', 'gspo'], got 'dapoo' (did you mean 'dapo'?)",
        ),
        (
            ["model.prepare=tiny"],
            "model.prepare must be one of ['tiny-qwen3', 'smollm2-135m'] or null, got 'tiny'",
        ),
        # wrong type
        (["algorithm.group_size=four"], "algorithm.group_size must be an integer, got 'four'"),
        (["algorithm.group_size=2.5"], "algorithm.group_size must be an integer, got 2.5"),
        (["algorithm.group_size=true"], "algorithm.group_size must be an integer, got True"),
        (["lora.enabled=maybe"], "lora.enabled must be true or false, got 'maybe'"),
        (["optim.lr=fast"], "optim.lr must be a number, got 'fast'"),
        (["logging.run_name=12"], "logging.run_name must be a string, got 12"),
        (["rollout.max_turns=[1]"], "rollout.max_turns must be an integer or null, got [1]"),
        (["lora.target_modules=[1]"], "lora.target_modules must be a list of strings or a string, got [1]"),
        (["env.import_kwargs.reward=3"], "env.import_kwargs.reward must be a string or a list of strings, got 3"),
        (["optim=3"], "optim must be a mapping, got int: 3"),
        (["env.kwargs=[1]"], "env.kwargs must be a mapping, got list: [1]"),
        (["logging.report_to=wandb"], "logging.report_to must be a list, got 'wandb'"),
        # a replaced key says what to write instead
        (["logging.tensorboard=false"], "logging.tensorboard was replaced by logging.report_to: [tensorboard] (or [] for none)"),
        # malformed override
        (["optim.lr"], "override 'optim.lr' is not of the form dotted.key=value"),
        (["optim..lr=1"], "override 'optim..lr=1' is not of the form dotted.key=value"),
        # out of range
        (["algorithm.group_size=0"], "algorithm.group_size must be >= 1"),
        (["optim.lr=0"], "optim.lr must be > 0"),
        (["max_steps=-1"], "max_steps must be >= 0"),
        (["rollout.top_p=1.5"], "rollout.top_p must be in (0, 1]"),
        (["optim.min_lr_ratio=2"], "optim.min_lr_ratio must be in [0, 1]"),
        (["algorithm.tis_cap=-1"], "algorithm.tis_cap must be >= 0 (or null)"),
        (["rollout.max_concurrent_episodes=0"], "rollout.max_concurrent_episodes must be >= 1 (or null)"),
        (["algorithm.num_iterations=0"], "algorithm.num_iterations must be >= 1"),
        (["algorithm.mini_batches=0"], "algorithm.mini_batches must be >= 1"),
        (["distributed.timeout_s=0"], "distributed.timeout_s must be > 0"),
        # rules that tie fields together (Config.validate)
        (
            ["rollout.max_total_tokens=10", "rollout.max_new_tokens=20"],
            "rollout.max_total_tokens must exceed rollout.max_new_tokens (10 <= 20)",
        ),
        (
            ["algorithm.clip_eps_low=0.2", "algorithm.clip_eps_high=0.3"],
            "grpo clips symmetrically: leave algorithm.clip_eps_high unset or use algorithm.loss=dapo",
        ),
        (
            ["rollout.max_turns=3", "env.kwargs.max_turns=5"],
            "max_turns is set twice, rollout.max_turns=3 and env.kwargs.max_turns=5: drop one",
        ),
        (
            ["algorithm.loss=gspo", "algorithm.turn_rewards=discounted"],
            "gspo has one ratio per sequence: algorithm.turn_rewards must be 'sum'",
        ),
        (["rollout.overlap=true"], "rollout.overlap needs policy.backend=vllm: the HF policy generates"),
        (["model.path=''"], "model.path is required (or model.prepare)"),
    ],
)  # fmt: skip
def test_bad_keys_and_values_are_errors_naming_the_key(overrides, message):
    base = [] if any(o.startswith("model.path") for o in overrides) else ["model.path=m"]
    with pytest.raises(ConfigError) as excinfo:
        load_config(None, base + overrides)
    assert str(excinfo.value).startswith(message)


def test_every_wrong_key_is_reported_at_once():
    with pytest.raises(ConfigError) as excinfo:
        load_config(None, ["model.path=m", "algorithm.group_size=0", "optim.lr=-1", "optim.lrr=1"])
    assert str(excinfo.value) == (
        "3 problems in the config:\n"
        "  algorithm.group_size must be >= 1\n"
        "  optim.lr must be > 0\n"
        f"  unknown key 'optim.lrr' (did you mean 'optim.lr'?); valid keys in 'optim': {OPTIM_KEYS}"
    )


def test_validate_writes_in_the_one_value_of_auto_and_null_settings():
    hf = load_config(None, ["model.path=m", "rollout.max_turns=3", "env.kwargs.max_turns=3"])
    assert (hf.rollout.mode, hf.algorithm.tis_cap) == ("lockstep", 0.0)  # the same max_turns twice is fine
    overlap = load_config(None, ["model.path=m", "policy.backend=vllm", "rollout.overlap=true"])
    assert (overlap.rollout.mode, overlap.algorithm.tis_cap) == ("async", 2.0)
    assert not hasattr(overlap, "tis_cap") and not hasattr(overlap, "rollout_mode")


def test_from_dict_checks_types_but_leaves_cross_field_rules_to_validate():
    """The studio builds a config from a form with from_dict and calls validate itself."""
    cfg = from_dict({"rollout": {"max_total_tokens": 10, "max_new_tokens": 20}})
    with pytest.raises(ConfigError, match="must exceed"):
        cfg.validate()
    with pytest.raises(ConfigError, match="config must be a mapping, got list"):
        from_dict([1])  # type: ignore[arg-type]
    assert from_dict({"lora": None, "policy": {"vllm": None}}) == Config()  # `lora:` alone = defaults


def test_unknown_key_in_a_file_is_an_error(tmp_path):
    path = write(tmp_path, "model: {path: m}\nrollout: {temprature: 0.7}\n")
    with pytest.raises(
        ConfigError,
        match=r"unknown key 'rollout.temprature' \(did you mean 'rollout.temperature'\?\); valid keys in 'rollout'",
    ):
        load_config(path)
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_config(write(tmp_path, "- a\n- b\n"))


def test_parse_override_types():
    assert parse_override("a.b=3") == ("a.b", 3)
    assert parse_override("a=true") == ("a", True)
    assert parse_override("a=null") == ("a", None)
    assert parse_override("a=x=y") == ("a", "x=y")
    assert parse_override("a=") == ("a", "")
    assert parse_override("optim.lr=1e-6") == ("optim.lr", "1e-6")  # YAML 1.1; the number field takes it
    assert (
        load_config(None, ["model.path=m", "optim.lr=1e-6", "rollout.temperature=1"]).rollout.temperature
        == 1.0
    )


def test_dump_then_load_round_trips(tmp_path):
    cfg = load_config(None, ["model.path=m", "optim.lr=3e-6", "env.kwargs.reward=f1"])
    cfg.env.kwargs["python_tools"] = [print]  # objects from Python are recorded by name, not lost
    dump_config(cfg, tmp_path / "out.yaml")
    text = (tmp_path / "out.yaml").read_text()
    assert "built-in function print" in text
    cfg.env.kwargs.pop("python_tools")
    dump_config(cfg, tmp_path / "out.yaml")
    assert load_config(tmp_path / "out.yaml") == cfg


@pytest.mark.parametrize("name", sorted(p.name for p in EXAMPLES.glob("*.yaml")))
def test_shipped_configs_load(name):
    cfg = load_config(EXAMPLES / name)
    assert isinstance(cfg, Config) and cfg.max_steps > 0


def test_deepsearch_recipe_matches_rl_factory():
    cfg = load_config(EXAMPLES / "deepsearch_qwen3_4b.yaml")
    assert cfg.model.path == "Qwen/Qwen3-4B" and cfg.algorithm.loss == "grpo"
    assert cfg.rollout.prompts_per_step == 128 and cfg.algorithm.group_size == 4
    assert cfg.optim.lr == 1e-6 and cfg.algorithm.beta == 0.001 and cfg.algorithm.kl_estimator == "k3"
    assert cfg.rollout.max_new_tokens == 512 and 2 <= cfg.rollout.max_turns <= 4
    assert (cfg.rollout.temperature, cfg.rollout.top_p) == (0.7, 0.95)
    assert cfg.policy.backend == "vllm" and cfg.policy.vllm.gpu_memory_utilization == 0.75
    assert cfg.mixed_precision == "bf16" and cfg.gradient_checkpointing is True
    assert cfg.algorithm.mini_batches == 4  # train_batch_size 128 / ppo_mini_batch_size 32


def _leaf_keys(model: type = Config, prefix: str = "") -> list[str]:
    """Every dotted key of the config whose value is not itself a section."""
    keys = []
    for name, field in model.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, Section):
            keys += _leaf_keys(annotation, f"{prefix}{name}.")
        else:
            keys.append(prefix + name)
    return keys


_ANY_YAML_VALUE = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**6), max_value=10**6),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=6),
    st.lists(st.one_of(st.integers(), st.text(max_size=3)), max_size=2),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)


@settings(max_examples=400, deadline=None)
@given(key=st.sampled_from(_leaf_keys()), value=_ANY_YAML_VALUE)
def test_any_value_of_any_key_gives_a_config_or_a_config_error_naming_a_key(key, value):
    data: dict = {"model": {"path": "m"}}
    node = data
    *parents, leaf = key.split(".")
    for part in parents:
        node = node.setdefault(part, {})
    node[leaf] = value
    try:
        from_dict(data).validate()
    except ConfigError as exc:  # never another exception, and the message says which key
        assert any(k in str(exc) for k in (key, *_leaf_keys())), str(exc)
