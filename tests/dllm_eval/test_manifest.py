"""The weights fingerprint: one changed value changes it, the same weights give the same one, it is
the same whatever the tensors' order or device, and it is exact integer arithmetic."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from dllm_eval.manifest import _lane_sums, _words, build_manifest, weights_fingerprint


def _model(dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.LayerNorm(32), torch.nn.Linear(32, 8))
    model.register_buffer("steps", torch.tensor([3, 4], dtype=torch.int64))
    return model.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_one_changed_value_changes_it_and_a_copy_keeps_it(dtype: torch.dtype) -> None:
    model = _model(dtype)
    first = weights_fingerprint(model)
    assert first is not None and first.startswith("mix32-v1:")
    assert weights_fingerprint(copy.deepcopy(model)) == first  # same weights, same fingerprint
    for index in [(0, 0), (31, 15), (7, 3)]:
        other = copy.deepcopy(model)
        with torch.no_grad():
            w = other[0].weight
            w[index] = torch.nextafter(w[index], torch.tensor(float("inf"), dtype=dtype))  # one ulp
        assert weights_fingerprint(other) != first
    swapped = copy.deepcopy(model)  # two values trading places
    with torch.no_grad():
        a, b = swapped[2].weight[0, 0].clone(), swapped[2].weight[0, 1].clone()
        swapped[2].weight[0, 0], swapped[2].weight[0, 1] = b, a
    assert weights_fingerprint(swapped) != first


def test_dtype_shape_and_names_count() -> None:
    model = _model()
    assert weights_fingerprint(model.to(torch.float64)) != weights_fingerprint(_model())
    flat = torch.nn.Linear(4, 4, bias=False)
    reshaped = torch.nn.Module()
    reshaped.weight = torch.nn.Parameter(flat.weight.detach().reshape(2, 8).clone())
    assert weights_fingerprint(flat) != weights_fingerprint(reshaped)


def _signed(value: int, bits: int) -> int:
    value &= (1 << bits) - 1
    return value - (1 << bits) if value >= 1 << (bits - 1) else value


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float64])
def test_sums_are_exact_against_python_integers(dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch) -> None:
    import dllm_eval.manifest as manifest

    monkeypatch.setattr(manifest, "_CHUNK_WORDS", {"cpu": 16})  # three chunks of 16 words and a short one
    torch.manual_seed(1)
    words = _words(torch.randn(55 if dtype != torch.float64 else 27, dtype=dtype))
    values = words.tolist()  # signed words, as the int32 arithmetic widens them

    def lanes(x: int, j: int) -> tuple[int, int]:  # the same steps in Python's unbounded integers
        s = _signed(j * 0x2545F491, 32)
        m1 = _signed((x ^ s) * 0x7FEB352D, 32)
        return m1, _signed((m1 ^ s) * 0x68E31DA5, 32)

    pairs = [lanes(x, j) for j, x in enumerate(values)]
    assert _lane_sums(words) == [_signed(sum(p[0] for p in pairs), 64), _signed(sum(p[1] for p in pairs), 64)]


def test_chunks_do_not_change_the_sums(monkeypatch: pytest.MonkeyPatch) -> None:
    import dllm_eval.manifest as manifest

    words = _words(torch.randn(1000))
    whole = _lane_sums(words)
    for size in (1, 7, 64, 1 << 26):
        monkeypatch.setattr(manifest, "_CHUNK_WORDS", {"cpu": size})
        assert _lane_sums(words) == whole


def test_manifest_takes_a_given_fingerprint_without_computing_one() -> None:
    class Exploding(torch.nn.Module):
        def state_dict(self, *args: object, **kwargs: object) -> dict[str, torch.Tensor]:  # type: ignore[override]
            raise AssertionError("fingerprinted again")

    m = build_manifest(benchmark="gsm8k", preset="d1", decoding={}, eos_handling="", prompts=[[1]],
                       chat_template=None, model=Exploding(), seed=0, batch_size=1, limit=None,
                       fingerprint="mix32-v1:abc")
    assert m["weights_fingerprint"] == "mix32-v1:abc"


def test_manifest_records_how_the_model_and_the_decoder_ran() -> None:
    """The model's `KernelConfig` and the decoding's `speed` section are in the manifest (a run folder
    describes the run that made it); a module without kernels records None."""
    import dataclasses

    from dllm_models import KernelConfig, set_kernels
    from dllm_rollout import SamplingConfig, SpeedConfig
    from tests.dllm_models.tiny_configs import build_tiny

    model = set_kernels(build_tiny("sdar"), KernelConfig(decode_span=False, decode_splits=2))
    decoding = SamplingConfig(max_new_tokens=4, steps=4, block_length=4, speed=SpeedConfig(retire_rows=0))
    m = build_manifest(benchmark="gsm8k", preset="d1", decoding=dataclasses.asdict(decoding), eos_handling="",
                       prompts=[[1]], chat_template=None, model=model, seed=0, batch_size=1, limit=None,
                       fingerprint="mix32-v1:abc")
    assert m["kernels"] == dataclasses.asdict(KernelConfig(decode_span=False, decode_splits=2))
    assert m["kernels"]["decode_span"] is False and m["decoding"]["speed"]["retire_rows"] == 0
    assert json.loads(json.dumps(m))["kernels"] == m["kernels"]
    plain = build_manifest(benchmark="gsm8k", preset="d1", decoding={}, eos_handling="", prompts=[[1]],
                           chat_template=None, model=torch.nn.Linear(2, 2), seed=0, batch_size=1, limit=None,
                           fingerprint="x")
    assert plain["kernels"] is None


@pytest.mark.gpu
def test_same_fingerprint_on_cpu_and_gpu() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    for dtype in (torch.float32, torch.bfloat16):
        model = _model(dtype)
        assert weights_fingerprint(copy.deepcopy(model).cuda()) == weights_fingerprint(model)
