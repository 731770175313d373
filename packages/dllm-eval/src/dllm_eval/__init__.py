"""dllm_eval."""
