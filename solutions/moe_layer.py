"""Lesson 09's mixture-of-experts layer and routers, given to students (not exercises).

``MoELayer`` is a router and ``n_experts`` gated MLPs: each token goes to the ``top_k`` experts
with the highest router scores, and the layer adds up their outputs weighted by the scores
(renormalised over the chosen experts, as Mixtral does). Tokens are *dispatched*: each expert
multiplies only the rows of the tokens sent to it, so FlopCounterMode sees the FLOPs of the
(token, expert) pairs and nothing more. A routing can also be imposed (``experts_of``), to count
or time the layer under any spread of tokens.

The routers below simulate what a trained router does to the load: uniformly at random, or
skewed towards some experts. The two balancing schemes are the Switch Transformer's auxiliary
loss and DeepSeek-V3's bias on the routing scores, adjusted after every step.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor, nn

from solutions.experts import dropped_tokens


class GatedMLP(nn.Module):
    """A SwiGLU MLP, three (d_model, d_ff) matrices: down(silu(gate(x)) * up(x))."""

    def __init__(self, d_model: int, d_ff: int) -> None:
        super().__init__()
        self.gate = nn.Linear(d_model, d_ff, bias=False)
        self.up = nn.Linear(d_model, d_ff, bias=False)
        self.down = nn.Linear(d_ff, d_model, bias=False)

    def forward(self, x: Float[Tensor, "tokens d_model"]) -> Float[Tensor, "tokens d_model"]:
        return self.down(F.silu(self.gate(x)) * self.up(x))


class MoELayer(nn.Module):
    """A router, ``n_experts`` routed experts and ``n_shared_experts`` shared ones.

    ``counts`` holds, after each call, the (token, expert) assignments each routed expert got.
    """

    def __init__(self, d_model: int, d_ff_expert: int, n_experts: int, top_k: int,
                 n_shared_experts: int = 0) -> None:
        super().__init__()
        if not 1 <= top_k <= n_experts:
            raise ValueError(f"top_k must be between 1 and n_experts={n_experts}, got {top_k}")
        self.top_k = top_k
        self.router = nn.Linear(d_model, n_experts, bias=False)
        self.experts = nn.ModuleList(GatedMLP(d_model, d_ff_expert) for _ in range(n_experts))
        self.shared = nn.ModuleList(GatedMLP(d_model, d_ff_expert)
                                    for _ in range(n_shared_experts))
        self.counts = torch.zeros(n_experts, dtype=torch.int64)

    def forward(self, x: Float[Tensor, "tokens d_model"],
                experts_of: Int[Tensor, "tokens top_k"] | None = None,
                ) -> Float[Tensor, "tokens d_model"]:
        """The layer's output; ``experts_of`` imposes each token's experts (distinct, top_k of
        them) instead of the router's choice, which still weighs their outputs."""
        scores = self.router(x).softmax(dim=-1)  # (tokens, n_experts)
        if experts_of is None:
            experts_of = scores.topk(self.top_k, dim=-1).indices
        weights = scores.gather(1, experts_of)
        weights = weights / weights.sum(dim=-1, keepdim=True)
        out = torch.zeros_like(x)
        for shared in self.shared:
            out += shared(x)
        self.counts = torch.bincount(experts_of.flatten().cpu(), minlength=len(self.experts))
        for e, expert in enumerate(self.experts):
            token, slot = (experts_of == e).nonzero(as_tuple=True)  # who goes to expert e
            if len(token):  # dispatch: the expert multiplies its own tokens' rows only
                out.index_add_(0, token, weights[token, slot, None] * expert(x[token]))
        return out


def uniform_routing(n_tokens: int, n_experts: int, top_k: int,
                    generator: torch.Generator | None = None) -> Int[Tensor, "tokens top_k"]:
    """Each token's top_k distinct experts, drawn uniformly at random: the top_k of E random
    numbers are a uniformly random set of top_k experts."""
    return torch.rand(n_tokens, n_experts, generator=generator).topk(top_k, dim=-1).indices


def skewed_routing(n_tokens: int, popularity: Float[Tensor, " n_experts"], top_k: int,
                   generator: torch.Generator | None = None) -> Int[Tensor, "tokens top_k"]:
    """Each token's top_k distinct experts, drawn in proportion to ``popularity`` one after
    the other without replacement (the Gumbel top-k trick: the top_k of log p + Gumbel noise)."""
    uniform = torch.rand(n_tokens, len(popularity), generator=generator)
    gumbel = -torch.log(-torch.log(uniform.clamp_min(1e-12)))
    return (popularity.log() + gumbel).topk(top_k, dim=-1).indices


