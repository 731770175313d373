"""dllm_objectives."""
