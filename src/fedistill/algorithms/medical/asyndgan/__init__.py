"""AsynDGAN (Chang et al., CVPR 2020, "Synthetic Learning: Learn From Distributed Asynchronized
Discriminator GAN Without Sharing Medical Image Data"): FedIOD's segmentation baseline (its Tables 2-4).

A central label-conditioned generator G (pix2pix's ResNet generator) learns against K discriminators,
one per site (pix2pix's conditional 70 x 70 PatchGAN D_k, trained on that site's (mask, image) pairs);
a segmentation net S then learns from G's synthetic pairs only.

Protocol (the ledger shows exactly this):

0. `query.masks`, once: every site uploads the label masks of its training samples (kind `label-masks`,
   as in the paper; FedIOD's upload, algorithms/shared/mask_upload.py) and its sample count n_k. The masks are
   S's per-pixel classes (instance segmentation: background, inside, contour), so G is conditioned on
   exactly what S learns to predict.
1. Each G-step (`iters_per_epoch` of them per round): the server draws a batch of uploaded masks, a share
   pi_k = n_k / n of it from site k's (FedIOD's draws.py), generates G(m) and sends each site only its own
   samples, their masks and where each mask sits in its upload (`query.adversarial`). The site takes one
   D-step on real pairs (m, x_real of m) against (m, G(m)), then returns the gradient with respect to
   G(m) of its G terms on the updated D_k, GAN + w_l1 * L1(G(m), x_real of m) (pix2pix's objective; the
   L1 needs the real image paired with m, which only its site holds), and its losses. The server weighs
   site k's gradient (of its mean terms over its samples) by pi_k and steps G: G descends
   sum_k pi_k E_k[...], however the batch's rounding split the samples (the released code: the sum over
   sites of one sample each, `site_shares = "uniform"`, pi_k = 1 / K).
2. After each round's G-steps (from round `segmenter_start`), S takes `segmenter_steps` steps at the
   server on fresh pairs (G(m), m) with the task's loss, as a site's local model trains. The paper trains
   S once on a synthetic set after G; training it every round instead lets the sites' validation splits
   select S round by round (`evaluate.segmenter`: S's parameters down, the headline up) and lets the run
   checkpoint and resume S with G. `segmenter_start = rounds` trains S only on the final G, as the paper.

No parameter leaves a site: up go the masks (once), metrics and input-gradients.

Differences from the released code, for reproducibility and CPUs: G's dropout draws its masks from a
stream seeded per step (pix2pix: torch's global one); G runs on the whole batch at once (the code: once
per site, so its batch norm sees one site's sample); the code scales G's loss by 0.1 and D's by 0.05,
which Adam's steps ignore (up to its epsilon); no flips or crops of the pairs; the perceptual term the
code adds (`w_perceptual`) is off by default, as the paper's objective has none.
"""

from fedistill.algorithms.base import Algorithm, register
from fedistill.algorithms.medical.asyndgan.client import AsynDGANClient
from fedistill.algorithms.medical.asyndgan.options import AsynDGANOptions
from fedistill.algorithms.medical.asyndgan.server import AsynDGANServer

__all__ = ["AsynDGANClient", "AsynDGANOptions", "AsynDGANServer"]

register(
    Algorithm(
        "asyndgan",
        "AsynDGAN: a central mask-conditioned G against one discriminator per site, then S on G's pairs",
        AsynDGANClient,
        AsynDGANServer,
        AsynDGANOptions,
        tasks=("semantic-segmentation", "instance-segmentation"),
        unused_keys={
            "local_epochs": "its sites train only their discriminators, a step per G-step; S takes "
            "asyndgan.segmenter_steps steps a round at the server",
            "local_steps": "its sites train only their discriminators, a step per G-step; S takes "
            "asyndgan.segmenter_steps steps a round at the server",
            "fraction": "every site answers every G-step; none is sampled out",
        },
    )
)