def expert_counts(experts_of: Int[Tensor, "tokens top_k"], n_experts: int) -> list[int]:
    """The (token, expert) assignments each expert gets."""
    return torch.bincount(experts_of.flatten(), minlength=n_experts).tolist()


def switch_aux_loss(scores: Float[Tensor, "tokens n_experts"],
                    experts_of: Int[Tensor, "tokens top_k"]) -> Tensor:
    """The Switch Transformer's load-balancing loss, E · sum_i f_i · P_i: f_i the share of the
    assignments that went to expert i, P_i the router's mean probability for it. It is 1 when
    both are even (1 / E each), and more when the router gives its busiest experts the most
    probability, as a router that favours some experts does; it is not smallest at even shares
    (a top-1 router with shares 0.6 and 0.4 can score 0.92). Only P_i carries a gradient
    (counting is not differentiable): E · f_i, largest for the busiest experts, so a step down
    the gradient lowers their probability most."""
    n_experts = scores.shape[-1]
    share = torch.bincount(experts_of.flatten(), minlength=n_experts) / experts_of.numel()
    return n_experts * (share * scores.mean(dim=0)).sum()


def balance_by_aux_loss(logits: Float[Tensor, "tokens n_experts"], top_k: int, steps: int,
                        step_size: float) -> tuple[list[float], list[float]]:
    """``steps`` steps of gradient descent on the Switch loss alone, for a router whose scores
    are softmax(logits + preference) and whose only learned part is the preference, one number
    per expert, starting at 0. Returns, per step before its update, the loss and the busiest
    expert's load over the even share."""
    n_tokens, n_experts = logits.shape
    preference = torch.zeros(n_experts, requires_grad=True)
    losses, busiest = [], []
    for _ in range(steps):
        scores = (logits + preference).softmax(dim=-1)
        chosen = scores.topk(top_k, dim=-1).indices
        loss = switch_aux_loss(scores, chosen)
        (gradient,) = torch.autograd.grad(loss, preference)
        with torch.no_grad():
            preference -= step_size * gradient
        losses.append(loss.item())
        busiest.append(max(expert_counts(chosen, n_experts)) * n_experts / (n_tokens * top_k))
    return losses, busiest


def biased_top_k(affinity: Float[Tensor, "tokens n_experts"], bias: Float[Tensor, " n_experts"],
                 top_k: int) -> Int[Tensor, "tokens top_k"]:
    """DeepSeek-V3's choice of experts: the top_k of affinity + bias. The bias moves only the
    choice (and so which affinities take part, and get a gradient); the weights of the chosen
    experts' outputs still come from the affinity alone, and no term is added to the loss."""
    return (affinity + bias).topk(top_k, dim=-1).indices


def update_bias(bias: Float[Tensor, " n_experts"], counts: list[int],
                step: float) -> Float[Tensor, " n_experts"]:
    """After a step, lower the bias of every expert that got more than the even share of the
    assignments by ``step`` and raise it for those that got fewer (DeepSeek-V3's update)."""
    load = torch.tensor(counts, dtype=bias.dtype)
    return bias - step * torch.sign(load - load.mean())


def simulate_bias_balancing(log_popularity: Float[Tensor, " n_experts"], top_k: int, steps: int,
                            batch: int, step_size: float, capacity_factor: float,
                            generator: torch.Generator) -> tuple[list[float], list[float]]:
    """``steps`` steps of DeepSeek-V3's balancing on a router whose affinities favour some
    experts: each token's affinity for expert i is sigmoid(z + log_popularity[i]), z standard
    normal; the top_k of affinity + bias are chosen, then the bias is updated. Returns, per step,
    the share of assignments dropped at ``capacity_factor`` (``dropped_tokens``) and the busiest
    expert's load over the even share."""
    n_experts = len(log_popularity)
    bias = torch.zeros(n_experts)
    even = batch * top_k / n_experts
    dropped, busiest = [], []
    for _ in range(steps):
        affinity = torch.sigmoid(torch.randn(batch, n_experts, generator=generator)
                                 + log_popularity)
        counts = expert_counts(biased_top_k(affinity, bias, top_k), n_experts)
        dropped.append(dropped_tokens(counts, capacity_factor) / (batch * top_k))
        busiest.append(max(counts) / even)
        bias = update_bias(bias, counts, step_size)
    return dropped, busiest
