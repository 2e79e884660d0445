"""Look trials (`look_trials`): whether a site's colour map should have its contrast the other way round.

With `site_looks` each site's share of G's batch comes out through that site's colour map, learnt from
the identity by gradient. A fluorescence site (bright nuclei on a dark ground) starts from the H&E-like
rendering the other sites pull G's net towards (dark nuclei on a light ground); its D_k darkens the
ground, but turning the nuclei from darker to brighter than the ground means passing through images
with no visible nuclei at all, which D_k rejects, so the map can stop at dark nuclei on a dark ground,
and the student learns nuclei that the site's real images do not have.

A trial compares the two directions outright, judged by the site's own teacher: in the first
`look_trials` G-steps of each epoch every other sample of each site's share is shown with its contrast
flipped about the share's mean colour (2c - x, per channel), and the server, which knows the mask each
image was drawn from and receives the site's teacher's outputs on it anyway, measures how well that
teacher finds the mask's foreground in each half (Dice). A teacher trained on the site's real images
finds the nuclei where the look is right. At the trial's end a site whose flipped half scored the higher
Dice gets its colour map flipped for good: the flip is affine, so it folds exactly into the map
(A -> -A, b -> 2c - b), and Adam's running mean of the map's gradient changes sign with it. The flipped
samples teach G nothing (their gradient is dropped). Nothing new crosses the wire.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch

from fedistill.algorithms.fediod.draws import Draw
from fedistill.algorithms.fediod.owner_split import OwnerSplit
from fedistill.federation.messages import Message
from fedistill.models.pix2pix import LOOK_STEP

log = logging.getLogger(__name__)

#: The two halves of a site's share in a trial step.
HALVES = ("drawn", "flipped")


@dataclass
class LookTrials:
    """The trial of `steps` G-steps at the start of each epoch of `iters` G-steps: per site and half, the
    foreground overlap of the site's teacher with G's masks (intersection, predicted, true pixel counts),
    and each share's mean colour (normalised) for the fold."""

    steps: int
    iters: int
    margin: float = 0.0  # how much higher the flipped half's Dice must be
    counts: dict[tuple[int, str], torch.Tensor] = field(default_factory=dict)
    colours: dict[int, torch.Tensor] = field(default_factory=dict)

    def in_trial(self, step: int) -> bool:
        """Whether G-step `step` (counted over the run) is one of its epoch's trial steps."""
        return step % self.iters < self.steps

    def ends(self, step: int) -> bool:
        """Whether G-step `step` is its epoch's last trial step, after which the trial decides."""
        return step % self.iters == min(self.steps, self.iters) - 1

    def flip(self, x: torch.Tensor, owner: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`x` (normalised images) with every other sample of each site's share flipped about the share's
        mean colour, detached (they teach G nothing); and which samples were flipped (B,) on CPU."""
        out, owner = x.clone(), owner.cpu()
        flipped = torch.zeros(len(owner), dtype=torch.bool)
        for site in owner.unique().tolist():
            share = torch.nonzero(owner == site).flatten()
            colour = x[share.to(x.device)].detach().mean(dim=(0, 2, 3), keepdim=True)
            self.colours[site] = colour.flatten()
            turned = share[1::2]
            flipped[turned] = True
            out[turned.to(x.device)] = (2 * colour - x[turned.to(x.device)]).detach()
        return out, flipped

    def record(self, site: int, predicted: torch.Tensor, masks: torch.Tensor, flipped: torch.Tensor) -> None:
        """A site's teacher's predicted classes (n, H, W) on n of its own samples, the masks they were drawn
        from, and which of them were flipped: the foreground counts of each half."""
        for half, rows in zip(HALVES, (~flipped, flipped), strict=True):
            if not bool(rows.any()):
                continue
            found, truth = predicted[rows] > 0, masks[rows] > 0
            counts = torch.stack([(found & truth).sum(), found.sum(), truth.sum()]).cpu().double()
            key = (site, half)
            self.counts[key] = self.counts.get(key, torch.zeros(3, dtype=torch.float64)) + counts

    def record_replies(
        self,
        replies: Mapping[int, Message],
        position: Mapping[int, int],
        draw: Draw,
        flipped: torch.Tensor,
        received_logits: Callable[[torch.Tensor], torch.Tensor],
        split: OwnerSplit | None,
    ) -> None:
        """`record` for each answering site, from the logits it sent on the samples it was asked about
        (all of them, or with owner queries its own); `position`: each site's number in G's draws."""
        assert draw.owner is not None and draw.masks is not None
        owner, masks = draw.owner.cpu(), draw.masks.cpu()
        for cid, reply in replies.items():
            asked = split.rows[cid] if split is not None else torch.arange(len(owner))
            mine = asked[owner[asked] == position[cid]]
            logits = reply.tensor("logits", "z")
            at = torch.searchsorted(asked, mine).to(logits.device)  # their places in the reply
            found = received_logits(logits[at]).argmax(1).cpu()
            self.record(position[cid], found, masks[mine], flipped[mine])

    def dice(self, site: int, half: str) -> float | None:
        counts = self.counts.get((site, half))
        if counts is None or float(counts[1] + counts[2]) == 0:
            return None
        return float(2 * counts[0] / (counts[1] + counts[2]))

    def decide(self, generator: torch.nn.Module, optimizer: torch.optim.Optimizer) -> list[int]:
        """Flip the colour map of each site whose teacher found the masks better in the flipped half (by more
        than `margin`); the sites flipped (their positions). The records start afresh for the next trial."""
        turned = []
        for site in sorted({site for site, _ in self.counts}):
            drawn, flipped = self.dice(site, "drawn"), self.dice(site, "flipped")
            if drawn is None or flipped is None:
                continue
            log.info("look trial: site %d's teacher Dice %.3f as drawn, %.3f flipped", site, drawn, flipped)
            if flipped > drawn + self.margin:
                fold_flip(generator, optimizer, site, self.colours[site])
                turned.append(site)
                log.info("look trial: site %d's colours flipped", site)
        self.counts, self.colours = {}, {}
        return turned


def fold_flip(generator: torch.nn.Module, optimizer: torch.optim.Optimizer, look: int,
              colour: torch.Tensor) -> None:  # fmt: skip
    """Make look `look`'s colour map x -> A x + s b its flip about `colour` (normalised units, per channel):
    2c - (A x + s b) in [0, 1] units, i.e. A' = -A, b' = (2c - s b) / s, with A = I + s M. Adam's first
    moments of the look's rows change sign, as the parameters now enter with the opposite sign."""
    matrix, bias = generator.look_matrix, generator.look_bias
    c01 = colour.to(bias) * generator.std.flatten() + generator.mean.flatten()  # the mean colour in [0, 1]
    eye = torch.eye(matrix.shape[-1], device=matrix.device, dtype=matrix.dtype)
    with torch.no_grad():
        matrix[look] = -2 * eye / LOOK_STEP - matrix[look]
        bias[look] = 2 * c01 / LOOK_STEP - bias[look]
    for parameter in (matrix, bias):
        moment = optimizer.state.get(parameter, {}).get("exp_avg")
        if moment is not None:
            moment[look].neg_()
