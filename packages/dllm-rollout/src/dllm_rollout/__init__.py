"""dllm_rollout."""
