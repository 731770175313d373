"""A model with non-finite logits makes decoding fail with a clear error instead of looping forever."""

from __future__ import annotations

import pytest
import torch

from dllm_rollout import NonFiniteLogits, generate
from dllm_rollout.progress import check_progress
from tests.dllm_rollout.conftest import tiny


def _poisoned(family: str) -> torch.nn.Module:
    model = tiny(family)
    with torch.no_grad():
        model.get_output_embeddings().weight.fill_(float("nan"))  # type: ignore[operator]
    return model


@pytest.mark.parametrize(("family", "cache", "threshold"), [("llada", None, None), ("llada", "prefix", None),
                                                          ("llada", "dual", 0.9), ("Dream", None, None),
                                                          ("sdar", None, None), ("sdar", "prefix", 0.9),
                                                          ("llada2_moe", None, "edit")])
def test_non_finite_logits_raise_instead_of_looping(family: str, cache: str | None, threshold: object) -> None:
    """Before the bound, each of these decoded forever (the last vocabulary id is the tiny models' mask)."""
    model = _poisoned(family)
    extra: dict[str, object] = {"threshold": 0.7, "editing_threshold": 0.5} if threshold == "edit" else {"threshold": threshold}
    with pytest.raises(NonFiniteLogits, match="logits are not finite"):  # a RuntimeError a trainer can tell apart
        generate(model, [[1, 2, 3], [4, 5]], max_new_tokens=8, steps=4, block_length=4,  # type: ignore[arg-type]
                 temperature=1.0, cache=cache, **extra)


def test_check_progress_allows_the_bound_and_names_the_block() -> None:
    logits = torch.zeros(2, 4, 10)
    check_progress(3, 4, 10, 14, logits)  # within the bound: nothing happens
    with pytest.raises(RuntimeError, match=r"block \[10, 14\) still has masked positions after 4 steps"):
        check_progress(4, 4, 10, 14, logits)
