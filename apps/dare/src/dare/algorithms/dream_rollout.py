"""DARE's Dream rollout: the rows every Dream RL recipe decodes with (docs/algorithms.md#rollout-settings).

The rule itself equals DARE's code in `tests/dllm_rollout/test_dare_rules.py`. An algorithm DARE runs on
Dream cites these rows as they are; one DARE (or its authors) never ran on Dream takes the same values as
a stated difference (`dream_rollout_as`), so the values live here once.
"""

from __future__ import annotations

from dare.algorithms.entry import Default


def _dream(key: str, value: object, source: str, quote: str, proof: str = "") -> Default:
    return Default(key=key, value=value, dare=source, quote=quote, families=("dream",), proof=proof)


DREAM_ROLLOUT = (
    _dream("rollout.remasking", "entropy", "verl/workers/rollout/rollout_utils.py:801", 'alg="entropy",'),
    _dream("rollout.top_p", 0.95, "verl/workers/rollout/rollout_utils.py:800",
           "top_p=0.95 if temperature > 0 else 1.0,"),
    _dream("rollout.commit_block_start", True, "verl/workers/rollout/generation_utils_block.py:593",
           "x[:, current_block_start] = x0[:, current_block_start]",
           proof="tests/dllm_rollout/test_dare_rules.py::test_dream_block_rollout_equals_dares"),
)
"""DARE's Dream rollout: the cached block decoder with entropy confidence and top-p 0.95."""


def dream_rollout_as(reason: str) -> tuple[Default, ...]:
    """`DREAM_ROLLOUT` for an algorithm with no Dream script of its own: each row a difference whose reason
    is `reason` followed by the DARE line it takes, in parentheses."""
    return tuple(Default(key=d.key, value=d.value, reason=f"{reason} ({d.dare})", families=d.families)
                 for d in DREAM_ROLLOUT)


__all__ = ["DREAM_ROLLOUT", "dream_rollout_as"]
