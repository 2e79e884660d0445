"""Label statistics of the federation and the weighted average of states (FedMD-CG, used by FedGen and FedCG).

The clients upload label counts; the server draws labels from them, trusts each client on a class in
proportion to its share of that class, and initialises its pair by the sample-weighted average.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch


def _counts(label_counts: torch.Tensor) -> torch.Tensor:
    counts = torch.as_tensor(label_counts, dtype=torch.float64)
    if counts.dim() not in (1, 2):
        raise ValueError(f"label counts must have shape (C,) or (K, C), got {tuple(counts.shape)}")
    if not bool((torch.isfinite(counts) & (counts >= 0)).all()):
        raise ValueError("label counts must be finite and non-negative (not NaN)")
    return counts


def label_distribution(label_counts: torch.Tensor) -> torch.Tensor:
    """Global label distribution p(c) = Σ_i cnt_{i,c} / Σ_{i,c'} cnt_{i,c'} from (C,) or (K, C) counts."""
    counts = _counts(label_counts)
    per_class = counts.sum(dim=0) if counts.dim() == 2 else counts
    total = per_class.sum()
    if not total > 0:
        raise ValueError("label counts are all zero: there is no label distribution to sample from")
    return (per_class / total).float()


def sample_labels(
    label_counts: torch.Tensor, batch_size: int, generator: torch.Generator | None = None
) -> torch.Tensor:
    """``batch_size`` labels (int64) drawn with replacement ∝ the global label counts.

    Used for ŷ in Eq. 3 and for y in every server step (Eq. 10-12).
    """
    probs = label_distribution(label_counts)
    draws = torch.multinomial(probs.cpu(), batch_size, replacement=True, generator=generator)  # CPU stream
    return draws.to(probs.device)


def label_weights(label_counts: torch.Tensor) -> torch.Tensor:
    """(K, C) per-class client weights w_{i,c} = cnt_{i,c} / Σ_j cnt_{j,c} (server, Eq. 10-11).

    A client is trusted on a class in proportion to how many of its samples it holds. A class no
    client holds gets weight 0 everywhere (the code would divide by zero; such labels are never drawn).
    """
    counts = _counts(label_counts)
    if counts.dim() != 2:
        raise ValueError(f"label counts for client weights must have shape (K, C), got {tuple(counts.shape)}")
    total = counts.sum(dim=0, keepdim=True)
    safe = torch.where(total > 0, total, torch.ones_like(total))
    return (counts / safe).float()


def per_sample_label_weights(weights: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """(K, B) weights w_{i,y_b} for a batch of labels, from (K, C) :func:`label_weights`."""
    return weights[:, labels]


def weighted_average(
    states: Sequence[Mapping[str, torch.Tensor]], weights: Sequence[float] | torch.Tensor
) -> dict[str, torch.Tensor]:
    """Σ_i w_i·state_i / Σ_i w_i per entry: the FedAvg initialisation of (G_g, C_g).

    The code weighs by each client's number of local training samples n_i. The states must hold the
    same entries (in any order) with the same shapes; the result has state 0's order. Integer buffers
    (BatchNorm's ``num_batches_tracked``) are averaged and truncated back to their dtype, as the code
    does.
    """
    w = torch.as_tensor(weights, dtype=torch.float64).flatten()
    if len(states) == 0 or w.numel() != len(states):
        raise ValueError(
            f"need one weight per state and at least one state, got {len(states)} and {w.numel()}"
        )
    if not bool((torch.isfinite(w) & (w >= 0)).all()) or not w.sum() > 0:
        raise ValueError(
            f"averaging weights must be finite and non-negative with a positive sum, got {w.tolist()}"
        )
    keys = list(states[0])
    for i, state in enumerate(states[1:], start=1):
        if set(state) != set(keys):
            raise ValueError(
                f"state {i} has different entries from state 0: {sorted(set(state) ^ set(keys))}"
            )
        for key in keys:
            if state[key].shape != states[0][key].shape:
                raise ValueError(
                    f"entry {key!r} has shape {tuple(state[key].shape)} in state {i} but "
                    f"{tuple(states[0][key].shape)} in state 0"
                )
    w = w / w.sum()
    out: dict[str, torch.Tensor] = {}
    for key in keys:
        ref = states[0][key]
        acc = sum(wi * s[key].detach().to(torch.float64) for wi, s in zip(w.tolist(), states, strict=True))
        out[key] = acc.to(ref.dtype) if ref.is_floating_point() else acc.trunc().to(ref.dtype)
    return out
