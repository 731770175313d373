"""``DLLMModel``: an OpenCompass model running a dLLM checkpoint through ``dllm_rollout.generate``.

Only importable inside the ``envs/opencompass`` environment (imports opencompass).

Differences from DARE's adapters (docs/data.md#opencompass-adapters), on purpose:
- one class for every family: ``dllm_models.load_model`` picks the family from config.json and
  ``dllm_rollout.generate`` dispatches masked / block diffusion;
- prompts are rendered exactly as the native runner renders them (chat template with
  ``add_generation_prompt=True`` over the row's messages, trailing pre-filled assistant turn
  kept), or as raw text joined by newlines when the tokenizer has no chat template;
- responses are cut at the first EOS id, decoded with ``skip_special_tokens=True`` and
  stripped (native runner), then cut at any OpenCompass stop string;
- batched with per-sample seeds ``seed + sample index`` (the row index for the first replica,
  as in the native runner), so sampled runs do not depend on the batch size;
- decoding settings come from the constructor (a preset), not from ``max_out_len``.
"""

from __future__ import annotations

import logging
from typing import Any, Mapping, Sequence

import torch
from dllm_rollout import SamplingConfig, configure
from opencompass.models.base import BaseModel  # type: ignore[import-not-found,unused-ignore]
from opencompass.registry import MODELS  # type: ignore[import-not-found,unused-ignore]

from dllm_eval.opencompass.chat import ChatParser, encode_messages, to_messages
from dllm_eval.runner import _decode, _eos_ids

__all__ = ["DLLMModel", "loaded_models"]

logger = logging.getLogger(__name__)

_LOADED: dict[str, "DLLMModel"] = {}


def loaded_models() -> dict[str, "DLLMModel"]:
    """Models built in this process, by checkpoint path (used for the run manifest)."""
    return dict(_LOADED)


@MODELS.register_module()
class DLLMModel(BaseModel):  # type: ignore[misc,unused-ignore]
    """A diffusion LM checkpoint folder as an OpenCompass generation model.

    Args:
        path: checkpoint folder (config.json, safetensors, tokenizer files).
        decoding: the decoding settings, ``dllm_rollout.SamplingConfig`` fields by name (as
            ``configs.build_config`` writes them: ``dataclasses.asdict`` of the config).
        seed: base seed; sample ``i`` uses ``seed + i`` (None = unseeded).
        device: torch device (default: cuda if available, else cpu).
        dtype: parameter dtype (default: the checkpoint's).
        max_seq_len: OpenCompass's prompt-length bound (only used by OpenCompass itself).
        generation_kwargs: further SamplingConfig fields replacing those of ``decoding`` (e.g.
            top_k), as OpenCompass models take them.
    """

    def __init__(
        self,
        path: str,
        *,
        decoding: Mapping[str, Any],
        seed: int | None = 0,
        device: str | None = None,
        dtype: str | None = None,
        max_seq_len: int = 32768,
        tokenizer_only: bool = False,
        meta_template: dict[str, Any] | None = None,
        generation_kwargs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(path=path, max_seq_len=max_seq_len, tokenizer_only=tokenizer_only,
                         meta_template=meta_template,
                         generation_kwargs=dict(generation_kwargs or {}))
        if kwargs:
            logger.warning("DLLMModel ignores unknown arguments %s", sorted(kwargs))
        from dllm_models import load_model, load_tokenizer

        self.template_parser = ChatParser()
        # One config, validated as the presets' are.
        self.decoding: SamplingConfig = configure(None, **{**decoding, **self.generation_kwargs})
        self.seed = seed
        self.tokenizer = load_tokenizer(path)
        self.eos_ids = _eos_ids(self.tokenizer)
        self.model: Any = None
        if not tokenizer_only:
            dev = device or ("cuda" if torch.cuda.is_available() else "cpu")
            self.model = load_model(path, dtype=dtype, device=dev).eval()
            self.eos_ids = _eos_ids(self.tokenizer, self.model)
        self._warned_max_out_len = False
        _LOADED[str(path)] = self

    # -- OpenCompass API ----------------------------------------------------------------------
    def get_token_len(self, prompt: str) -> int:
        return len(self.tokenizer(prompt, add_special_tokens=False)["input_ids"])

    def get_token_len_from_template(self, templates: Any, mode: str = "gen") -> Any:
        parsed = self.parse_template(templates, mode=mode)
        if isinstance(parsed, dict):
            return len(encode_messages(self.tokenizer, parsed["messages"]))
        return [len(encode_messages(self.tokenizer, p["messages"])) for p in parsed]

    def encode_prompt(self, prompt: Any) -> list[int]:
        """Token ids of one OpenCompass prompt (string, prompt list or parsed prompt)."""
        return encode_messages(self.tokenizer, to_messages(prompt)["messages"])

    def generate(self, inputs: Sequence[Any], max_out_len: int | None = None,
                 stopping_criteria: Sequence[str] = (), **kwargs: Any) -> list[str]:
        """Generate one response per input with the constructor's decoding settings."""
        from dllm_rollout import generate as rollout_generate

        if not inputs:
            return []
        d = self.decoding
        if max_out_len is not None and max_out_len != d.max_new_tokens \
                and not self._warned_max_out_len:
            logger.warning("max_out_len=%s ignored: decoding uses max_new_tokens=%d (preset)",
                           max_out_len, d.max_new_tokens)
            self._warned_max_out_len = True
        parsed = [to_messages(p) for p in inputs]
        prompts = [encode_messages(self.tokenizer, p["messages"]) for p in parsed]
        seeds = None
        if self.seed is not None:
            seeds = [self.seed + (p["sample"] if p["sample"] is not None else i)
                     for i, p in enumerate(parsed)]
        with torch.no_grad():
            out = rollout_generate(self.model, prompts, d, seed=seeds)
        texts = [_decode(self.tokenizer, row, self.eos_ids) for row in out.response_ids.tolist()]
        return [_cut(t, stopping_criteria) for t in texts]


def _cut(text: str, stop: Sequence[str]) -> str:
    for s in stop:
        if s and s in text:
            text = text[: text.index(s)]
    return text
