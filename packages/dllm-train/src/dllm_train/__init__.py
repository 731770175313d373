"""dllm_train."""
