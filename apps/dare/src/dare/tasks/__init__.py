"""Small generated tasks for quick starts and CPU tests."""
