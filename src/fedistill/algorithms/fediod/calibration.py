"""Putting teachers of different architectures on one logit scale before they form an ensemble.

A ResNet-8's logits are 2-5 times larger than a LeNet's on the same inputs, so in a sum of logits the
larger-scaled teachers decide every sample, and in the heterogeneous Fashion-MNIST run the ensemble
called almost every early synthetic sample one class. `teacher_logits = "scaled"` divides each
teacher's logits by its mean per-sample standard deviation over the classes, taken over the batch and
held constant (detached): within a teacher, confident and unsure samples keep their relative scale;
across teachers, the scales match. `"raw"` (the paper) leaves the logits as the clients sent them. The
calibrated logits are also what the server's terms of G's loss read (the disagreement term L_unique and
the balance term, which the paper's Eqs. 4-5 take on the teachers' own outputs); each site's L_conf stays
on its raw logits.

`"centred"` subtracts from each teacher's logit for each class its mean over the batch (held constant):
a teacher then votes for a class only as far as a sample scores above that batch's average. It is meant
for sites that saw a single class: such a teacher gives its class a high logit on any input, and with
class-share or Eq. 8 weights (normalised over the sites per class) it alone decides that class, so the
ensemble calls most synthetic samples that class; centred, its vote is about 0 everywhere, and the class
wins only where every other class's experts score the sample below their average.

`"log-probabilities"` replaces each teacher's logits by its log-softmax: a shift per teacher and sample
that leaves the teacher's own softmax (at any temperature) unchanged, so every loss on one teacher's
predictions stays the same, while the ensemble's weighted sum becomes a weighted product of the teachers'
probabilities. A teacher's raw logits carry an offset of its own per sample, which the weighted sum adds
in. On Fashion-MNIST (K = 10, Dirichlet 0.1, seed 0) the class-share ensemble of the same ten teachers
scores 83.60% on log-probabilities against 80.75% on raw logits, but the student does not follow:
75.45% against 76.93% after 240 G-steps
(benchmarks/results/sweeps/fediod_time_to_quality_fashion-mnist-alpha0.1_logp.md); at tau = 1 over 720
G-steps 78.54% against 78.88% for raw logits at tau = 3 (`..._logp-tau1-e24.md` there, and
benchmarks/results/fediod_vs_fedavg_long_fashion-mnist-alpha0.1.md). On the digits
demo's federation (seeds 3-8) it lost 0.37 points, 2 seeds up and 4 down
(benchmarks/results/sweeps/fediod_demo_variants_logp.md). So no preset uses it.

`"auto"` picks between `"centred"` and `"raw"` from the label counts the sites send in stage 1:
`"centred"` when at least one site saw a single class (the case centring is for), else `"raw"`:
centring helps where a one-class site would otherwise decide its class, and costs accuracy everywhere
else (docs/results/tuning-history.md). Per-pixel tasks always stay raw.
"""

from __future__ import annotations

import torch

TEACHER_LOGITS = ("raw", "scaled", "centred", "log-probabilities", "auto")


def one_class_sites(counts: torch.Tensor) -> int:
    """How many sites' training labels (`counts`: (K, C)) fall in a single class."""
    return int(((counts > 0).sum(-1) == 1).sum())


def auto_mode(counts: torch.Tensor) -> str:
    """`"centred"` if any site saw a single class, else `"raw"`."""
    return "centred" if one_class_sites(counts) > 0 else "raw"


def calibrated(logits: torch.Tensor, mode: str) -> torch.Tensor:
    """`logits` (K, B, C), rescaled per teacher (`"scaled"`), centred per teacher and class over the batch
    (`"centred"`), as log-probabilities (`"log-probabilities"`), or unchanged (`"raw"`)."""
    if mode == "raw":
        return logits
    if mode == "auto":
        raise ValueError("teacher_logits 'auto' is resolved from the sites' label counts before use")
    if mode == "centred":
        return logits - logits.detach().mean(dim=1, keepdim=True)
    if mode == "log-probabilities":
        return torch.log_softmax(logits, dim=-1)
    if mode != "scaled":
        raise ValueError(f"unknown teacher_logits mode {mode!r} (valid: {', '.join(TEACHER_LOGITS)})")
    scale = logits.detach().std(dim=-1, unbiased=False).mean(dim=-1).clamp_min(1e-6)  # (K,)
    return logits / scale[:, None, None]
