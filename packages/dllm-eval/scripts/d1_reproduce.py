"""Score d1's 85 published generation files with our ``d1`` preset and compare with d1's parser.

    uv run python packages/dllm-eval/scripts/d1_reproduce.py [--archive ../shared/data/d1_generations.tar.gz]

Reads the archive without unpacking it, scores every ``*_generations.json`` with
:func:`dllm_eval.reproduce.score_d1_file` (the ``d1`` preset's reward mode), and prints two
markdown tables: per file (d1's count and accuracy from ``d1_reference.json`` next to this
script, ours, and whether they are equal) and per setup (task x length, as d1's parser prints
them). Exits 1 if any file differs.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tarfile
from collections import defaultdict
from pathlib import Path

from dllm_eval.reproduce import D1FileScore, score_d1_file

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]


def _scores(archive: Path, preset: str) -> list[D1FileScore]:
    out = []
    with tarfile.open(archive) as tar:
        for member in sorted(tar.getmembers(), key=lambda m: m.name):
            name = Path(member.name).name
            if not name.endswith("_generations.json"):
                continue
            handle = tar.extractfile(member)
            if handle is None:
                continue
            out.append(score_d1_file(name, json.load(handle), preset=preset))
    return out


def _pct(correct: float, total: float) -> str:
    return f"{100 * correct / total:.2f}" if total else "n/a"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--archive", type=Path,
                        default=ROOT.parent / "shared" / "data" / "d1_generations.tar.gz")
    parser.add_argument("--reference", type=Path, default=HERE / "d1_reference.json")
    parser.add_argument("--preset", default="d1")
    args = parser.parse_args()
    reference = json.loads(args.reference.read_text())["files"]
    scores = _scores(args.archive, args.preset)
    mismatches = 0
    print("| file | d1 correct/total | d1 % | ours correct/total | ours % | equal |")
    print("|---|---|---|---|---|---|")
    setups: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0, 0.0])
    for s in scores:
        ref = reference.get(s.name)
        if ref is None:
            print(f"| {s.name} | (no reference) | | {s.correct:g}/{s.total:g} | | no |")
            mismatches += 1
            continue
        equal = ref["correct"] == s.correct and ref["total"] == s.total
        mismatches += not equal
        print(f"| {s.name} | {ref['correct']}/{ref['total']} | {_pct(ref['correct'], ref['total'])}"
              f" | {s.correct:g}/{s.total:g} | {_pct(s.correct, s.total)} | "
              f"{'yes' if equal else '**no**'} |")
        setup = re.sub(r"_\d+_generations\.json$", "", s.name)
        acc = setups[setup]
        acc[0] += ref["correct"]
        acc[1] += ref["total"]
        acc[2] += s.correct
        acc[3] += s.total
    print()
    print("| setup (task_model_length_steps) | d1 % | ours % |")
    print("|---|---|---|")
    for setup, (rc, rt, oc, ot) in sorted(setups.items()):
        print(f"| {setup} | {_pct(rc, rt)} | {_pct(oc, ot)} |")
    print(f"\n{len(scores)} files, {mismatches} differ", file=sys.stderr)
    return 1 if mismatches or not scores else 0


if __name__ == "__main__":
    sys.exit(main())
