"""dare."""
