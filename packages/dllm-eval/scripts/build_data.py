"""Rebuild the package data (``src/dllm_eval/data/*.parquet``) from the DARE RL test parquets.

Usage: ``uv run python packages/dllm-eval/scripts/build_data.py /path/to/data/preprocessed/rl/test``

Each output has flat columns ``data_source``, ``prompt`` (JSON list of chat messages),
``ground_truth`` and ``extra_info`` (JSON object), zstd-compressed. HumanEval rows gain
``extra_info.entry_point`` (the last top-level ``def`` of the prompt, as in HumanEval).
"""

import json
import re
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

NAMES = ["gsm8k", "math500", "countdown", "sudoku", "humaneval", "humanevalplus", "mbpp",
         "aime2024", "aime2025"]
OUT = Path(__file__).resolve().parents[1] / "src" / "dllm_eval" / "data"


def main(src: Path) -> None:
    for name in NAMES:
        rows = pq.read_table(src / f"{name}_1.parquet").to_pylist()
        out = {"data_source": [], "prompt": [], "ground_truth": [], "extra_info": []}
        for row in rows:
            extra = {k: v for k, v in row["extra_info"].items() if v is not None}
            if name == "humaneval":
                defs = re.findall(r"^def\s+(\w+)\s*\(", row["prompt"][-1]["content"], re.M)
                extra["entry_point"] = defs[-1]
            out["data_source"].append(row["data_source"])
            out["prompt"].append(json.dumps([dict(m) for m in row["prompt"]], ensure_ascii=False))
            out["ground_truth"].append(row["reward_model"]["ground_truth"])
            out["extra_info"].append(json.dumps(extra, ensure_ascii=False, sort_keys=True))
        table = pa.table({k: pa.array(v, pa.string()) for k, v in out.items()})
        pq.write_table(table, OUT / f"{name}.parquet", compression="zstd", compression_level=19)
        print(name, len(rows), (OUT / f"{name}.parquet").stat().st_size)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
