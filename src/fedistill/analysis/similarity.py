"""How close synthetic images come to one client's private images (FedIOD's privacy appendix, Figure 4).

FedIOD argues that its synthetic transfer data do not copy private data by measuring the distance between
the synthetic images and each client's private images (FID; larger is more private). This module gives
that measurement, and two sharper ones, for any set of synthetic images against any private set:

* **FID on a small feature network.** `train_feature_network` trains a LeNet-5 (``lenet5``, ReLU,
  84-d penultimate layer) with this library's own training loop on held-out data: by default the *first
  half of the test split* (`held_out_halves`), which no client ever holds (clients are built from the
  training split) and which no model under evaluation is selected on. `frechet_distance` is the Fréchet
  distance between Gaussians fitted to the network's penultimate features (its ``extractor`` output),
  with the matrix square root from ``scipy.linalg.sqrtm``.

  **These FID values are not comparable to the FID numbers in the literature**, which use an
  ImageNet-trained Inception-v3 and its 2048-d pool features on thousands of samples. Here the features
  come from a small digit/clothing classifier, the dimension is 84, and the sets are often small (a
  client's shard, a few hundred synthetic samples), so the absolute values live on their own scale
  (and FID is biased upwards for small sets). Compare them only with each other, at equal set sizes,
  and above all with the reference computed the same way: held-out real images against the same
  private set.

* **Nearest-neighbour distances.** For every synthetic sample, the L2 distance to its nearest private
  sample, in pixel space (images in [0, 1], flattened) and in the feature network's space. The
  reference is the same quantity for held-out real samples (the *second* half of the test split by
  default): a synthetic set whose NN distances are far below those of unseen real data sits closer to
  the private set than fresh data from the same distribution would.

* **Memorisation check.** The share of synthetic samples closer to some private sample than the 5th
  percentile of the reference (held-out real → private) NN distances: an unseen real image is that
  close only 5% of the time, so a share well above 0.05 flags near-copies.

Images are ``(N, C, H, W)`` tensors, uint8 in [0, 255] or float in [0, 1] (denormalise model inputs
first), or `ImageSet`s.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np
import torch
from scipy import linalg
from torch import nn

from fedistill.data.base import DatasetInfo, ImageSet
from fedistill.data.transforms import normalize

__all__ = [
    "FeatureNetwork",
    "SimilarityReport",
    "frechet_distance",
    "gaussian_statistics",
    "held_out_halves",
    "memorisation_share",
    "memorisation_threshold",
    "nearest_neighbour",
    "similarity_to_private",
    "train_feature_network",
]

Images = torch.Tensor | ImageSet
Features = Callable[[torch.Tensor], torch.Tensor]  # images in [0, 1] -> (N, D) features


def to_unit(images: Images) -> torch.Tensor:
    """A float32 CPU tensor ``(N, C, H, W)`` in [0, 1]: uint8 is divided by 255, floats are checked (finite,
    in [0, 1])."""
    x = images.x if isinstance(images, ImageSet) else torch.as_tensor(images)
    x = x.detach().cpu()
    if x.dim() != 4:
        raise ValueError(f"images must have shape (N, C, H, W), got {tuple(x.shape)}")
    if x.dtype == torch.uint8:
        return x.float() / 255.0
    if not x.is_floating_point():
        raise ValueError(f"images must be uint8 or float in [0, 1], got dtype {x.dtype}")
    if not bool(torch.isfinite(x).all()):
        raise ValueError("float images hold NaN or infinite values")
    if x.numel() and (float(x.min()) < -1e-6 or float(x.max()) > 1 + 1e-6):
        raise ValueError(
            f"float images must lie in [0, 1] (got values in [{float(x.min()):.3g}, {float(x.max()):.3g}]); "
            "denormalise model inputs first"
        )
    return x.float()


# --- the feature network ----------------------------------------------------------------------------------


def held_out_halves(test: ImageSet) -> tuple[ImageSet, ImageSet]:
    """The test split cut in two: the first half trains the feature network, the second is the held-out
    real reference. Neither half is ever held by a client (clients are built from the training split)."""
    n = len(test)
    if n < 4:
        raise ValueError(f"the test split has {n} images; at least 4 are needed to cut it in halves")
    half = n // 2
    return test.subset(range(half)), test.subset(range(half, n))


class FeatureNetwork:
    """A trained classifier used as a feature map: images in [0, 1] → its penultimate features.

    ``model`` is a `Classifier` (``extractor`` then ``classifier``); the features are ``extractor``'s
    output on the normalised images, in eval mode, as float64. ``accuracy`` is its accuracy on the data
    it was trained on (a sanity check that the features mean something), or None.
    """

    def __init__(self, model: nn.Module, info: DatasetInfo, accuracy: float | None = None) -> None:
        if not hasattr(model, "extractor"):
            raise TypeError(f"the feature network must have an 'extractor', got {type(model).__name__}")
        self.model = model.eval()
        self.info = info
        self.accuracy = accuracy

    @torch.no_grad()
    def __call__(self, images: Images, batch_size: int = 512) -> torch.Tensor:
        x = to_unit(images)
        if x.shape[1:] != (self.info.channels, self.info.image_size, self.info.image_size):
            raise ValueError(
                f"images of shape {tuple(x.shape[1:])} do not fit the feature network for {self.info.name} "
                f"({self.info.channels}, {self.info.image_size}, {self.info.image_size})"
            )
        self.model.eval()
        out = [self.model.extractor(normalize(chunk, self.info)) for chunk in x.split(batch_size)]
        return torch.cat(out).flatten(1).to(torch.float64)


def train_feature_network(
    data: ImageSet,
    info: DatasetInfo,
    *,
    model: str = "lenet5",
    epochs: int = 3,
    batch_size: int = 64,
    lr: float = 0.05,
    seed: int = 0,
) -> FeatureNetwork:
    """Train ``model`` (a registry name; LeNet-5 by default) on ``data`` with the library's local-training
    loop (SGD, momentum 0.9, no augmentation), seeded by ``seed``. Pass held-out data, e.g. the first half
    of `held_out_halves`; never the private data being measured."""
    from fedistill.algorithms.shared.training import LocalTraining, evaluate_model, train_local
    from fedistill.models import build_model
    from fedistill.seeding import seeded, torch_generator

    if len(data) < 2:
        raise ValueError(f"the feature network needs at least 2 training images, got {len(data)}")
    if epochs < 1:
        raise ValueError(f"epochs must be >= 1, got {epochs}")
    net = seeded(seed, lambda: build_model(model, info), "feature-network", model)
    spec = LocalTraining(
        epochs=epochs,
        steps=0,
        batch_size=batch_size,
        optimizer="sgd",
        lr=lr,
        momentum=0.9,
        weight_decay=5e-4,
        augment=False,
    )
    train_local(net, data, info, spec, torch_generator(seed, "feature-network-batches"))
    accuracy = evaluate_model(net, data, info)["accuracy"]
    return FeatureNetwork(net, info, accuracy)


# --- Fréchet distance -------------------------------------------------------------------------------------


def gaussian_statistics(features: torch.Tensor | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean ``(D,)`` and sample covariance ``(D, D)`` of ``(N, D)`` features, in float64 (N >= 2)."""
    f = np.asarray(torch.as_tensor(features).detach().cpu().to(torch.float64))
    if f.ndim != 2 or f.shape[0] < 2:
        raise ValueError(f"features must have shape (N, D) with N >= 2, got {f.shape}")
    return f.mean(axis=0), np.atleast_2d(np.cov(f, rowvar=False))


