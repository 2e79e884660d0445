"""How close FedIOD's synthetic images come to each client's private images (the FedIOD paper's Figure 4),
against what a FedAvg server recovers from one client update by gradient inversion (DLG): the
measurements, per finished FedIOD run and client, with `fedistill.analysis.similarity`.

* **Synthetic set**: samples of the run's saved generator (``models/generator.safetensors``) drawn as
  its server draws transfer data: BatchNorm in train mode (batch statistics) over batches of the run's
  ``fediod.synthetic_batch_size``, the latents of the server's own per-G-step streams (run seed,
  "latent", step), normalised model inputs mapped back to [0, 1] with the dataset's mean/std. ``running``
  draws in eval mode instead (running statistics, as `GeneratorSource` does).
* **Private set of client k**: every training image it holds (its train shard and the validation shard
  it keeps locally), rebuilt from the run's config with `prepare_data` and checked against the saved
  partition's hash.
* **Feature network and reference**: LeNet-5 trained on the first half of the test split
  (`held_out_halves`); the held-out real reference is a seeded subset of the second half, as large as the
  synthetic set (FID depends on set size). Two baselines for reading the FIDs: the synthetic set's FID to
  the held-out set itself, and each client's label skew.
* **The contrast, DLG**: some of client k's private images, each held by a FedAvg client (with one other
  image of client k) that takes one SGD step of batch 1 in round 1 on ``lenet-fedmdcg-dlg`` (the variant
  where DLG succeeds), exactly the ``fedavg-1step`` threat model of `fedistill.analysis.threat_models`;
  the reconstructions get the same metrics against client k's private set, plus the PSNR against their
  true images. A FID of so few points is degenerate: it is reported and flagged, next to held-out real
  images at the same count.
"""

from __future__ import annotations

import argparse
import copy
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from fedistill.algorithms.fediod import FedIODOptions
from fedistill.algorithms.shared.distillation_data import load_generator
from fedistill.algorithms.shared.training import evaluate_model
from fedistill.analysis.inversion_scores import merge, score
from fedistill.analysis.inversion_scores import to_unit as model_input_to_unit
from fedistill.analysis.similarity import (
    FeatureNetwork,
    SimilarityReport,
    frechet_distance,
    held_out_halves,
    memorisation_share,
    nearest_neighbour,
    similarity_to_private,
    to_unit,
    train_feature_network,
)
from fedistill.analysis.threat_models import Setup, fedavg_setting
from fedistill.config import RunConfig, options_for, read_config
from fedistill.data.base import DatasetInfo, ImageSet
from fedistill.data.partition import load_split
from fedistill.engine.setup import Prepared, prepare_data
from fedistill.errors import UserError
from fedistill.models.generator import Generator, build_generator
from fedistill.reproduce.paths import CHECKOUT
from fedistill.reproduce.privacy_attacks import in_process
from fedistill.seeding import torch_generator

FEATURE_MODEL = "lenet5"


@dataclass
class FedIODRun:
    path: Path
    label: str
    config: RunConfig
    data: Prepared
    generator: Generator
    synthetic_batch_size: int

    @property
    def info(self) -> DatasetInfo:
        return self.data.dataset.info

    def private(self, k: int) -> ImageSet:
        """Every training image client k holds: its train shard and its local validation shard."""
        split = self.data.split
        index = np.concatenate([split.client_train[k], split.client_val[k]])
        return self.data.dataset.train.subset(index)


def run_directory(path: Path) -> Path:
    """The FedIOD algorithm directory: ``path`` itself, or ``path/fediod`` for a suite directory."""
    if not (path / "models" / "generator.safetensors").is_file() and (path / "fediod").is_dir():
        path = path / "fediod"
    for need in ("config.toml", "partition.json", "models/generator.safetensors"):
        if not (path / need).is_file():
            raise SystemExit(f"{path} is not a finished FedIOD run directory: {need} is missing")
    return path


def run_generator(path: Path, info: DatasetInfo) -> Generator:
    """The saved generator, rebuilt for the run's dataset so that ``G(z)`` is normalised as the server's."""
    saved = load_generator(path)
    size = saved.init_size * 2**saved.upsamples
    if (saved.channels, size) != (info.channels, info.image_size):
        raise SystemExit(
            f"{path} draws {saved.channels}x{size}x{size} images, "
            f"but the run's dataset {info.name} has {info.channels}x{info.image_size}x{info.image_size}"
        )
    generator = build_generator(
        info, latent_dim=saved.latent_dim, width=saved.width, upsamples=saved.upsamples
    )
    generator.load_state_dict(saved.state_dict())
    return generator.requires_grad_(False)


