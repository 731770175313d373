"""The repository stands alone: no file of the checkout points into material that only lives outside it.

Source, tests, READMEs and docs cite the repository's own docs (docs/algorithms.md,
docs/models.md, docs/generation.md, docs/data.md) by anchor, never the private spec folder's
numbered sections, and never read files from the shared folder beside the checkout, except the
few files in ``ALLOWED`` below.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Written without the literal markers, so this file does not match itself.
SECTION = "\u00a7"
FORBIDDEN = {
    "numbered spec section": re.compile(SECTION + r"\s*\d|\bspec (section )?\d"),
    "spec folder": re.compile(r"\bspec/[\w-]+\.md|shared[/]spec"),
    "shared folder beside the repository": re.compile(r"\.\./shared\b"),
}

ALLOWED: dict[str, str] = {
    # Read release checkpoints / data beside the checkout on purpose (developer machines; they skip
    # or fall back to a local copy without them).
    "benchmarks/e2e_gpu.py": "GPU benchmark: default checkpoint/data folders beside the checkout",
    "packages/dllm-eval/scripts/d1_reproduce.py": "default --archive path of d1's generations",
    "packages/dllm-eval/scripts/d1_reference.json": "provenance note of the recorded d1 scores",
    "tests/dllm_models/test_llada.py": "skips without the release checkpoints beside the checkout",
    "tests/dllm_models/test_loading.py": "skips without the release checkpoints beside the checkout",
    "tests/dllm_models/test_tokenizer.py": "skips without the release checkpoints beside the checkout",
}


def _tracked_files() -> list[str]:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    # tracked files plus new ones not ignored (what the next commit can hold)
    cmd = ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, check=True).stdout
    return sorted({name for name in out.decode().split("\0") if name})


def test_no_file_cites_the_spec_folder_or_the_shared_folder() -> None:
    offences = []
    for name in _tracked_files():
        path = ROOT / name
        if name in ALLOWED or not path.is_file():  # deleted in the work tree
            continue
        data = path.read_bytes()
        if b"\0" in data:  # binary (parquet, images)
            continue
        text = data.decode("utf-8", errors="ignore")
        for what, pattern in FORBIDDEN.items():
            for match in pattern.finditer(text):
                line = text.count("\n", 0, match.start()) + 1
                offences.append(f"{name}:{line}: {what}: {match.group(0)!r}")
    assert not offences, "cite docs/*.md anchors instead:\n" + "\n".join(offences)


def test_allow_list_is_current() -> None:
    """Every allowed file exists and still needs its entry, so the list only shrinks."""
    tracked = set(_tracked_files())
    stale = []
    for name in ALLOWED:
        path = ROOT / name
        if name not in tracked or not path.is_file():
            stale.append(f"{name}: not a tracked file")
            continue
        text = path.read_bytes().decode("utf-8", errors="ignore")
        if not any(p.search(text) for p in FORBIDDEN.values()):
            stale.append(f"{name}: no longer matches; remove it from ALLOWED")
    assert not stale, "\n".join(stale)


def test_cited_doc_anchors_exist() -> None:
    """Every `docs/<file>.md#<anchor>` cited in a file of the checkout names an anchor of that doc."""
    cite = re.compile(r"docs/(algorithms|models|generation|data)\.md#([\w-]+)")
    anchors: dict[str, set[str]] = {}
    for doc in ("algorithms", "models", "generation", "data"):
        path = ROOT / "docs" / f"{doc}.md"
        if path.is_file():
            anchors[doc] = set(re.findall(r'<a id="([\w-]+)"></a>', path.read_text()))
    missing = []
    for name in _tracked_files():
        path = ROOT / name
        if not path.is_file() or not name.endswith((".py", ".md")):
            continue
        text = path.read_text(errors="ignore")
        for match in cite.finditer(text):
            doc, anchor = match.groups()
            if doc in anchors and anchor not in anchors[doc]:
                missing.append(f"{name}: docs/{doc}.md#{anchor}")
    assert not missing, "unknown anchors:\n" + "\n".join(missing)
