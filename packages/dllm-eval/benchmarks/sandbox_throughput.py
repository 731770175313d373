"""Measure sandbox throughput: ``uv run python packages/dllm-eval/benchmarks/sandbox_throughput.py``.

Prints executions/s of a small program for 1, 2, 4 and 8 workers, then the same for
``execute_tests`` (solution and tests in separate processes) where that API exists.
"""

import sys
import time
from concurrent.futures import ThreadPoolExecutor

import dllm_eval
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
    execute_tests = getattr(dllm_eval, "execute_tests", None)
    if execute_tests is None:
        return
    solution = "def f(x):\n    return x * x\n"
    tests = "assert [f(i) for i in range(10)] == [i * i for i in range(10)]\n"
    for workers in (1, 2, 4, 8):
        start = time.perf_counter()
        with ThreadPoolExecutor(max_workers=workers) as pool:
            runs = list(pool.map(lambda _: execute_tests(solution, tests), range(n)))
        dt = time.perf_counter() - start
        ok = sum(r.ok for r in runs)
        print(f"execute_tests workers={workers:2d}  {n / dt:6.1f} runs/s  ({ok}/{n} ok)")


if __name__ == "__main__":
    main()
