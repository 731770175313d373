"""dllm_algorithms: diffusion LLM post-training algorithms as small typed objects.

Every RL algorithm implements `dllm_train.RLAlgorithm` (typed `prepare` / `values` / `loss`,
its per-batch data its own dataclass), so `dllm_train`'s workers, or a user's own loop, run any
of them without the `dare` app; the app keeps the registry of names, the recipes and the CLI.
Preference and SFT algorithms implement `dllm_train.OfflineObjective` (their masks and their
loss), which `dllm_train.OfflineWorker` trains: a new preference method is a subclass of
`ELBOPreference` here (or anywhere), not a change of the trainer.

Why a member of its own: the algorithms name papers and their hyper-parameters, which
`dllm_train` (the execution stack every algorithm shares) must not; they need `dllm_train`'s
scorer, typed batch and interface, so they sit above it and below the app. `dllm_objectives`
stays the torch-only home of their pure functions.
"""

from dllm_algorithms.bridge_ratio import BridgeRatioGRPO
from dllm_algorithms.clipping import DualClip, RatioClip
from dllm_algorithms.distribution_matching import DMPO, WeightedMasks
from dllm_algorithms.elbo_policy import BGPO, EBPO, ESPO, SPG
from dllm_algorithms.families import ALL_FAMILIES, BLOCK, MASKED
from dllm_algorithms.gdpo import GDPO
from dllm_algorithms.preference import DPO, VRPO, ELBOPreference, PairMasks, PreferenceBatch, dpo_on_elbos
from dllm_algorithms.sft import SFT, LoRA, SFTBatch
from dllm_algorithms.token_policy import D1, CoupledGRPO, JustGRPO
from dllm_algorithms.trace_policy import TraceRL, TraceRows, trace_positions
from dllm_algorithms.trajectory_policy import CJGRPO, MDPO, TrainingRows, Trajectory, trajectory_steps
from dllm_algorithms.tree_policy import DTreeRPO, TreeRolloutBatch

__all__ = [
    "ALL_FAMILIES", "BGPO", "BLOCK", "CJGRPO", "D1", "DMPO", "DPO", "EBPO", "ELBOPreference", "ESPO", "GDPO", "MASKED", "MDPO",
    "PairMasks", "PreferenceBatch", "SFT", "SFTBatch", "SPG", "VRPO", "BridgeRatioGRPO", "CoupledGRPO", "DTreeRPO",
    "JustGRPO", "LoRA", "TrainingRows", "Trajectory", "TreeRolloutBatch", "WeightedMasks", "dpo_on_elbos",
    "trajectory_steps", "TraceRL", "TraceRows", "trace_positions",
    "DualClip", "RatioClip",
]
