"""OpenCompass evaluation of dLLM checkpoints, run in the separate ``envs/opencompass`` project.

OpenCompass 0.5.4 pins ``numpy<2`` (and then ``pyarrow<26``), which breaks the main workspace
environment, so it lives in its own uv project and is driven through a subprocess:

- :mod:`dllm_eval.opencompass.driver` (standard library only, importable everywhere):
  ``run_opencompass(checkpoint, benchmarks, preset=..., limit=..., output_dir=...)`` runs
  ``uv run --project <repo>/envs/opencompass python -m dllm_eval.opencompass.run ...``.
- :mod:`dllm_eval.opencompass.run` (inside that environment): builds the config, runs
  OpenCompass offline and writes ``results.md`` / ``results.json`` / ``manifest.json``.
- :mod:`dllm_eval.opencompass.configs`, :mod:`~dllm_eval.opencompass.model`,
  :mod:`~dllm_eval.opencompass.dataset`, :mod:`~dllm_eval.opencompass.evaluator`: the
  OpenCompass pieces (these import opencompass; never import them from the main environment).

This ``__init__`` imports nothing from OpenCompass, and ``dllm_eval/__init__.py`` never imports
this subpackage.
"""

from dllm_eval.opencompass.driver import find_project, run_opencompass

__all__ = ["find_project", "run_opencompass"]
