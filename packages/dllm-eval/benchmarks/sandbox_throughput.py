"""Measure sandbox throughput: ``uv run python packages/dllm-eval/benchmarks/sandbox_throughput.py``."""

import sys
import time

from dllm_eval import execute_many


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 48
    program = "def f(x):\n    return x * x\nassert sum(map(f, range(1000))) == 332833500\n"
    for workers in (1, 2, 4, 8):
        start = time.perf_counter()
        results = execute_many([program] * n, max_workers=workers)
        dt = time.perf_counter() - start
        ok = sum(r.ok for r in results)
        print(f"workers={workers:2d}  {n / dt:6.1f} executions/s  ({ok}/{n} ok)")
    print("isolation:", ", ".join(results[0].isolation))


if __name__ == "__main__":
    main()
