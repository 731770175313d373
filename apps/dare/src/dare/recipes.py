"""Recipes: plain functions returning the run config of their kind, listed in one dict.

`quickstart` trains a tiny model on CPU. The `<family>-<algorithm>` recipes reproduce the
reference defaults (docs/algorithms.md#defaults) on released checkpoints: set `checkpoint.checkpoint` and
`data.train_files` (RL prompts, SFT prompt/response or preference prompt/chosen/rejected
parquet files; see `dare.pipeline` and `dare.datasets`); they are meant for GPUs.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

from collections.abc import Callable, Iterator, Mapping
from functools import partial

from dare.algorithms import ALGORITHMS, PREFERENCE_ALGORITHMS, SFT_ALGORITHMS, plugin_note, rl_entry
from dare.algorithms.tasks import TASKS, check_task
from dare.config import (
    CheckpointModelConfig,
    DataConfig,
    EvalConfig,
    PreferenceConfig,
    PreferenceRecipeConfig,
    QuickstartConfig,
    RLRecipeConfig,
    RunConfig,
    SFTRecipeConfig,
    TinyModelConfig,
)
from dare.config_tree import did_you_mean
from dare.tasks.addition import AdditionConfig
from dllm_models import FAMILY_NAMES, family_kind
from dllm_rollout import SamplingConfig
from dllm_train import OptimConfig, RLConfig, SFTConfig, TrainerConfig


V = TypeVar("V")


def quickstart() -> QuickstartConfig:
    """Tiny LLaDA-architecture model on 3-digit addition: SFT warm start, then d1 RL (CPU, minutes)."""
    return QuickstartConfig(
        recipe="quickstart",
        algorithm_name="d1",
        task=AdditionConfig(digits=3, num_eval=500, seed=1234),
        model=TinyModelConfig(d_model=128, n_layers=4, n_heads=4, mlp_hidden_size=384),
        sft=SFTConfig(steps=300, batch_size=128, eps=1e-3, normalizer="masked", weight_by_t=False),
        sft_optim=OptimConfig(lr=1e-3, warmup_steps=50, grad_clip=1.0),
        rl=RLConfig(prompts_per_step=16, group_size=8),
        rl_optim=OptimConfig(lr=3e-5, grad_clip=1.0),
        rollout=SamplingConfig(max_new_tokens=4, steps=4, block_length=4, temperature=1.0,
                               record_trajectory=True),
        eval=EvalConfig(batch_size=250),
        trainer=TrainerConfig(max_steps=400, seed=0, eval_every=100, save_every=100, log_every=1,
                              num_threads=1, consistency_every=10),
    )


# Reference rollout settings per family (docs/algorithms.md#defaults): response length, steps, block, temperature, top-k.
_FAMILY_ROLLOUT: dict[str, SamplingConfig] = {
    "llada": SamplingConfig(max_new_tokens=512, steps=256, block_length=32, temperature=0.6),
    "dream": SamplingConfig(max_new_tokens=512, steps=256, block_length=32, temperature=0.2),
    # block families decode with the exact KV cache of finished blocks (cache="prefix")
    "sdar": SamplingConfig(max_new_tokens=2048, steps=4, block_length=4, temperature=1.0, top_k=50,
                           block_diffusion=True, eos_handling="truncate", cache="prefix"),
    # SDAR-30B-A3B's reference decoding: SDAR's, plus top-p 0.95
    "sdar_moe": SamplingConfig(max_new_tokens=2048, steps=4, block_length=4, temperature=1.0, top_k=50,
                               top_p=0.95, block_diffusion=True, eos_handling="truncate", cache="prefix"),
    "llada2": SamplingConfig(max_new_tokens=2048, steps=16, block_length=32, temperature=0.6, top_k=50,
                             top_p=0.95, block_diffusion=True, eos_handling="truncate", cache="prefix"),
}
# released-size runs: every likelihood pass in forwards of at most 16k tokens, activations of as
# many layers recomputed in backward as the card's memory needs (trainer.activation_memory_gib=0:
# the whole card; set it lower to stay under a smaller one), and (RL) the AdamW state in host
# memory outside the optimizer step
# (docs/benchmarks.md has the memory these settings take)
def _trainer(*, max_steps: int, save_every: int, eval_every: int = 0) -> TrainerConfig:
    return TrainerConfig(max_steps=max_steps, seed=0, eval_every=eval_every, save_every=save_every,
                         max_tokens_per_pass=16384, activation_checkpointing=True, optimizer_offload=True)
_LORA = {"lora-sft": (16, 32.0)}


def _value(value: object) -> str:
    """A default's value as the command line writes it (`dare.config.apply_overrides` reads it back)."""
    import json

    return value if isinstance(value, str) else json.dumps(list(value) if isinstance(value, tuple) else value)


