"""dllm_models."""
