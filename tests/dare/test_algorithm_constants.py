"""The flags of an algorithm's math (`row_local`, `needs_old`, ...) are no command-line keys."""

from __future__ import annotations

from pathlib import Path

import pytest

from dare.cli import main


@pytest.mark.parametrize(("recipe", "key", "name"), [
    ("quickstart", "algorithm.row_local=true", "d1"),
    ("quickstart", "algorithm.needs_old=false", "d1"),
    ("llada-espo", "algorithm.needs_reference=false", "espo"),
    ("llada-dmpo", "algorithm.needs_rollout_reference=false", "dmpo"),
    ("llada-vrpo", "algorithm.share_masks=false", "vrpo"),
    ("llada-sft", "algorithm.row_local=false", "sft"),
])
def test_a_correctness_flag_is_an_unknown_key(recipe: str, key: str, name: str, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as err:
        main(["train", recipe, key, "--output-dir", f"{tmp_path}/run"])
    assert err.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    field = key.split("=")[0]
    assert len(lines) == 1 and lines[0].startswith(f"dare: error: unknown config key '{field}'"), lines
    assert f"algorithm {name!r} has [" in lines[0]


def test_a_renamed_key_names_its_new_spelling(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # DMPO's masks per sequence are `mc_num`, as in every other algorithm (it was `num_replicates`)
    with pytest.raises(SystemExit) as err:
        main(["train", "llada-dmpo", "algorithm.num_replicates=2", "--output-dir", f"{tmp_path}/run"])
    assert err.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "(renamed: use 'algorithm.mc_num')" in lines[0], lines