def frechet_distance(
    a: torch.Tensor | np.ndarray,
    b: torch.Tensor | np.ndarray,
    *,
    eps: float = 1e-6,
    max_imaginary: float = 1e-3,
) -> float:
    """Fréchet distance between Gaussians fitted to two feature sets ``(N, D)`` and ``(M, D)``:

    ``|mu_a - mu_b|^2 + tr(S_a + S_b - 2 (S_a S_b)^(1/2))``.

    ``scipy.linalg.sqrtm`` may return a complex matrix from rounding, or a non-finite one when the
    product is singular (fewer samples than dimensions): in the latter case ``eps`` is added to both
    diagonals and the root recomputed (as pytorch-fid does). An imaginary part larger than
    ``max_imaginary`` (relative to the trace) means the root is not trustworthy and raises; a smaller one
    is rounding and is dropped. The result is clipped at 0.
    """
    mu_a, cov_a = gaussian_statistics(a)
    mu_b, cov_b = gaussian_statistics(b)
    if mu_a.shape != mu_b.shape:
        raise ValueError(f"feature dimensions differ: {mu_a.shape[0]} and {mu_b.shape[0]}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # sqrtm's "singular matrix" on rank-deficient input
        root = linalg.sqrtm(cov_a @ cov_b)
        if not np.isfinite(root).all():
            offset = eps * np.eye(cov_a.shape[0])
            root = linalg.sqrtm((cov_a + offset) @ (cov_b + offset))
    if np.iscomplexobj(root):
        scale = max(1.0, float(np.abs(np.trace(cov_a) + np.trace(cov_b))))
        if np.abs(root.imag).max() > max_imaginary * scale:
            raise ValueError(
                f"the covariance square root has an imaginary part of {np.abs(root.imag).max():.3g}; "
                "the feature sets are too small or degenerate for a Fréchet distance"
            )
        root = root.real
    diff = mu_a - mu_b
    value = float(diff @ diff + np.trace(cov_a) + np.trace(cov_b) - 2.0 * np.trace(root))
    return max(value, 0.0)


# --- nearest neighbours and memorisation ------------------------------------------------------------------


def nearest_neighbour(
    queries: torch.Tensor, references: torch.Tensor, *, chunk: int = 1024
) -> tuple[torch.Tensor, torch.Tensor]:
    """For each query row, the L2 distance to its nearest reference row and that row's index.

    ``queries`` ``(N, ...)`` and ``references`` ``(M, ...)`` are flattened to vectors; computed in
    float64, ``chunk`` queries at a time. Returns ``(distances (N,), indices (N,))``.
    """
    q = torch.as_tensor(queries).detach().cpu().flatten(1).to(torch.float64)
    r = torch.as_tensor(references).detach().cpu().flatten(1).to(torch.float64)
    if q.shape[0] == 0 or r.shape[0] == 0:
        raise ValueError(f"need at least one query and one reference, got {q.shape[0]} and {r.shape[0]}")
    if q.shape[1] != r.shape[1]:
        raise ValueError(f"queries have {q.shape[1]} dimensions, references {r.shape[1]}")
    distances, indices = [], []
    for part in q.split(chunk):
        d = torch.cdist(part, r, compute_mode="donot_use_mm_for_euclid_dist")
        best, index = d.min(dim=1)
        distances.append(best)
        indices.append(index)
    return torch.cat(distances), torch.cat(indices)


def memorisation_threshold(reference_distances: torch.Tensor, percentile: float = 5.0) -> float:
    """The ``percentile``-th percentile of the reference (held-out real → private) NN distances."""
    d = torch.as_tensor(reference_distances).detach().cpu().to(torch.float64).flatten()
    if d.numel() == 0:
        raise ValueError("no reference distances to take a percentile of")
    if not 0 <= percentile <= 100:
        raise ValueError(f"percentile must be in [0, 100], got {percentile}")
    return float(np.percentile(d.numpy(), percentile))


def memorisation_share(distances: torch.Tensor, threshold: float) -> float:
    """The share of samples whose NN distance is below ``threshold`` (strictly)."""
    d = torch.as_tensor(distances).detach().cpu().flatten()
    if d.numel() == 0:
        raise ValueError("no distances")
    return float((d < threshold).to(torch.float64).mean())


def _median(values: torch.Tensor) -> float:
    return float(torch.quantile(values.to(torch.float64), 0.5))


# --- the whole report -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SimilarityReport:
    """Synthetic → private against the reference held-out real → private, in both spaces.

    ``*_nn_*`` are the mean and median nearest-neighbour distances; ``memorised_*`` the share of synthetic
    samples below ``threshold_*`` (the reference distances' ``percentile``-th percentile). FIDs are on the
    feature network's penultimate features and are not Inception FIDs (see the module docstring); a FID is
    nan when a set has fewer than 2 samples.
    """

    synthetic: int
    private: int
    held_out: int
    fid_synthetic: float
    fid_held_out: float
    pixel_nn_mean_synthetic: float
    pixel_nn_median_synthetic: float
    pixel_nn_mean_held_out: float
    pixel_nn_median_held_out: float
    feature_nn_mean_synthetic: float
    feature_nn_median_synthetic: float
    feature_nn_mean_held_out: float
    feature_nn_median_held_out: float
    percentile: float
    threshold_pixel: float
    threshold_feature: float
    memorised_pixel: float
    memorised_feature: float
    memorised_pixel_held_out: float  # the reference's own share: about percentile / 100 by construction
    memorised_feature_held_out: float

    def to_dict(self) -> dict[str, float]:
        """The report's fields by name, for a JSON results file."""
        return asdict(self)


def similarity_to_private(
    synthetic: Images,
    private: Images,
    held_out: Images,
    features: Features,
    *,
    percentile: float = 5.0,
) -> SimilarityReport:
    """Compare ``synthetic`` with one client's ``private`` images, using ``held_out`` real images (never
    seen by that client, nor by the feature network) as the reference. ``features`` maps images in [0, 1]
    to ``(N, D)`` features (a `FeatureNetwork`)."""
    syn, priv, real = to_unit(synthetic), to_unit(private), to_unit(held_out)
    if not (syn.shape[1:] == priv.shape[1:] == real.shape[1:]):
        raise ValueError(
            f"image shapes differ: synthetic {tuple(syn.shape[1:])}, private {tuple(priv.shape[1:])}, "
            f"held-out {tuple(real.shape[1:])}"
        )
    f_syn, f_priv, f_real = (torch.as_tensor(features(x)).to(torch.float64) for x in (syn, priv, real))

    def fid(a: torch.Tensor) -> float:
        return frechet_distance(a, f_priv) if a.shape[0] >= 2 and f_priv.shape[0] >= 2 else math.nan

    pix_syn, _ = nearest_neighbour(syn, priv)
    pix_real, _ = nearest_neighbour(real, priv)
    feat_syn, _ = nearest_neighbour(f_syn, f_priv)
    feat_real, _ = nearest_neighbour(f_real, f_priv)
    t_pix = memorisation_threshold(pix_real, percentile)
    t_feat = memorisation_threshold(feat_real, percentile)
    return SimilarityReport(
        synthetic=syn.shape[0],
        private=priv.shape[0],
        held_out=real.shape[0],
        fid_synthetic=fid(f_syn),
        fid_held_out=fid(f_real),
        pixel_nn_mean_synthetic=float(pix_syn.mean()),
        pixel_nn_median_synthetic=_median(pix_syn),
        pixel_nn_mean_held_out=float(pix_real.mean()),
        pixel_nn_median_held_out=_median(pix_real),
        feature_nn_mean_synthetic=float(feat_syn.mean()),
        feature_nn_median_synthetic=_median(feat_syn),
        feature_nn_mean_held_out=float(feat_real.mean()),
        feature_nn_median_held_out=_median(feat_real),
        percentile=percentile,
        threshold_pixel=t_pix,
        threshold_feature=t_feat,
        memorised_pixel=memorisation_share(pix_syn, t_pix),
        memorised_feature=memorisation_share(feat_syn, t_feat),
        memorised_pixel_held_out=memorisation_share(pix_real, t_pix),
        memorised_feature_held_out=memorisation_share(feat_real, t_feat),
    )