def load_run(path: Path, data_dir: str) -> FedIODRun:
    """Rebuild the run's data and partition from its config; refuse if they differ from the saved ones."""
    path = run_directory(path)
    config = read_config(path / "config.toml").replace(data_dir=data_dir)
    if config.algorithm != "fediod":
        raise SystemExit(f"{path}: algorithm is {config.algorithm!r}, not 'fediod'")
    if config.site_data_dir:
        raise SystemExit(
            f"{path}: its sites held their own records (site_data_dir); the study cuts each site's records "
            "from one copy of the dataset, so it runs on runs that split one"
        )
    try:
        data = prepare_data(config)
    except UserError as error:  # the data are elsewhere (a run of one's own): one line, not a traceback
        where = "check --data-dir (the folder the run read its data from)"
        raise SystemExit(f"{path}: {error}; {where}") from None
    saved = load_split(path).hash()
    if data.split.hash() != saved:
        raise SystemExit(
            f"{path}: the partition rebuilt from config.toml (hash {data.split.hash()[:12]}...) differs from "
            f"the saved one ({saved[:12]}...); check --data-dir and the dataset files"
        )
    options = options_for(config, "fediod", FedIODOptions)
    label = path.parent.name if path.name == "fediod" else path.name
    generator = run_generator(path / "models" / "generator.safetensors", data.dataset.info)
    return FedIODRun(path, label, config, data, generator, options.synthetic_batch_size)


@torch.no_grad()
def sample_synthetic(run: FedIODRun, n: int, bn: str) -> torch.Tensor:
    """``n`` generator samples in [0, 1], drawn as the server draws them (module docstring)."""
    generator = copy.deepcopy(run.generator).train(bn == "batch")  # train mode would move running stats
    b = run.synthetic_batch_size
    chunks = [
        generator(generator.sample_latent(b, torch_generator(run.config.seed, "latent", step)))
        for step in range(math.ceil(n / b))
    ]
    return model_input_to_unit(torch.cat(chunks)[:n], run.info)


@dataclass
class Reference:
    features: FeatureNetwork
    held_out: ImageSet  # the second half of the test split
    test_accuracy: float  # the feature network on that second half, which it never trained on

    def subset(self, n: int, seed: int) -> ImageSet:
        order = torch.randperm(len(self.held_out), generator=torch_generator(seed, "held-out-reference"))
        return self.held_out.subset(order[: min(n, len(self.held_out))])


def reference_for(test: ImageSet, info: DatasetInfo, epochs: int, seed: int) -> Reference:
    first, second = held_out_halves(test)
    features = train_feature_network(first, info, model=FEATURE_MODEL, epochs=epochs, seed=seed)
    return Reference(features, second, evaluate_model(features.model, second, info)["accuracy"])


