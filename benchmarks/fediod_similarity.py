"""How close FedIOD's synthetic images come to each client's private images (the FedIOD paper's Figure 4),
against what a FedAvg server recovers from one client update by gradient inversion (DLG).

FedIOD's server never sees a parameter or a parameter-gradient; what it ends up holding is its generator
and the synthetic transfer data drawn from it. The paper argues those data are no copy of private data by
the FID between the synthetic images and each client's private images (larger = more private). For a
finished FedIOD run this script measures, per client, with `fedistill.metrics.similarity`:

* **Synthetic set**: ``--synthetic`` samples of the run's saved generator (``models/generator.safetensors``)
  drawn as its server draws transfer data: BatchNorm in train mode (batch statistics) over batches of
  the run's ``fediod.synthetic_batch_size``, the latents of the server's own per-G-step streams
  (run seed, "latent", step), normalised model inputs mapped back to [0, 1] with the dataset's mean/std.
  ``--generator-bn running`` draws in eval mode instead (running statistics, as `GeneratorSource` does).
* **Private set of client k**: every training image it holds (its train shard and the validation shard
  it keeps locally), rebuilt from the run's config with `prepare_data` and checked against the saved
  partition's hash.
* **Feature network and reference**: LeNet-5 trained on the first half of the test split
  (`held_out_halves`); the held-out real reference is a seeded subset of the second half, as large as the
  synthetic set (FID depends on set size). Metrics: FID on its 84-d features, nearest-neighbour distances
  in pixel and feature space, and the memorisation share (closer than the reference's 5th percentile).
  Two baselines for reading the FIDs: the synthetic set's FID to the held-out set itself (how far G's
  samples are from real data that no client holds), and each client's label skew (total-variation
  distance of its class distribution from the held-out set's; a non-IID shard is far from any balanced
  reference, which moves the held-out FID from client to client).
* **The contrast, DLG**: ``--dlg-images`` of client k's private images, each held by a FedAvg client (with
  one other image of client k) that takes one SGD step of batch 1 in round 1 on ``lenet-fedmdcg-dlg``
  (Sigmoid, no max-pool, no normalisation: the variant where DLG succeeds), exactly the ``fedavg-1step``
  setting of ``benchmarks/privacy_attacks.py``, whose code runs it; the server inverts each update with DLG
  (``--dlg-iterations`` L-BFGS steps). The reconstructions get the same metrics against client k's
  private set, plus the PSNR against their true images (reference: the training split's mean image).
  A FID of so few points is degenerate: it is reported and flagged, next to held-out real images at the
  same count, and the row is read on NN distances, memorisation share and PSNR.

    python benchmarks/fediod_similarity.py [--run benchmarks/runs/fediod-fashion-mnist-alpha1-seed0/fediod] \
        [--synthetic 2000] [--clients all] [--dlg-images 8] [--dlg-iterations 100] [--feature-epochs 3] \
        [--seed 0] [--threads 1]

Writes benchmarks/results/fediod_similarity_<dataset>.{md,json,png}; several runs of one dataset share the
files (one section and one row of plots per run).
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import math
import os
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import torch
from scipy.stats import spearmanr
from tqdm import tqdm

from fedistill.algorithms.distillation_data import load_generator
from fedistill.algorithms.fediod import FedIODOptions
from fedistill.algorithms.training import evaluate_model
from fedistill.data.base import DatasetInfo, ImageSet
from fedistill.data.partition import load_split
from fedistill.experiment.config import RunConfig, options_for, read_config
from fedistill.experiment.runner import Prepared, prepare_data
from fedistill.metrics.similarity import (
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
from fedistill.models.generator import Generator, build_generator
from fedistill.seeding import torch_generator

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
DEFAULT_RUN = HERE / "runs" / "fediod-fashion-mnist-alpha1-seed0" / "fediod"
FEATURE_MODEL = "lenet5"


def privacy_attacks() -> ModuleType:
    """benchmarks/privacy_attacks.py as a module (benchmarks/ is no package): its FedAvg DLG setting."""
    module = sys.modules.get("privacy_attacks")
    if module is None:
        spec = importlib.util.spec_from_file_location("privacy_attacks", HERE / "privacy_attacks.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules["privacy_attacks"] = module  # its dataclasses resolve their module by name
        spec.loader.exec_module(module)
    module.register_variants()
    return module


# --- the run: data, partition, private sets, generator ----------------------------------------------------


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
    data = prepare_data(config)
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
    bench = privacy_attacks()
    generator = copy.deepcopy(run.generator).train(bn == "batch")  # train mode would move running stats
    b = run.synthetic_batch_size
    chunks = [
        generator(generator.sample_latent(b, torch_generator(run.config.seed, "latent", step)))
        for step in range(math.ceil(n / b))
    ]
    return bench.to_unit(torch.cat(chunks)[:n], run.info)


# --- the feature network and the held-out reference -------------------------------------------------------


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


# --- the DLG contrast ------------------------------------------------------------------------------------


def dlg_row(
    run: FedIODRun,
    private: ImageSet,
    held_out: ImageSet,
    features: FeatureNetwork,
    fediod: SimilarityReport,
    images: int,
    args: argparse.Namespace,
) -> dict[str, Any]:
    """privacy_attacks.py's ``fedavg-1step`` on ``images`` of this client's private images, then the
    reconstructions against its private set (thresholds: those of ``fediod``, the same reference)."""
    bench = privacy_attacks()
    images = min(images, len(private) // 2)  # each FedAvg client holds two images and trains on one
    settings = argparse.Namespace(seed=args.seed, data_dir=args.data_dir, iterations=args.dlg_iterations)
    setup = bench.Setup(run.config.dataset, run.info, private, run.data.dataset.test, "dlg", settings)
    start = time.perf_counter()
    entries = bench.fedavg_setting(setup, 1, images, 0)[0][""]
    dlg = bench.merge([e["scores"]["dlg"] for e in entries])
    idlg = bench.merge([e["scores"]["idlg"] for e in entries])
    truth01 = bench.to_unit(torch.cat([e["truth"] for e in entries]), run.info)
    mean01 = (run.data.dataset.train.x.float() / 255.0).mean(0, keepdim=True)
    mean_image = [bench.score(t[None], mean01)[0][0] for t in truth01]
    return {
        "images": images,
        "psnr": dlg.psnr,
        "psnr_mean": float(np.mean(dlg.psnr)),
        "mean_image_psnr_mean": float(np.mean(mean_image)),
        "idlg_psnr_mean": float(np.mean(idlg.psnr)) if idlg.psnr else None,
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


# --- one run ---------------------------------------------------------------------------------------------


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
        "run": str(run.path.relative_to(HERE.parent) if run.path.is_relative_to(HERE.parent) else run.path),
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


# --- the report ------------------------------------------------------------------------------------------


def _span(values: list[float]) -> str:
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return "undefined"
    return f"{min(finite):.3g} to {max(finite):.3g} (mean {np.mean(finite):.3g})"


def reading(entry: dict[str, Any]) -> list[str]:
    """A few sentences generated from the measured numbers of one run."""
    fed = [r["fediod"] for r in entry["results"]]
    lines = _fid_reading(entry, fed) + _distance_reading(entry, fed)
    dlg = [r["dlg"] for r in entry["results"] if "dlg" in r]
    return lines + (_dlg_reading(dlg, fed) if dlg else [])


def _fid_reading(entry: dict[str, Any], fed: list[dict[str, Any]]) -> list[str]:
    rows = entry["results"]
    fid_s, fid_h = [f["fid_synthetic"] for f in fed], [f["fid_held_out"] for f in fed]
    above = sum(s > h for s, h in zip(fid_s, fid_h, strict=True))
    lines = [
        f"* FID to the private set: FedIOD synthetic {_span(fid_s)}, held-out real {_span(fid_h)}; the "
        f"synthetic set is farther than unseen real data for {above} of {len(rows)} clients"
        + (" (the paper's direction, on this small-network scale)." if above == len(rows) else ".")
    ]
    baseline = entry["fid_synthetic_to_held_out"]
    ratio = np.mean(fid_s) / baseline
    lines.append(
        f"* The same synthetic set against held-out real data that no client holds: FID {baseline:.3g}; "
        f"against the private sets it is {ratio:.2f}x that on average, "
        + (
            "so the synthetic data are no closer to a client's data than to real data in general: the "
            "distance is a property of the generator's samples, not of any client."
            if ratio >= 0.8
            else "so the synthetic data sit markedly closer to the clients' data than to real data in general."
        )
    )
    if len(rows) >= 3:
        skew = [r["label_skew"] for r in rows]
        rho = float(spearmanr(skew, fid_h).statistic)
        lines.append(
            f"* The held-out reference's FID varies with the client's label skew (total-variation distance "
            f"of its class distribution from the held-out set's, {_span(skew)}; Spearman rho {rho:.2f} with "
            "FID held-out): private sets are non-IID, the reference is balanced, so compare each client's "
            "two bars, not clients with each other."
        )
    return lines


def _distance_reading(entry: dict[str, Any], fed: list[dict[str, Any]]) -> list[str]:
    pix_s = [f["pixel_nn_mean_synthetic"] for f in fed]
    pix_h = [f["pixel_nn_mean_held_out"] for f in fed]
    ratio = np.mean(pix_s) / np.mean(pix_h)
    mem_p, mem_f = [f["memorised_pixel"] for f in fed], [f["memorised_feature"] for f in fed]
    pairs = zip(entry["results"], mem_p, mem_f, strict=True)
    over = [r["client"] for r, p, f in pairs if max(p, f) > 0.05]
    return [
        f"* Pixel distance from a sample to the client's nearest private image: synthetic {_span(pix_s)}, "
        f"held-out real {_span(pix_h)}: synthetic samples sit {ratio:.2f}x as far as fresh real images "
        + ("(closer than fresh data)." if ratio < 1 else "(no closer than fresh data)."),
        f"* Memorisation share (closer than the held-out reference's 5th percentile; 0.05 for unseen real "
        f"data by construction): pixel {_span(mem_p)}, feature {_span(mem_f)}; "
        + (
            "no client has more near-copies among the synthetic samples than fresh real data would give."
            if not over
            else f"above 0.05 for client(s) {', '.join(map(str, over))}: inspect their nearest neighbours."
        ),
    ]


def _dlg_reading(dlg: list[dict[str, Any]], fed: list[dict[str, Any]]) -> list[str]:
    psnr, ref = np.mean([d["psnr_mean"] for d in dlg]), np.mean([d["mean_image_psnr_mean"] for d in dlg])
    sim = [d["similarity"] for d in dlg]
    d_pix, d_mem = np.mean([s["pixel_nn_mean"] for s in sim]), np.mean([s["memorised_pixel"] for s in sim])
    f_pix, f_mem = (
        np.mean([f["pixel_nn_mean_synthetic"] for f in fed]),
        np.mean([f["memorised_pixel"] for f in fed]),
    )
    if psnr <= ref + 3:
        verdict = "DLG recovered little beyond the data prior here."
    elif f_mem <= 0.05 < d_mem:
        verdict = (
            "one FedAvg update gives back near-copies of private images, while FedIOD's synthetic data hold "
            "no more near-copies than fresh real data would."
        )
    else:
        verdict = "DLG recovers the images, and FedIOD's synthetic data too exceed the 0.05 reference share."
    lines = [
        f"* DLG on FedAvg's single-image update ({sum(d['images'] for d in dlg)} images): PSNR {psnr:.1f} dB "
        f"against the true image (mean-image reference {ref:.1f} dB), pixel NN distance {d_pix:.3g} (FedIOD "
        f"synthetic {f_pix:.3g}), memorisation share {d_mem:.2f} (FedIOD {f_mem:.2f}): {verdict}"
    ]
    fid, same_n = [s["fid"] for s in sim], [s["fid_held_out_same_n"] for s in sim]
    lower = sum(a < b for a, b in zip(fid, same_n, strict=True) if math.isfinite(a) and math.isfinite(b))
    if not any(math.isfinite(v) for v in fid):
        return [*lines, f"* No DLG FID: {dlg[0]['images']} reconstruction(s) per client (a FID needs two)."]
    caveat = (
        "At this size FID cannot reliably tell copies of private images from fresh data; NN distance and "
        "memorisation share can."
        if lower < len(dlg)
        else "It ranks the copies closer here, but on so few points the values are noise-dominated; NN "
        "distance and memorisation share are the reliable measures."
    )
    lines.append(
        f"* The DLG row's FID ({_span(fid)}) is on {dlg[0]['images']} point(s) per client in 84 dimensions "
        f"and is degenerate: the same estimator gives {_span(same_n)} for as many held-out real images, and "
        f"the reconstructions' FID is the lower one for {lower} of {len(dlg)} clients. {caveat}"
    )
    return lines


def fmt(value: float | None, spec: str = ".3g") -> str:
    return "n/a" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, spec)


def run_tables(entry: dict[str, Any]) -> list[str]:
    lines = [
        "FedIOD synthetic vs held-out real, each against the client's private set (label skew: total-variation "
        "distance of the client's class distribution from the held-out set's; NN: mean L2 distance to the "
        "nearest private image, pixels in [0, 1]; memorised: share below the held-out 5th percentile). "
        f"FID of the synthetic set to the held-out real set itself: {entry['fid_synthetic_to_held_out']:.3g}.",
        "",
        "| client | private | label skew | FID synthetic | FID held-out | pixel NN synthetic "
        "| pixel NN held-out | feature NN synthetic | feature NN held-out | memorised pixel | memorised feature |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in entry["results"]:
        f = r["fediod"]
        lines.append(
            f"| {r['client']} | {r['private_images']} | {r['label_skew']:.2f} | {fmt(f['fid_synthetic'])} "
            f"| {fmt(f['fid_held_out'])} "
            f"| {fmt(f['pixel_nn_mean_synthetic'])} | {fmt(f['pixel_nn_mean_held_out'])} "
            f"| {fmt(f['feature_nn_mean_synthetic'])} | {fmt(f['feature_nn_mean_held_out'])} "
            f"| {f['memorised_pixel']:.3f} | {f['memorised_feature']:.3f} |"
        )
    if not any("dlg" in r for r in entry["results"]):
        return lines
    lines += [
        "",
        "DLG reconstructions of FedAvg single-image updates, against the same private set. FID* is on "
        "the few reconstructions and is degenerate (next to it: held-out real images at the same count).",
        "",
        "| client | images | DLG PSNR dB | mean-image PSNR dB | label acc. | pixel NN | feature NN "
        "| memorised pixel | memorised feature | FID* DLG | FID* held-out same n |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in (r for r in entry["results"] if "dlg" in r):
        d, s = r["dlg"], r["dlg"]["similarity"]
        lines.append(
            f"| {r['client']} | {d['images']} | {d['psnr_mean']:.1f} | {d['mean_image_psnr_mean']:.1f} "
            f"| {fmt(d['label_accuracy'], '.2f')} | {fmt(s['pixel_nn_mean'])} | {fmt(s['feature_nn_mean'])} "
            f"| {s['memorised_pixel']:.3f} | {s['memorised_feature']:.3f} | {fmt(s['fid'])} "
            f"| {fmt(s['fid_held_out_same_n'])} |"
        )
    checks = [r["dlg"]["gradient_check_max"] for r in entry["results"] if "dlg" in r]
    lines += [
        "",
        f"Interception check: the update / lr equals the true gradient of the captured image to a relative "
        f"error of at most {max(checks):.1e}.",
    ]
    return lines


def write_markdown(data: dict[str, Any], path: Path) -> None:
    s, net = data["settings"], data["feature_network"]
    lines = [
        f"# FedIOD privacy analysis (paper Figure 4): synthetic data vs private data, {data['dataset']}",
        "",
        f"Command: `{data['command']}`",
        "",
        f"Settings: {s['synthetic']} generator samples per run (BatchNorm: {s['generator_bn']} statistics, "
        f"the server's latent streams); held-out real reference of the same size; DLG: {s['dlg_images']} "
        f"private image(s) per client, one FedAvg SGD step of batch 1 (lr 0.05, round 1) on "
        f"`lenet-fedmdcg-dlg`, {s['dlg_iterations']} L-BFGS steps; seed {s['seed']}; {data['machine']}; "
        f"{data['seconds']:.0f} s.",
        "",
        f"Feature network: `{net['model']}` (ReLU LeNet-5, {net['dim']}-d penultimate features), "
        f"{net['epochs']} epoch(s) on the first half of the test split ({net['trained_on']} images, never "
        f"held by a client); accuracy {100 * net['test_accuracy']:.2f}% on the second half (the held-out "
        f"reference pool, unseen in training), {100 * net['train_accuracy']:.2f}% on its training half.",
        "",
        "**These FID values are not comparable to the Inception-based FIDs of the literature** (FedIOD's "
        "Figure 4 included): the features come from a small LeNet trained here (84-d, not Inception-v3's "
        "2048-d) and the sets are small, so the values live on their own scale and FID is biased upwards for "
        "small sets. Compare them only with each other, above all with the held-out real reference computed "
        "the same way at the same size.",
        "",
    ]
    for entry in data["runs"]:
        lines += [
            f"## {entry['label']}",
            "",
            f"`{entry['run']}`: alpha {entry['alpha']:g}, {entry['clients']} clients, partition hash "
            f"{entry['partition_hash'][:12]}...; generator latent {entry['generator']['latent_dim']}, width "
            f"{entry['generator']['width']}, sampled in batches of {entry['generator']['synthetic_batch_size']}.",
            "",
            *run_tables(entry),
            "",
            "Reading:",
            "",
            *reading(entry),
            "",
        ]
    lines.append(f"Plot: `{Path(data['plot']).name}`.")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


COLORS = {"FedIOD synthetic": "C0", "held-out real": "C1", "FedAvg + DLG": "C3"}


def _bars(ax: Any, groups: list[tuple[str, list[float]]], clients: list[int], title: str) -> None:
    """Grouped bars, one group per client, one colour per series across panels."""
    x = np.arange(len(clients))
    width = 0.8 / len(groups)
    for i, (name, values) in enumerate(groups):
        ax.bar(x + (i - (len(groups) - 1) / 2) * width, values, width, label=name, color=COLORS[name])
    ax.set_xticks(x, [str(c) for c in clients])
    ax.set_xlabel("client")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, loc="upper center", ncol=2, framealpha=0.9)


def plot(data: dict[str, Any], path: Path) -> None:
    """Per run one row: FID, mean pixel NN distance and memorisation share, per client."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = data["runs"]
    fig, axes = plt.subplots(len(runs), 3, figsize=(15, 3.8 * len(runs)), squeeze=False)
    for row, entry in zip(axes, runs, strict=True):
        clients = [r["client"] for r in entry["results"]]
        fed = [r["fediod"] for r in entry["results"]]
        complete = all("dlg" in r for r in entry["results"])
        dlg = [r["dlg"]["similarity"] for r in entry["results"]] if complete else []

        def series(name: str, reports: list[dict[str, Any]], key: str) -> list[tuple[str, list[float]]]:
            return [(name, [r[key] for r in reports])] if reports else []

        synthetic, held_out, inverted = COLORS
        fid = series(synthetic, fed, "fid_synthetic") + series(held_out, fed, "fid_held_out")
        nn = (
            series(synthetic, fed, "pixel_nn_mean_synthetic")
            + series(held_out, fed, "pixel_nn_mean_held_out")
            + series(inverted, dlg, "pixel_nn_mean")
        )
        share = series(synthetic, fed, "memorised_pixel") + series(inverted, dlg, "memorised_pixel")
        row[0].axhline(
            entry["fid_synthetic_to_held_out"],
            color="C0",
            linestyle=":",
            label="FedIOD synthetic to held-out real",
        )
        row[2].axhline(0.05, color="C1", linestyle="--", linewidth=1, label="held-out real (0.05)")
        _bars(row[0], fid, clients, "FID to the private set (LeNet-5 features, not Inception)")
        _bars(row[1], nn, clients, "mean pixel distance to the nearest private image (log)")
        _bars(row[2], share, clients, "memorisation share (pixel)")
        row[0].set_ylim(0, 1.25 * max(max(v) for _, v in fid))
        row[1].set_yscale("log")
        row[1].set_ylim(top=30 * max(max(v) for _, v in nn))
        row[2].set_ylim(0, 1.25)
        row[0].set_ylabel(entry["label"], fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def strict_json(value: Any) -> Any:
    """NaN (an undefined FID) becomes null, so the file is valid JSON for any reader."""
    if isinstance(value, dict):
        return {k: strict_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [strict_json(v) for v in value]
    return None if isinstance(value, float) and not math.isfinite(value) else value


# --- main ------------------------------------------------------------------------------------------------


def run_paths(values: list[str] | None) -> list[Path]:
    if not values:
        return [DEFAULT_RUN]
    return [Path(p.strip()) for v in values for p in v.split(",") if p.strip()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--run", action="append", help="FedIOD run directory (repeatable or comma-separated)")
    parser.add_argument("--data-dir", default=str(HERE.parents[1] / "shared" / "data"))
    parser.add_argument("--synthetic", type=int, default=2000, help="generator samples per run")
    parser.add_argument("--generator-bn", choices=("batch", "running"), default="batch")
    parser.add_argument("--clients", default="all", help="'all' or a comma list of client ids")
    parser.add_argument(
        "--dlg-images", type=int, default=8, help="private images per client for DLG (0: skip)"
    )
    parser.add_argument("--dlg-iterations", type=int, default=100, help="L-BFGS steps of DLG")
    parser.add_argument("--feature-epochs", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=str(RESULTS))
    args = parser.parse_args(argv)
    if args.synthetic < 2:
        parser.error("--synthetic must be >= 2 (a FID needs two samples)")
    if args.dlg_images < 0:
        parser.error("--dlg-images must be >= 0")
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    command = " ".join(["python benchmarks/fediod_similarity.py", *(sys.argv[1:] if argv is None else argv)])

    by_dataset: dict[str, list[FedIODRun]] = {}
    for path in run_paths(args.run):
        run = load_run(path, args.data_dir)
        by_dataset.setdefault(run.config.dataset, []).append(run)
    for dataset, runs in by_dataset.items():
        started = time.perf_counter()
        info, test = runs[0].info, runs[0].data.dataset.test
        reference = reference_for(test, info, args.feature_epochs, args.seed)
        print(f"{dataset}: feature network test accuracy {100 * reference.test_accuracy:.2f}%", flush=True)
        measured = [measure_run(run, reference, args) for run in runs]
        stem = out / f"fediod_similarity_{dataset}"
        data = {
            "benchmark": "fediod_similarity",
            "dataset": dataset,
            "command": command,
            "settings": {k: v for k, v in vars(args).items() if k not in ("data_dir", "out", "run")},
            "feature_network": {
                "model": FEATURE_MODEL,
                "dim": int(reference.features(test.subset(range(2))).shape[1]),
                "epochs": args.feature_epochs,
                "trained_on": len(test) // 2,
                "train_accuracy": reference.features.accuracy,
                "test_accuracy": reference.test_accuracy,
            },
            "runs": measured,
            "plot": stem.with_suffix(".png").name,
            "seconds": time.perf_counter() - started,
            "machine": f"{platform.machine()} CPU, {args.threads} thread(s), torch {torch.__version__}",
        }
        data["readings"] = {entry["label"]: reading(entry) for entry in measured}
        plot(data, stem.with_suffix(".png"))
        stem.with_suffix(".json").write_text(json.dumps(strict_json(data), indent=2) + "\n", encoding="utf-8")
        write_markdown(data, stem.with_suffix(".md"))
        print(f"wrote {stem.with_suffix('.md')} ({data['seconds']:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("MPLBACKEND", "Agg")
    raise SystemExit(main())
