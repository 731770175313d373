"""Package-level tests: import isolation, the curated public API."""

from __future__ import annotations

import subprocess
import sys

import dllm_objectives as do

REQUIRED = {
    "MaskPlan", "count_masks", "iid_masks", "coupled_masks", "elbo", "grpo_advantages",
    "clipped_policy_loss", "kl_penalty", "dpo_loss", "one_step_masks", "apply_mask",
    "token_logp_from_logits", "aggregate", "rloo_advantages", "mdm_sft_loss",
}


def test_import_pulls_in_no_heavy_or_sibling_packages() -> None:
    code = (
        "import sys, dllm_objectives\n"
        "bad = [m for m in ('transformers', 'ray', 'scipy', 'dllm_models', 'dllm_rollout',"
        " 'dllm_eval', 'dllm_train', 'dare') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_public_api_is_curated_and_complete() -> None:
    assert REQUIRED <= set(do.__all__)
    assert len(do.__all__) == len(set(do.__all__))
    for name in do.__all__:
        assert hasattr(do, name), name


def test_readme_examples_run() -> None:
    import re
    from pathlib import Path

    readme = Path(__file__).resolve().parents[2] / "packages" / "dllm-objectives" / "README.md"
    blocks = re.findall(r"```python\n(.*?)```", readme.read_text(), re.S)
    assert len(blocks) >= 14
    namespace: dict[str, object] = {}
    for block in blocks:
        exec(compile(block, str(readme), "exec"), namespace)  # noqa: S102