def dlg_row(
    run: FedIODRun,
    private: ImageSet,
    held_out: ImageSet,
    features: FeatureNetwork,
    fediod: SimilarityReport,
    images: int,
    args: argparse.Namespace,
) -> dict[str, Any]:
    """The ``fedavg-1step`` threat model on ``images`` of this client's private images, then the
    reconstructions against its private set (thresholds: those of ``fediod``, the same reference)."""
    images = min(images, len(private) // 2)  # each FedAvg client holds two images and trains on one
    settings = argparse.Namespace(seed=args.seed, data_dir=args.data_dir, iterations=args.dlg_iterations)
    setup = Setup(run.config.dataset, run.info, private, run.data.dataset.test, "dlg", settings, in_process)
    start = time.perf_counter()
    entries = fedavg_setting(setup, 1, images, 0)[0][""]
    dlg = merge([e["scores"]["dlg"] for e in entries])
    idlg = merge([e["scores"]["idlg"] for e in entries])
    truth01 = model_input_to_unit(torch.cat([e["truth"] for e in entries]), run.info)
    mean01 = to_unit(run.data.dataset.train).mean(0, keepdim=True)  # uint8 / 255, or [0, 1] floats
    mean_image = [score(t[None], mean01)[0][0] for t in truth01]
    scored, idlg_scored = dlg.summary(), idlg.summary()  # an exact reconstruction: null, counted
    return {
        "images": images,
        "psnr": scored["psnr"],
        "psnr_mean": scored["psnr_mean"],
        **({"psnr_infinite": scored["psnr_infinite"]} if "psnr_infinite" in scored else {}),
        "mean_image_psnr_mean": float(np.mean(mean_image)),
        "idlg_psnr_mean": idlg_scored["psnr_mean"],
        **({"idlg_psnr_infinite": idlg_scored["psnr_infinite"]} if "psnr_infinite" in idlg_scored else {}),
        "label_accuracy": dlg.label_accuracy,
        "gradient_check_max": max(e["gradient_check"] for e in entries),
        "diverged": dlg.note,
        "similarity": reconstruction_similarity(dlg.reconstruction, private, held_out, features, fediod),
        "seconds": time.perf_counter() - start,
    }


def reconstruction_similarity(
    reconstructions: torch.Tensor,
    private: ImageSet,
    held_out: ImageSet,
    features: FeatureNetwork,
    fediod: SimilarityReport,
) -> dict[str, Any]:
    """`similarity_to_private`'s measures of a few reconstructions, reusing the memorisation thresholds of
    ``fediod`` (same private set, same held-out reference) instead of recomputing the held-out distances.
    Their FID is degenerate (a handful of points in 84 dimensions): ``fid_held_out_same_n`` is the same
    estimator on as many held-out real images, the only fair comparison."""
    rec, priv = to_unit(reconstructions), to_unit(private)
    f_rec, f_priv = features(rec), features(priv)
    n = len(rec)
    pixel, _ = nearest_neighbour(rec, priv)
    feature, _ = nearest_neighbour(f_rec, f_priv)
    fid_same_n = frechet_distance(features(held_out.subset(range(n))), f_priv) if n >= 2 else math.nan
    return {
        "reconstructions": n,
        "fid": frechet_distance(f_rec, f_priv) if n >= 2 else math.nan,
        "fid_held_out_same_n": fid_same_n,
        "fid_degenerate": True,
        "pixel_nn_mean": float(pixel.mean()),
        "pixel_nn_median": float(torch.quantile(pixel, 0.5)),
        "feature_nn_mean": float(feature.mean()),
        "feature_nn_median": float(torch.quantile(feature, 0.5)),
        "threshold_pixel": fediod.threshold_pixel,
        "threshold_feature": fediod.threshold_feature,
        "memorised_pixel": memorisation_share(pixel, fediod.threshold_pixel),
        "memorised_feature": memorisation_share(feature, fediod.threshold_feature),
    }


def measure_run(run: FedIODRun, reference: Reference, args: argparse.Namespace) -> dict[str, Any]:
    synthetic = sample_synthetic(run, args.synthetic, args.generator_bn)
    held_out = reference.subset(args.synthetic, args.seed)
    clients = parse_clients(args.clients, run.config.clients)
    rows = []
    for k in tqdm(clients, desc=run.label, unit="client", file=sys.stdout):
        private = run.private(k)
        fediod = similarity_to_private(synthetic, private, held_out, reference.features)
        row: dict[str, Any] = {
            "client": k,
            "private_images": len(private),
            "label_skew": label_skew(private, held_out, run.info.num_classes),
            "fediod": fediod.to_dict(),
        }
        if args.dlg_images > 0 and len(private) >= 2:
            row["dlg"] = dlg_row(run, private, held_out, reference.features, fediod, args.dlg_images, args)
        rows.append(row)
    return {
        "run": str(run.path.relative_to(CHECKOUT) if run.path.is_relative_to(CHECKOUT) else run.path),
        "label": run.label,
        "alpha": run.config.alpha,
        "clients": run.config.clients,
        "partition_hash": run.data.split.hash(),
        "generator": {
            "latent_dim": run.generator.latent_dim,
            "width": run.generator.width,
            "synthetic_batch_size": run.synthetic_batch_size,
            "batchnorm": args.generator_bn,
        },
        "synthetic": len(synthetic),
        "held_out": len(held_out),
        # how far the synthetic set is from real data no client holds: the baseline of its FIDs to private
        "fid_synthetic_to_held_out": frechet_distance(
            reference.features(synthetic), reference.features(held_out)
        ),
        "results": rows,
    }


def label_skew(private: ImageSet, held_out: ImageSet, classes: int) -> float:
    """Total-variation distance between the client's class distribution and the held-out set's: the
    non-IID part of a private set's distance from any balanced reference."""
    p, q = (torch.bincount(s.y, minlength=classes).double() / len(s) for s in (private, held_out))
    return float((p - q).abs().sum() / 2)


def parse_clients(text: str, total: int) -> list[int]:
    if text == "all":
        return list(range(total))
    clients = [int(c) for c in text.split(",") if c.strip()]
    bad = [c for c in clients if not 0 <= c < total]
    if bad:
        raise SystemExit(f"--clients {text}: the run has clients 0..{total - 1}, not {bad}")
    return clients
