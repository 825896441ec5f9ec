"""A small Llama-style decoder whose attention goes through an attention backend.

Embedding, RMSNorm, rotary position embedding, fused QKV projection, GQA
attention (``backend.forward``, as SGLang's RadixAttention calls it), SwiGLU
MLP, LM head. Weights are random but deterministic: drawn in float32 from a
seeded generator, then cast to the model's dtype, so models of different
dtypes built from one seed hold the same weights up to rounding. Nothing is
downloaded. Linear weights are N(0, 1/fan_in), which keeps every
projection's output near unit variance (V included, which is what the
default static int8 scale assumes), except Q and K, drawn ``qk_gain`` times
larger: with unit-variance Q and K the scores q.k/sqrt(D) are ~N(0, 1) and a
random model's attention is nearly uniform, its output an average that
shrinks with the context and hardly moves the logits. Scores with standard
deviation ``qk_gain**2`` make attention pick out a few tokens, as a trained
model's does, so what attention reads shows in the generated tokens.

``MODELS["gpt-oss"]`` is the same decoder with gpt-oss's attention:
sliding-window layers alternating with full-attention ones (layer 0
sliding, as gpt-oss's ``layer_types`` start) and a learned sink per query
head. Its window is small (16 keys) so that ordinary prompts outrun it. The
sinks are drawn after every other weight, N(0, ``sink_std``**2): with scores
of standard deviation ~2, some heads' sinks outweigh every key (their output
shrinks towards zero, as a trained gpt-oss head does when nothing in its
window matters) while others hardly change the softmax. Its other weights
are those of the same configuration without sinks.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .backends import AttentionBackend, AttentionLayer
from .batch import ForwardBatch

__all__ = ["ModelConfig", "LlamaModel", "MODELS"]


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int = 512
    hidden_size: int = 256
    num_layers: int = 2
    num_heads: int = 8
    num_kv_heads: int = 2
    head_dim: int = 32
    intermediate_size: int = 512
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    max_position: int = 4096
    logit_cap: float = 0.0
    qk_gain: float = 1.5
    # gpt-oss-style attention. sliding_window: keys a sliding layer's query sees, its own included (HF's
    # `sliding_window`); even layers slide, odd ones attend to everything. 0: every layer is full attention.
    sliding_window: int = 0
    attention_sinks: bool = False  # a learned sink logit per query head in every layer
    sink_std: float = 2.0

    def __post_init__(self) -> None:
        if self.sliding_window < 0:
            raise ValueError(f"sliding_window = {self.sliding_window} must be >= 1 (keys seen), or 0 for none")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads = {self.num_heads} must be a multiple of num_kv_heads = {self.num_kv_heads}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim = {self.head_dim} must be even (rotary embedding rotates pairs)")

    def static_kv_scales(self) -> tuple[float, float]:
        """int8 static (K, V) scales whose codes cover 5 standard deviations of this model's K and V."""
        return 5 * self.qk_gain / 127, 5 / 127

    def layer_window(self, layer_id: int) -> int:
        """The layer's window in SGLang's RadixAttention convention: previous tokens seen besides the query's
        own (``sliding_window - 1``, as SGLang's gpt-oss model passes it), -1 for a full-attention layer."""
        return self.sliding_window - 1 if self.sliding_window > 0 and layer_id % 2 == 0 else -1

    def describe(self) -> str:
        text = (
            f"{self.num_layers} layers, hidden {self.hidden_size}, {self.num_heads} query / "
            f"{self.num_kv_heads} KV heads, head dim {self.head_dim}, MLP {self.intermediate_size}, "
            f"vocab {self.vocab_size}"
        )
        if self.sliding_window:
            sliding = [i for i in range(self.num_layers) if self.layer_window(i) >= 0]
            text += f", {self.sliding_window}-token sliding window in layers {sliding} (the others full)"
        if self.attention_sinks:
            text += ", attention sinks"
        return text


# The demo's --model choices. Both keep the default dimensions; "gpt-oss" adds gpt-oss's attention.
MODELS: dict[str, ModelConfig] = {
    "llama": ModelConfig(),
    "gpt-oss": ModelConfig(sliding_window=16, attention_sinks=True),
}


class _Weights:
    """Draws every weight in a fixed order from one seeded generator."""

    def __init__(self, seed: int, dtype: torch.dtype) -> None:
        self.g = torch.Generator().manual_seed(seed)
        self.dtype = dtype

    def linear(self, out_features: int, in_features: int, gain: float = 1.0) -> torch.Tensor:
        w = torch.randn(out_features, in_features, generator=self.g) * (gain / math.sqrt(in_features))
        return w.to(self.dtype)

    def norm(self, size: int) -> torch.Tensor:
        return (1 + 0.1 * torch.randn(size, generator=self.g)).to(self.dtype)

    def embedding(self, vocab: int, hidden: int) -> torch.Tensor:
        return torch.randn(vocab, hidden, generator=self.g).to(self.dtype)

    def sinks(self, heads: int, std: float) -> torch.Tensor:
        return (std * torch.randn(heads, generator=self.g)).to(self.dtype)


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * weight


