"""Re-costing an op trace for another hidden size (``hidden:H``; Lumos, MLSys 2025, section 3.4).

Why a FLOPs and bytes model rather than a fit against FLOPs: an op trace
(the StragglerAnalysis schema) has one op per stage and micro-batch for the
whole forward (or backward) of the stage's layers, with no shapes, FLOPs or
bytes. At the traced hidden size every op of a type on a stage does the same
FLOPs, so duration cannot be regressed on FLOPs from the trace: its spread
is rank speed, noise and (SE) sequence lengths it does not record. What the
trace does support is the layer model (:mod:`.repartition`), fitted on its
per-stage means: a cost per layer and the first and last stages' extras per
op type. ``hidden:H`` keeps that fit and moves each of its terms by how its
work grows with the hidden size h, from Megatron's counts (Narayanan et al.,
SC 2021), for a sequence of s tokens and an MLP of f = ``ffn_hidden_size``:

* a layer's compute (forward and backward) by its FLOPs per token:
  ``8h^2 + 4hf`` (GEMMs; ``8h^2 + 6hf`` with SwiGLU) ``+ 4sh`` (attention
  scores and values), taken as compute-bound: time in proportion to FLOPs;
* a layer's parameter all-gather, gradient reduce-scatter and optimizer by
  its parameters (``4h^2 + 2hf + 9h + f``; SwiGLU ``4h^2 + 3hf + 9h + 2f``):
  bandwidth-bound, time in proportion to bytes;
* the first and last stages' extras (input embedding, output layer and
  loss: ``h x vocabulary`` FLOPs and parameters), the pipeline sends and
  receives (activations, ``s x h``), the embedding and layernorm gradient
  all-reduces: in proportion to h;
* the rest (the grad-norm all-reduce of one number, gc) unchanged.

f keeps its ratio to h. At the traced h every factor is 1, so
``hidden:<traced h>`` gives the baseline back exactly.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from prism.whatif.optrace import COMPUTE, P2P
from prism.whatif.repartition import LayerModel

__all__ = ["Architecture", "PARAM_SCALED", "LINEAR_IN_H", "architecture", "checked_hidden", "hidden_costs", "hidden_factors"]

#: layer-model op types whose per-layer term moves with a layer's parameters (the rest of the layer model: FLOPs)
PARAM_SCALED = ("params-all-gather", "grads-reduce-scatter", "optimizer")
#: op types whose work is in proportion to h: activations between stages, the embedding's and the layernorms' gradients
LINEAR_IN_H = P2P + ("embedding-grads-all-reduce", "layernorm-grads-all-reduce")


@dataclass(frozen=True)
class Architecture:
    """What ``hidden:H`` needs of the traced model (``--meta``)."""

    hidden: int
    seq_length: int
    ffn_ratio: float  # ffn_hidden_size / hidden_size, kept at the new h
    swiglu: bool = False
    heads: int | None = None

    def layer_flops(self, h: float) -> float:
        """Forward FLOPs per token of one transformer layer at hidden size h (backward: twice, the same ratio)."""
        f = self.ffn_ratio * h
        return 8 * h * h + (6 if self.swiglu else 4) * h * f + 4 * self.seq_length * h

    def layer_params(self, h: float) -> float:
        """Parameters of one transformer layer at hidden size h (weights, biases, two layernorms)."""
        f = self.ffn_ratio * h
        return 4 * h * h + (3 if self.swiglu else 2) * h * f + 9 * h + (2 if self.swiglu else 1) * f

    def factors(self, h: float) -> dict[str, float]:
        """Work at hidden size h over the traced: per layer (``flops``, ``params``) and ``linear`` (in h)."""
        return {"flops": self.layer_flops(h) / self.layer_flops(self.hidden),
                "params": self.layer_params(h) / self.layer_params(self.hidden),
                "linear": h / self.hidden}


def _whole(meta: dict, key: str) -> int | None:
    v = meta.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not str(v).isdigit() or int(v) < 1:
        raise ValueError(f"--meta: {key} must be a whole number >= 1, got {v!r}")
    return int(v)


def architecture(meta: dict, what: str) -> Architecture:
    """The traced model from ``--meta`` (``hidden_size``, ``seq_length``; optional ``ffn_hidden_size``, default 4h,
    ``swiglu``, ``num_attention_heads``); ``what`` names the scenario in errors."""
    h, s = _whole(meta, "hidden_size"), _whole(meta, "seq_length")
    if h is None or s is None:
        raise ValueError(f"--scenario {what}: needs the traced model's hidden size and sequence length: --meta "
                         "hidden_size and seq_length (the op trace does not record them)")
    f = _whole(meta, "ffn_hidden_size") or 4 * h
    swiglu = meta.get("swiglu", False)
    if not isinstance(swiglu, bool):
        raise ValueError(f"--meta: swiglu must be true or false, got {swiglu!r}")
    return Architecture(h, s, f / h, swiglu, _whole(meta, "num_attention_heads"))


def checked_hidden(arch: Architecture, new: int, what: str) -> int:
    """``new`` if a model can have it: it must split over the attention heads, as Megatron requires."""
    if arch.heads and new % arch.heads:
        raise ValueError(f"--scenario {what}: {new} does not split over the {arch.heads} attention heads "
                         "(--meta num_attention_heads)")
    return new


def hidden_costs(models: dict[str, LayerModel], arch: Architecture, h: float) -> dict[str, LayerModel]:
    """The layer models costed at hidden size h: the per-layer term by FLOPs or parameters, the stage extras by h."""
    f = arch.factors(h)
    out = {}
    for optype, m in models.items():
        per = f["params"] if optype in PARAM_SCALED else f["flops"]
        assert optype in PARAM_SCALED or optype in COMPUTE, optype  # a new layer-model type needs its rule here
        out[optype] = replace(m, per_layer=m.per_layer * per, first=m.first * f["linear"], last=m.last * f["linear"])
    return out


def hidden_factors(ops: pd.DataFrame, arch: Architecture, h: float) -> np.ndarray:
    """Per op, its work's factor at hidden size h for the op types outside the layer model (1 for the others)."""
    return np.where(ops["optype"].isin(LINEAR_IN_H).to_numpy(), arch.factors(h)["linear"], 1.0)
