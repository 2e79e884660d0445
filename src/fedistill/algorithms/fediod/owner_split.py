"""Asking each site only about the samples G drew for it (`fediod.owner_queries`).

With the per-client G every sample of a batch is drawn for one site, its owner (draws.py), and under owner
labels only that site's teacher labels it. The server then sends each site its own rows of the batch and
puts the answers back in place: the teachers' rows stacked (K, rows, C) with zeros where a teacher was
not asked, which the owner weights never read, and a mask of the samples whose owner answered, the only
ones the step learns from.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class OwnerSplit:
    """Which rows of a G-step's batch each asked site owns."""

    rows: dict[int, torch.Tensor]  # client id -> positions of its samples in the batch (CPU int64)
    batch: int

    @classmethod
    def of(cls, owner: torch.Tensor, clients: list[int], position: Mapping[int, int]) -> OwnerSplit:
        """The split of a draw whose `owner` holds each sample's site position (G's numbering); a site
        that owns no sample of this batch is not asked."""
        owner = owner.cpu()
        rows = {cid: torch.nonzero(owner == position[cid]).flatten() for cid in clients}
        return cls({cid: r for cid, r in rows.items() if len(r)}, len(owner))

    @property
    def asked(self) -> list[int]:
        """The sites this step asks, in id order."""
        return sorted(self.rows)

    def arrays_for(
        self, cid: int, arrays: Mapping[str, Mapping[str, torch.Tensor]]
    ) -> dict[str, dict[str, torch.Tensor]]:
        """Site `cid`'s rows of per-sample arrays (kind -> name -> (B, ...))."""
        mine = self.rows[cid]
        return {
            kind: {name: t[mine.to(t.device)] for name, t in named.items()} for kind, named in arrays.items()
        }

    def answered(self, answered: list[int]) -> torch.Tensor:
        """(B,) True where the sample's owner answered."""
        kept = torch.zeros(self.batch, dtype=torch.bool)
        for cid in answered:
            kept[self.rows[cid]] = True
        return kept

    def stacked_rows(
        self,
        parts: Mapping[int, torch.Tensor],
        answered: list[int],
        to_rows: Callable[[torch.Tensor], torch.Tensor],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The answered sites' outputs (each site's own samples) as teacher rows (K, B·P, C), zeros where a
        teacher was not asked, with the gradient back to each part; and (K, B·P) True on each teacher's own
        rows. `to_rows` turns one site's outputs (1, n, ...) into its rows (1, n·P, C), P rows a sample."""
        own_rows = [to_rows(parts[cid][None])[0] for cid in answered]
        per_sample = own_rows[0].shape[0] // len(self.rows[answered[0]])
        full = own_rows[0].new_zeros((len(answered), self.batch * per_sample, own_rows[0].shape[-1]))
        mine = torch.zeros((len(answered), self.batch * per_sample), dtype=torch.bool)
        for i, (cid, rows) in enumerate(zip(answered, own_rows, strict=True)):
            at = self.sample_rows(self.rows[cid], per_sample)
            full[i, at.to(full.device)] = rows
            mine[i, at] = True
        return full, mine.to(full.device)

    @staticmethod
    def sample_rows(samples: torch.Tensor, per_sample: int) -> torch.Tensor:
        """The rows of `samples` when each sample is `per_sample` consecutive rows (its pixels)."""
        return (samples[:, None] * per_sample + torch.arange(per_sample)).reshape(-1)

    def scatter(self, total: torch.Tensor, cid: int, values: torch.Tensor) -> None:
        """Add site `cid`'s per-sample `values` (n, ...) to its rows of `total` (B, ...)."""
        total[self.rows[cid].to(total.device)] += values