def rl_recipe(family: str, algorithm: str) -> RLRecipeConfig:
    """`family` policy trained with RL algorithm `algorithm`: the family's base run with the algorithm entry's
    defaults (`dare.algorithms.RLEntry.defaults`, each with its DARE source; docs/algorithms.md#dare-defaults)."""
    from dare.config import apply_overrides

    entry = rl_entry(algorithm)
    base = RLRecipeConfig(
        recipe=f"{family}-{algorithm}",
        algorithm_name=algorithm,
        checkpoint=CheckpointModelConfig(family=family),
        data=DataConfig(max_prompt_length=512),
        rl=RLConfig(prompts_per_step=16, group_size=8),
        rl_optim=OptimConfig(lr=5e-7, weight_decay=0.01, grad_clip=1.0),
        rollout=_FAMILY_ROLLOUT[family],
        trainer=_trainer(max_steps=500, eval_every=50, save_every=50),
    )
    return apply_overrides(base, [f"{k}={_value(v)}" for k, v in entry.defaults_for(family).items()])


def preference_recipe(family: str, algorithm: str) -> PreferenceRecipeConfig:
    """DPO / VRPO on chosen/rejected pairs: 64 pairs per step, lr 5e-7, lengths 512/512 (docs/algorithms.md#vrpo)."""
    return PreferenceRecipeConfig(
        recipe=f"{family}-{algorithm}", algorithm_name=algorithm,
        checkpoint=CheckpointModelConfig(family=family),
        data=DataConfig(max_prompt_length=512, max_response_length=512),
        preference=PreferenceConfig(pairs_per_step=64),
        preference_optim=OptimConfig(lr=5e-7, weight_decay=0.01),
        rollout=_FAMILY_ROLLOUT[family], trainer=_trainer(max_steps=1000, save_every=100),
    )


_SFT_SETTINGS = {
    "llada": (SFTConfig(steps=1000, batch_size=2, eps=1e-3, normalizer="masked", weight_by_t=True), 1e-4),
    "dream": (SFTConfig(steps=10000, batch_size=2, eps=1e-3, normalizer="masked", weight_by_t=True), 1e-4),
    "sdar": (SFTConfig(steps=1000, batch_size=1, eps=1e-3, normalizer="answer_len", weight_by_t=True), 1e-4),
    "sdar_moe": (SFTConfig(steps=1000, batch_size=1, eps=1e-3, normalizer="answer_len", weight_by_t=True), 1e-4),
    "llada2": (SFTConfig(steps=1000, batch_size=1, eps=1e-3, normalizer="masked", weight_by_t=False), 5e-5),
}


def sft_recipe(family: str, algorithm: str) -> SFTRecipeConfig:
    """Diffusion SFT of `family` (docs/algorithms.md#sft): AdamW (0.9, 0.95), wd 0.01, 10% warm-up, cosine, clip 1."""
    sft, lr = _SFT_SETTINGS[family]
    rank, alpha = _LORA.get(algorithm, (0, 64.0))
    entry = SFT_ALGORITHMS[algorithm]
    return SFTRecipeConfig(
        recipe=f"{family}-{algorithm}", algorithm_name=algorithm,
        algorithm=dataclasses.replace(entry, t_range=(0.3, 0.8)) if family == "llada2" else entry,
        checkpoint=CheckpointModelConfig(family=family, lora_rank=rank, lora_alpha=alpha),
        data=DataConfig(max_prompt_length=4096, max_response_length=4096), sft=sft,
        sft_optim=OptimConfig(lr=lr, betas=(0.9, 0.95), weight_decay=0.01, warmup_steps=sft.steps // 10,
                              schedule="cosine"),
        rollout=_FAMILY_ROLLOUT[family], trainer=_trainer(max_steps=0, save_every=100),
    )


_FAMILIES = FAMILY_NAMES  # the dllm_models registry's canonical names
_FAMILY_TITLES = {"llada": "LLaDA", "dream": "Dream", "sdar": "SDAR", "sdar_moe": "SDAR-MoE", "llada2": "LLaDA2.x"}


def _paper(entry: object) -> str:
    """'name (paper)' from the first sentence of an algorithm entry's docstring."""
    doc = " ".join((type(entry).__doc__ or "").split())
    head, _, rest = doc.partition(" (")
    head = head.partition(":")[0]
    ref = rest.partition(")")[0].strip(" ;,")
    text = f"{head} ({ref})" if ref else head.rstrip(".")
    if getattr(entry, "lora", None) is not None:
        text += " + LoRA (Hu et al., arXiv 2106.09685)"
    return text


_TABLES: dict[tuple[tuple[tuple[str, int], ...], ...], tuple[dict[str, Callable[[], RunConfig]], dict[str, str]]] = {}


