"""The FedIOD similarity study as written: per run, the per-client table of FedIOD's synthetic data and
held-out real data against each private set (and the DLG contrast), a few sentences generated from the
numbers, and one row of plots.

These FID values are not comparable to the Inception-based FIDs of the literature: the features come
from a small LeNet trained here (84-d) and the sets are small, so they are compared only with each other.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
from scipy.stats import spearmanr

from fedistill import disk


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
            else "so the synthetic data sit markedly closer to the clients' data than to real data in "
            "general."
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


def dlg_psnr(d: dict[str, Any]) -> str:
    """A DLG row's mean PSNR in dB: ∞ where an image was reconstructed exactly (`psnr_infinite`)."""
    return "∞" if d.get("psnr_infinite") else fmt(d["psnr_mean"], ".1f")


def _dlg_reading(dlg: list[dict[str, Any]], fed: list[dict[str, Any]]) -> list[str]:
    exact, images = sum(d.get("psnr_infinite", 0) for d in dlg), sum(d["images"] for d in dlg)
    finite = [d["psnr_mean"] for d in dlg if d["psnr_mean"] is not None]
    psnr = math.inf if exact else float(np.mean(finite)) if finite else math.nan
    ref = np.mean([d["mean_image_psnr_mean"] for d in dlg])
    said = f"∞ ({exact} of {images} images reconstructed exactly)" if exact else f"{psnr:.1f} dB"
    sim = [d["similarity"] for d in dlg]
    d_pix, d_mem = np.mean([s["pixel_nn_mean"] for s in sim]), np.mean([s["memorised_pixel"] for s in sim])
    f_pix, f_mem = (
        np.mean([f["pixel_nn_mean_synthetic"] for f in fed]),
        np.mean([f["memorised_pixel"] for f in fed]),
    )
    if not psnr > ref + 3:  # NaN (no finite PSNR) reads as recovering little, as before
        verdict = "DLG recovered little beyond the data prior here."
    elif f_mem <= 0.05 < d_mem:
        verdict = (
            "one FedAvg update gives back near-copies of private images, while FedIOD's synthetic data hold "
            "no more near-copies than fresh real data would."
        )
    else:
        verdict = "DLG recovers the images, and FedIOD's synthetic data too exceed the 0.05 reference share."
    lines = [
        f"* DLG on FedAvg's single-image update ({images} images): PSNR {said} "
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
        "FedIOD synthetic vs held-out real, each against the client's private set (label skew: "
        "total-variation distance of the client's class distribution from the held-out set's; NN: mean L2 "
        "distance to the nearest private image, pixels in [0, 1]; memorised: share below the held-out 5th "
        "percentile). FID of the synthetic set to the held-out real set itself: "
        f"{entry['fid_synthetic_to_held_out']:.3g}.",
        "",
        "| client | private | label skew | FID synthetic | FID held-out | pixel NN synthetic | pixel NN "
        "held-out | feature NN synthetic | feature NN held-out | memorised pixel | memorised feature |",
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
            f"| {r['client']} | {d['images']} | {dlg_psnr(d)} | {d['mean_image_psnr_mean']:.1f} "
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
            f"{entry['generator']['width']}, sampled in batches of "
            f"{entry['generator']['synthetic_batch_size']}.",
            "",
            *run_tables(entry),
            "",
            "Reading:",
            "",
            *reading(entry),
            "",
        ]
    lines.append(f"Plot: `{Path(data['plot']).name}`.")
    disk.write_text(path, "\n".join(lines) + "\n")


COLORS = {"FedIOD synthetic": "C0", "held-out real": "C1", "FedAvg + DLG": "C3"}


def _bars(ax: Any, groups: list[tuple[str, list[float]]], clients: list[int], title: str) -> None:
    """Grouped bars, one group per client, one colour per series across panels."""
    x = np.arange(len(clients))
    width = 0.8 / len(groups)
    for i, (name, values) in enumerate(groups):
        colour = next(c for series, c in COLORS.items() if name.startswith(series))
        ax.bar(x + (i - (len(groups) - 1) / 2) * width, values, width, label=name, color=colour)
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
        # a client too small for DLG has no bar (nan), the others keep theirs and the legend counts them
        dlg = [r["dlg"]["similarity"] if "dlg" in r else {} for r in entry["results"]]
        covered = sum(bool(d) for d in dlg)
        dlg = dlg if covered else []

        def series(name: str, reports: list[dict[str, Any]], key: str) -> list[tuple[str, list[float]]]:
            return [(name, [r.get(key, math.nan) for r in reports])] if reports else []

        synthetic, held_out, inverted = COLORS
        if covered < len(clients):
            inverted = f"{inverted} ({covered} of {len(clients)} clients)"
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
        row[1].set_ylim(top=30 * max(np.nanmax(v) for _, v in nn))
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