class _Rotary:
    """Precomputed cos/sin tables; rotates the two halves of each head (the Llama / NeoX layout)."""

    def __init__(self, head_dim: int, max_position: int, theta: float) -> None:
        inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
        angles = torch.arange(max_position, dtype=torch.float64)[:, None] * inv_freq[None, :]
        self.cos, self.sin = angles.cos().float(), angles.sin().float()

    def __call__(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """x ``[T, heads, D]`` at ``positions`` ``[T]``."""
        cos, sin = self.cos[positions][:, None, :], self.sin[positions][:, None, :]
        first, second = x.float().chunk(2, dim=-1)
        return torch.cat([first * cos - second * sin, second * cos + first * sin], dim=-1).to(x.dtype)


class _DecoderLayer:
    def __init__(self, cfg: ModelConfig, layer_id: int, w: _Weights) -> None:
        self.cfg = cfg
        h, hkv, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.input_norm = w.norm(cfg.hidden_size)
        self.qkv_proj = torch.cat(
            [w.linear((h + hkv) * d, cfg.hidden_size, gain=cfg.qk_gain), w.linear(hkv * d, cfg.hidden_size)]
        )
        self.o_proj = w.linear(cfg.hidden_size, h * d)
        self.post_attention_norm = w.norm(cfg.hidden_size)
        self.gate_up_proj = w.linear(2 * cfg.intermediate_size, cfg.hidden_size)
        self.down_proj = w.linear(cfg.hidden_size, cfg.intermediate_size)
        self.attn = AttentionLayer(
            layer_id=layer_id,
            num_heads=h,
            num_kv_heads=hkv,
            head_dim=d,
            v_head_dim=d,
            scaling=d**-0.5,
            logit_cap=cfg.logit_cap,
            sliding_window_size=cfg.layer_window(layer_id),
        )

    def __call__(
        self,
        hidden: torch.Tensor,
        positions: torch.Tensor,
        rotary: _Rotary,
        batch: ForwardBatch,
        backend: AttentionBackend,
        save_kv_cache: bool,
    ) -> torch.Tensor:
        cfg, tokens = self.cfg, hidden.shape[0]
        h, hkv, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        x = _rms_norm(hidden, self.input_norm, cfg.rms_norm_eps)
        q, k, v = F.linear(x, self.qkv_proj).split([h * d, hkv * d, hkv * d], dim=-1)
        q = rotary(q.reshape(tokens, h, d), positions)
        k = rotary(k.reshape(tokens, hkv, d), positions)
        v = v.reshape(tokens, hkv, d)
        attn = backend.forward(q, k, v, self.attn, batch, save_kv_cache=save_kv_cache)
        hidden = hidden + F.linear(attn, self.o_proj)
        x = _rms_norm(hidden, self.post_attention_norm, cfg.rms_norm_eps)
        gate, up = F.linear(x, self.gate_up_proj).chunk(2, dim=-1)
        return hidden + F.linear(F.silu(gate) * up, self.down_proj)


class LlamaModel:
    """``forward(input_ids, batch, backend)`` -> float32 logits of each sequence's last new token."""

    def __init__(self, cfg: ModelConfig, dtype: torch.dtype = torch.float32, seed: int = 0) -> None:
        self.cfg, self.dtype, self.seed = cfg, dtype, seed
        w = _Weights(seed, dtype)
        self.embed_tokens = w.embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = [_DecoderLayer(cfg, i, w) for i in range(cfg.num_layers)]
        self.final_norm = w.norm(cfg.hidden_size)
        self.lm_head = w.linear(cfg.vocab_size, cfg.hidden_size)
        if cfg.attention_sinks:
            # Drawn last, so the other weights are those of the configuration without sinks.
            for layer in self.layers:
                layer.attn = dataclasses.replace(layer.attn, sinks=w.sinks(cfg.num_heads, cfg.sink_std))
        self.rotary = _Rotary(cfg.head_dim, cfg.max_position, cfg.rope_theta)

    @torch.inference_mode()
    def forward(
        self, input_ids: torch.Tensor, batch: ForwardBatch, backend: AttentionBackend, save_kv_cache: bool = True
    ) -> torch.Tensor:
        if input_ids.shape != (batch.num_tokens,):
            raise ValueError(f"input_ids has shape {tuple(input_ids.shape)}, the batch has {batch.num_tokens} tokens")
        if int(batch.positions.max()) >= self.cfg.max_position:
            raise ValueError(f"position {int(batch.positions.max())} exceeds max_position = {self.cfg.max_position}")
        backend.init_forward_metadata(batch)
        hidden = self.embed_tokens[input_ids]
        for layer in self.layers:
            hidden = layer(hidden, batch.positions, self.rotary, batch, backend, save_kv_cache)
        last = _rms_norm(hidden[batch.last_token_rows], self.final_norm, self.cfg.rms_norm_eps)
        return F.linear(last, self.lm_head).float()
