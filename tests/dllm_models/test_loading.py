"""Every release folder builds on the meta device with exactly the checkpoint's weight names;
every family is registered, round-trips its config and loads with fresh weights."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from dllm_models import FAMILIES, build_model, family_for, load_model, save_model
from tests.dllm_models.tiny_configs import TINY_CONFIGS, build_tiny

CHECKPOINTS = Path(__file__).resolve().parents[3] / "shared" / "checkpoints"
FOLDERS = sorted(p.name for p in CHECKPOINTS.iterdir()) if CHECKPOINTS.is_dir() else []
# parameters per release (embeddings untied), from the meta build; model cards agree
PARAMS = {
    "Dream-v0-Instruct-7B": 7_615_616_512,
    "LLaDA-8B-Instruct": 8_015_581_184,
    "LLaDA2.0-mini": 16_255_638_528,
    "LLaDA2.1-mini": 16_255_638_528,
    "SDAR-1dot7B-Chat": 2_031_739_904,
    "SDAR-4B-Chat": 4_411_424_256,
    "SDAR-8B-Chat": 8_190_735_360,
    "SDAR-30B-A3B-Chat": 30_532_122_624,
}


def _qwen3_names(n_layers: int) -> set[str]:
    """Transformers' Qwen3 weight names (SDAR-1.7B ships one safetensors file and no index)."""
    per_layer = [
        "input_layernorm.weight", "post_attention_layernorm.weight",
        "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight",
        *(f"self_attn.{p}_proj.weight" for p in "qkvo"),
        "self_attn.q_norm.weight", "self_attn.k_norm.weight",
    ]
    names = {f"model.layers.{i}.{p}" for i in range(n_layers) for p in per_layer}
    return names | {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"}


@pytest.mark.skipif(not FOLDERS, reason="needs ../shared/checkpoints beside the repository")
@pytest.mark.parametrize("folder", FOLDERS)
def test_meta_build_matches_release_weight_names(folder: str) -> None:
    root = CHECKPOINTS / folder
    model = load_model(root, device="meta", load_weights=False)
    raw = json.loads((root / "config.json").read_text())
    index = root / "model.safetensors.index.json"
    if index.is_file():
        expected = set(json.loads(index.read_text())["weight_map"])
    else:
        assert raw["model_type"] == "sdar"
        expected = _qwen3_names(raw["num_hidden_layers"])
    assert set(model.state_dict()) == expected
    assert getattr(model, "traits").family == family_for(raw).name
    if folder in PARAMS:
        assert sum(p.numel() for p in model.parameters()) == PARAMS[folder]
    assert next(model.parameters()).dtype == torch.bfloat16


@pytest.mark.skipif(not FOLDERS, reason="needs ../shared/checkpoints beside the repository")
def test_release_traits_follow_the_spec_table() -> None:
    want = {
        "Dream-v0-Instruct-7B": (151666, 151643, 151643, None, 1),
        "SDAR-4B-Chat": (151669, 151643, 151643, 4, 0),
        "SDAR-30B-A3B-Chat": (151669, 151643, 151643, 4, 0),
        "LLaDA2.0-mini": (156895, 156892, 156892, 32, 0),
    }
    for folder, expect in want.items():
        raw = json.loads((CHECKPOINTS / folder / "config.json").read_text())
        raw["num_hidden_layers"] = 1  # traits depend on the config only; keep the build small
        fam = family_for(raw)
        cfg = fam.config_cls.from_hf(raw)
        with torch.device("meta"):
            t = fam.model_cls(cfg).traits
        assert (t.mask_token_id, t.eos_token_id, t.pad_token_id, t.block_length, t.logit_shift) == expect


@pytest.mark.skipif(not FOLDERS, reason="needs ../shared/checkpoints beside the repository")
@pytest.mark.parametrize("folder", ["Dream-v0-Instruct-7B", "SDAR-30B-A3B-Chat", "LLaDA2.0-mini"])
def test_release_config_round_trips(folder: str) -> None:
    raw = json.loads((CHECKPOINTS / folder / "config.json").read_text())
    fam = family_for(raw)
    back = fam.config_cls.from_hf(raw).to_hf()
    assert {k: back[k] for k in raw} == raw


@pytest.mark.parametrize("family", sorted(TINY_CONFIGS))
def test_every_family_is_registered_and_builds(family: str) -> None:
    fam = family_for(TINY_CONFIGS[family]())
    assert family in fam.model_types and FAMILIES[fam.name] is fam
    model = build_model(TINY_CONFIGS[family]())
    assert getattr(model, "traits").family == fam.name
    assert getattr(model, "attention_backend") == "sdpa"


@pytest.mark.parametrize("family", sorted(TINY_CONFIGS))
def test_load_fresh_weights_and_config_keys_survive(tmp_path: Path, family: str) -> None:
    model = build_tiny(family)
    save_model(model, tmp_path / "m")
    raw = json.loads((tmp_path / "m" / "config.json").read_text())
    assert raw["model_type"] == family
    again = load_model(tmp_path / "m", load_weights=False, seed=3)
    ids = torch.randint(0, 60, (1, 6))
    assert again(ids).logits.shape == (1, 6, 64)
    assert set(again.state_dict()) == set(model.state_dict())


@pytest.mark.parametrize("family", sorted(TINY_CONFIGS))
def test_eager_backend_and_gradient_checkpointing_agree(family: str) -> None:
    model = build_tiny(family)
    ids = torch.randint(0, 60, (2, 8), generator=torch.Generator().manual_seed(0))
    ref = model(ids).logits
    setattr(model, "attention_backend", "eager")
    torch.testing.assert_close(model(ids).logits, ref, rtol=1e-5, atol=1e-5)
    setattr(model, "attention_backend", "sdpa")
    setattr(model, "gradient_checkpointing", True)
    model.train()
    out = model(ids).logits
    out.float().square().mean().backward()
    torch.testing.assert_close(out.detach(), ref, rtol=1e-5, atol=1e-5)
    assert all(p.grad is not None for n, p in model.named_parameters() if "experts" not in n)


def test_one_canonical_name_per_family() -> None:
    from dllm_models import FAMILY_NAMES, MODEL_TYPES, family_kind, family_names, get_family

    assert FAMILY_NAMES == ("llada", "dream", "sdar", "sdar_moe", "llada2")
    assert MODEL_TYPES == {"llada": "llada", "Dream": "dream", "sdar": "sdar", "sdar_moe": "sdar_moe",
                           "llada2_moe": "llada2"}
    assert family_names("masked") == ("llada", "dream")
    assert family_names("block") == ("sdar", "sdar_moe", "llada2")
    assert family_kind("Dream") == family_kind("dream") == "masked"
    assert get_family("llada2_moe") is get_family("llada2") is FAMILIES["llada2"]
    with pytest.raises(ValueError, match="model family 'gpt2' is unknown; choose one of"):
        get_family("gpt2")
    with pytest.raises(ValueError, match="family kind"):
        family_names("causal")


def test_partial_checkpoint_folders_are_clear_value_errors(tmp_path: Path) -> None:
    from dllm_models import CheckpointFilesError, load_tokenizer

    with pytest.raises(ValueError, match="does not exist"):
        load_model(tmp_path / "nowhere")
    with pytest.raises(ValueError, match="config.json not found"):
        load_model(tmp_path)
    folder = tmp_path / "m"
    save_model(build_tiny("sdar"), folder)
    (folder / "model.safetensors").unlink()  # config only, like a folder whose weights were not copied
    with pytest.raises(ValueError, match="has no weights"):
        load_model(folder)
    with pytest.raises(CheckpointFilesError, match="no tokenizer vocabulary"):
        load_tokenizer(folder)
    assert load_model(folder, load_weights=False) is not None
    sharded = tmp_path / "sharded"
    save_model(build_tiny("sdar"), sharded, max_shard_bytes=20_000)
    shards = sorted(sharded.glob("model-*.safetensors"))
    assert len(shards) > 1
    shards[-1].unlink()
    with pytest.raises(ValueError, match="shard\\(s\\) missing"):
        load_model(sharded)


def test_empty_model_allocates_the_architecture_in_its_dtype_and_restores_the_default() -> None:
    from dllm_models import build_model, empty_model

    raw = {"model_type": "llada", "d_model": 32, "n_layers": 1, "n_heads": 2, "n_kv_heads": 2,
           "mlp_hidden_size": 64, "vocab_size": 40, "embedding_size": 40, "mask_token_id": 39}
    before = torch.get_default_dtype()
    model = empty_model(raw, dtype=torch.bfloat16, device="cpu")
    assert torch.get_default_dtype() == before
    params = dict(model.named_parameters())
    assert params and all(p.dtype == torch.bfloat16 and p.device.type == "cpu" for p in params.values())
    with torch.device("meta"):
        reference = dict(build_model(raw).named_parameters())
    assert {k: tuple(v.shape) for k, v in params.items()} == {k: tuple(v.shape) for k, v in reference.items()}


@pytest.mark.skipif(not FOLDERS, reason="needs ../shared/checkpoints beside the repository")
def test_release_stop_ids_come_from_generation_config() -> None:
    """SDAR chat models end a turn with <|im_end|> (generation_config.json lists it before <|endoftext|>);
    the masked families' generation configs list their EOS only."""
    want = {"SDAR-8B-Chat": (151643, 151645), "SDAR-4B-Chat": (151643, 151645),
            "SDAR-30B-A3B-Chat": (151643, 151645), "LLaDA-8B-Instruct": (126081,),
            "Dream-v0-Instruct-7B": (151643,)}
    for folder, stops in want.items():
        model = load_model(CHECKPOINTS / folder, device="meta", load_weights=False)
        assert getattr(model, "traits").stop_ids == stops, folder


def test_stop_ids_are_the_eos_then_the_others_once() -> None:
    from dllm_models import DiffusionTraits

    t = DiffusionTraits(family="sdar", mask_token_id=3, eos_token_id=2, pad_token_id=2, stop_token_ids=(5, 2, 5, 7))
    assert t.stop_ids == (2, 5, 7)
    assert DiffusionTraits(family="sdar", mask_token_id=3, eos_token_id=2, pad_token_id=2).stop_ids == (2,)
    for bad in ((-1,), (True,), [5]):
        with pytest.raises(ValueError, match="stop_token_ids"):
            DiffusionTraits(family="sdar", mask_token_id=3, eos_token_id=2, pad_token_id=2,
                            stop_token_ids=bad)  # type: ignore[arg-type]


def test_stop_ids_round_trip_through_a_checkpoint_folder(tmp_path: Path) -> None:
    import dataclasses

    from dllm_models import generation_stop_ids

    model = build_tiny("sdar")
    traits = getattr(model, "traits")
    save_model(model, tmp_path / "plain")  # the EOS only: no generation_config.json is written
    assert not (tmp_path / "plain" / "generation_config.json").exists()
    assert getattr(load_model(tmp_path / "plain", load_weights=False), "traits").stop_ids == (traits.eos_token_id,)
    setattr(model, "traits", dataclasses.replace(traits, stop_token_ids=(traits.eos_token_id, 60)))
    save_model(model, tmp_path / "chat")
    assert generation_stop_ids(tmp_path / "chat") == (traits.eos_token_id, 60)
    again = load_model(tmp_path / "chat", load_weights=False)
    assert getattr(again, "traits").stop_ids == (traits.eos_token_id, 60)
    assert getattr(again, "traits").eos_token_id == traits.eos_token_id  # config.json's EOS is unchanged
    # a release's own generation_config.json (an id, or a list with the stop id first) is read as written
    (tmp_path / "chat" / "generation_config.json").write_text('{"eos_token_id": [61, 59], "temperature": 0.6}')
    assert getattr(load_model(tmp_path / "chat", load_weights=False), "traits").stop_ids == (traits.eos_token_id, 61, 59)
    (tmp_path / "chat" / "generation_config.json").write_text('{"eos_token_id": 61}')
    assert generation_stop_ids(tmp_path / "chat") == (61,)
    (tmp_path / "chat" / "generation_config.json").write_text('{"do_sample": true}')
    assert generation_stop_ids(tmp_path / "chat") == ()


@pytest.mark.parametrize("text, match", [
    ("{not json", "not valid JSON"),
    ("[1, 2]", "not a JSON object"),
    ('{"eos_token_id": "<|im_end|>"}', "eos_token_id='<|im_end|>' must be a token id"),
    ('{"eos_token_id": [151645, -1]}', "eos_token_id=\\[151645, -1\\] must be a token id"),
])
def test_a_bad_generation_config_is_one_clear_error(tmp_path: Path, text: str, match: str) -> None:
    save_model(build_tiny("sdar"), tmp_path / "m")
    (tmp_path / "m" / "generation_config.json").write_text(text)
    with pytest.raises(ValueError, match=match):
        load_model(tmp_path / "m", load_weights=False)
