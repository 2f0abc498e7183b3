"""Named layer shapes for ``moe run``, ``moe bench`` and ``moe tune``.

The model presets are the routed experts of real models (per GPU where the
name says tp8). The toy presets are small enough for a CPU in milliseconds.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ShapePreset:
    name: str
    num_experts: int
    top_k: int
    hidden_size: int
    intermediate_size: int
    activation: str = "silu"
    has_bias: bool = False
    description: str = ""

    def config(self, quant_scheme: str, dtype):
        """This shape as a ``MoeConfig`` (what ``moe bench`` and a backend's tuner build per preset)."""
        from moe_core.config import MoeConfig  # torch is imported only when a config is built

        return MoeConfig(self.num_experts, self.top_k, self.hidden_size, self.intermediate_size,
                         quant_scheme=quant_scheme, activation=self.activation, has_bias=self.has_bias,
                         dtype=dtype)  # fmt: skip


PRESETS: dict[str, ShapePreset] = {
    p.name: p
    for p in (
        ShapePreset("tiny", 8, 2, 128, 256, description="toy shape for CPU smoke runs"),
        ShapePreset("small", 32, 4, 512, 256, description="toy shape, a few ms on a CPU"),
        ShapePreset("mixtral-8x7b", 8, 2, 4096, 14336, description="Mixtral 8x7B"),
        ShapePreset("qwen3-30b-a3b", 128, 8, 2048, 768, description="Qwen3-30B-A3B"),
        ShapePreset("deepseek-v3-tp8", 256, 8, 7168, 256, description="DeepSeek-V3 routed experts, TP=8"),
        ShapePreset(
            "gpt-oss-120b",
            128,
            4,
            2880,
            2880,
            activation="swiglu_oai",
            has_bias=True,
            description="gpt-oss-120b (swiglu_oai, biases)",
        ),
    )
}

MODEL_PRESETS = ("mixtral-8x7b", "qwen3-30b-a3b", "deepseek-v3-tp8", "gpt-oss-120b")
TOY_PRESETS = ("tiny", "small")
