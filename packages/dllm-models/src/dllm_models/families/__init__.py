"""Native model families, one module each."""