def _tables() -> tuple[dict[str, Callable[[], RunConfig]], dict[str, str]]:
    """(recipe name -> builder, recipe name -> its `dare recipes` line), from the registry as it is now
    (built once per state of the registry: its names and entries)."""
    key = tuple(tuple((n, id(e)) for n, e in t.items()) for t in (ALGORITHMS, PREFERENCE_ALGORITHMS, SFT_ALGORITHMS))
    if key not in _TABLES:
        _TABLES.clear()
        _TABLES[key] = _build_tables()
    return _TABLES[key]


def _build_tables() -> tuple[dict[str, Callable[[], RunConfig]], dict[str, str]]:
    recipes: dict[str, Callable[[], RunConfig]] = {"quickstart": quickstart}
    docs: dict[str, str] = {"quickstart": (quickstart.__doc__ or "").strip()}
    tables: tuple[tuple[str, Mapping[str, Any], Callable[[str, str], RunConfig]], ...] = (
        ("RL", ALGORITHMS, rl_recipe), ("preference", PREFERENCE_ALGORITHMS, preference_recipe),
        ("SFT", SFT_ALGORITHMS, sft_recipe))
    for kind, table, builder in tables:
        for name, entry in table.items():
            for family in _FAMILIES:
                if family in entry.families:
                    recipes[f"{family}-{name}"] = partial(builder, family, name)
                    label = _paper(entry)
                    label = label if kind.lower() in label.lower() else f"{kind}: {label}"
                    docs[f"{family}-{name}"] = f"{_FAMILY_TITLES[family]} ({family_kind(family)} diffusion), {label}"
    return recipes, docs


class _View(Mapping[str, V]):
    """A read-only view of one of `_tables()`, rebuilt at each use so algorithms registered later have recipes."""

    def __init__(self, index: int) -> None:
        self._index = index

    def _table(self) -> Mapping[str, V]:
        return _tables()[self._index]  # type: ignore[return-value]

    def __getitem__(self, key: str) -> V:
        return self._table()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._table())

    def __len__(self) -> int:
        return len(self._table())


RECIPES: Mapping[str, Callable[[], RunConfig]] = _View(0)
"""recipe name -> the function building its run config (`dare recipes`)."""
RECIPE_DOCS: Mapping[str, str] = _View(1)
"""recipe name -> one line: family and kind, training kind, algorithm and its paper (`dare recipes`)."""


def get_recipe(name: str) -> RunConfig:
    """The run config of recipe `name` (`RECIPES`); unknown names suggest the closest one."""
    if name not in RECIPES:
        raise ValueError(f"recipe {name!r} is unknown{did_you_mean(name, RECIPES)}; choose one of {sorted(RECIPES)} "
                         f"(see `dare recipes`){plugin_note()}")
    return RECIPES[name]()


# --- per-task settings of the RL recipes (docs/algorithms.md#per-task-settings) ---


def task_settings(family: str, algorithm: str, task: str) -> dict[str, object]:
    """The dotted overrides DARE's recipe scripts set for `task` (empty where nothing changes): the algorithm
    entry's `task_overrides`.

    Raises:
        ValueError: `task` is not one of `TASKS`.
    """
    check_task(task)
    overrides = rl_entry(algorithm).task_overrides
    return {} if overrides is None else dict(overrides(family, task))


def with_task(cfg: RunConfig, task: str) -> RunConfig:
    """`cfg` (a `<family>-<algorithm>` RL recipe) with DARE's settings for `task`.

    Raises:
        ValueError: the recipe is not an RL recipe on a released checkpoint, or `task` is unknown.
    """
    if not isinstance(cfg, RLRecipeConfig):
        raise ValueError(f"task={task}: recipe {cfg.recipe!r} has no per-task settings; they exist for the "
                         f"<family>-<algorithm> RL recipes (e.g. llada-espo task={TASKS[2]})")
    from dare.config import apply_overrides

    changes = task_settings(cfg.checkpoint.family, cfg.algorithm_name, task)
    out = apply_overrides(cfg, [f"{k}={v}" for k, v in changes.items()])
    return dataclasses.replace(out, recipe=f"{cfg.recipe}-{task}")


def split_task(overrides: list[str]) -> tuple[str | None, list[str]]:
    """(`task=<name>` of the command line, the other overrides); the last `task=` wins."""
    task, rest = None, []
    for o in overrides:
        key, _, value = o.partition("=")
        if key.strip() == "task" and value and not value.startswith("{"):
            task = value.strip()
        else:
            rest.append(o)
    return task, rest


def resolve(cfg: RunConfig, overrides: list[str]) -> RunConfig:
    """`cfg` with the command line's overrides, `task=<task>` included.

    The task's settings replace the recipe's (after an `algorithm=` switch, so they are that
    algorithm's); every other override still wins over them.
    """
    from dare.config import apply_overrides

    task, rest = split_task(overrides)
    cfg = apply_overrides(cfg, rest)
    if task is None:
        return cfg
    switches = ("algorithm", "algorithm_name")
    return apply_overrides(with_task(cfg, task), [o for o in rest if o.partition("=")[0].strip() not in switches])
