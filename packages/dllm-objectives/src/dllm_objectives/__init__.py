"""dllm_objectives: pure-function likelihood estimators and losses for diffusion LLM post-training.

Tensors and keyword-only numbers in, tensors (and flat metrics dicts) out. Randomness only via
an explicit ``torch.Generator``; the library depends on torch alone and never calls a model,
except through the callables handed to :mod:`dllm_objectives.drivers`.
See the package README for one example per algorithm and ``docs/algorithms.md`` (repository root)
for the math.
"""

from __future__ import annotations

from .advantages import group_mean, grpo_advantages, rloo_advantages, sequence_advantages
from .block import bd3lm_attention_mask, bd3lm_visible, block_count_masks, block_ids
from .bridge_ratio import BRIDGE_CORRECTIONS, bridge_log_ratio, bridge_ratio_policy_loss
from .count_masking import count_masks, espo_masks, random_subset
from .dmpo import (
    dmpo_baseline,
    dmpo_ess_coeff,
    dmpo_sequence_elbo,
    dmpo_weights,
    group_softmax,
    wdce_loss,
    wddo_loss,
)
from .drivers import per_sample_backward, proxy_backward, step_replay
from .kl import KL_KINDS, kl_penalty, sequence_kl
from .likelihood import (
    antithetic_elbo,
    composite_block_elbo,
    coupled_token_logp,
    elbo,
    elbo_terms,
    token_logp_from_logits,
)
from .masking import complement_plan, coupled_masks, iid_masks, one_step_masks
from .plan import MaskPlan, apply_mask
from .policy import (
    AGG_MODES,
    aggregate,
    bgpo_policy_loss,
    clipped_policy_loss,
    gdpo_loss,
    sequence_clip_loss,
    token_surrogate,
    weighted_policy_loss,
)
from .preference import dpo_logits, dpo_loss
from .sdmc import QUADRATURE_RULES, quadrature_elbo, quadrature_rule, sdmc_masks
from .sandwich import spg_block_masks, spg_loss, spg_sequence_logp
from .sft import SFT_NORMALIZERS, mdm_sft_loss
from .trace import (
    TRACE_NORMALIZATIONS,
    outcome_token_rewards,
    replay_rounds,
    shrink_steps,
    trace_group_filter,
    trace_policy_loss,
    trace_returns_and_advantages,
    trace_value_loss,
)
from .trajectory import (
    autoregressive_steps,
    cj_token_weights,
    mdpo_loss,
    mdpo_step_advantages,
    mdpo_step_scores,
    mdpo_topk_steps,
    replay_plan,
    unmask_steps,
)
from .tree import (
    tree_active_positions,
    tree_local_advantages,
    tree_policy_loss,
    tree_self_distill_kl,
    tree_self_distill_schedule,
    tree_values,
)

__version__ = "0.1.0"

__all__ = [
    # plan
    "MaskPlan",
    "apply_mask",
    # masking schemes
    "one_step_masks",
    "coupled_masks",
    "iid_masks",
    "complement_plan",
    "count_masks",
    "espo_masks",
    "random_subset",
    "spg_block_masks",
    "block_count_masks",
    "sdmc_masks",
    "QUADRATURE_RULES",
    "quadrature_rule",
    "replay_plan",
    "unmask_steps",
    "autoregressive_steps",
    "shrink_steps",
    "replay_rounds",
    # likelihood
    "token_logp_from_logits",
    "elbo_terms",
    "elbo",
    "antithetic_elbo",
    "coupled_token_logp",
    "composite_block_elbo",
    "quadrature_elbo",
    "spg_sequence_logp",
    "dmpo_sequence_elbo",
    "BRIDGE_CORRECTIONS",
    "bridge_log_ratio",
    # advantages
    "grpo_advantages",
    "rloo_advantages",
    "sequence_advantages",
    "group_mean",
    "group_softmax",
    "mdpo_step_scores",
    "mdpo_step_advantages",
    "mdpo_topk_steps",
    "tree_values",
    "tree_local_advantages",
    "trace_group_filter",
    "outcome_token_rewards",
    "trace_returns_and_advantages",
    "dmpo_weights",
    "dmpo_ess_coeff",
    "dmpo_baseline",
    # losses
    "AGG_MODES",
    "aggregate",
    "token_surrogate",
    "clipped_policy_loss",
    "bgpo_policy_loss",
    "bridge_ratio_policy_loss",
    "sequence_clip_loss",
    "gdpo_loss",
    "weighted_policy_loss",
    "cj_token_weights",
    "spg_loss",
    "mdpo_loss",
    "TRACE_NORMALIZATIONS",
    "trace_policy_loss",
    "trace_value_loss",
    "tree_active_positions",
    "tree_policy_loss",
    "tree_self_distill_schedule",
    "tree_self_distill_kl",
    "wdce_loss",
    "wddo_loss",
    "dpo_logits",
    "dpo_loss",
    "SFT_NORMALIZERS",
    "mdm_sft_loss",
    # KL
    "KL_KINDS",
    "kl_penalty",
    "sequence_kl",
    # block diffusion
    "block_ids",
    "bd3lm_visible",
    "bd3lm_attention_mask",
    # drivers (take callables)
    "proxy_backward",
    "per_sample_backward",
    "step_replay",
]
