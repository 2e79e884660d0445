"""The gradient-inversion table as written: PSNR / SSIM per setting and model variant, DLG and iDLG side
by side, FedMD-CG's Table 2 beside the rows that match its setting, and the notes that read it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fedistill import disk
from fedistill.analysis.threat_models import VARIANTS
from fedistill.reproduce.privacy_attacks import OBSERVED, PAPER_TABLE2, SETTINGS


def cell(summary: dict[str, Any] | None) -> str:
    """A table cell: mean PSNR dB / mean SSIM, ∞ for the PSNR of a setting with an exact reconstruction
    (`psnr_infinite`), or n/a."""
    if summary is not None and summary.get("psnr_infinite"):
        return f"∞ / {summary['ssim_mean']:.2f}"
    if summary is None or summary.get("psnr_mean") is None:
        return "n/a"
    return f"{summary['psnr_mean']:.1f} / {summary['ssim_mean']:.2f}"


def images_note(setting: str, entry: dict[str, Any], settings: dict[str, Any]) -> str:
    """``"; N images attacked, not M: why"`` for a setting that attacked another number of images than
    ``settings["images"]`` asked (whole clients only: multi-step FedAvg's of ``multi_steps`` images,
    FedMD-CG's batches of 2; FedIOD's D-step needs 2), else ``""``; also ``""`` for a setting that
    attacked none (its cells are n/a and say why)."""
    attacked, asked = entry.get("images"), settings["images"]
    if not attacked or attacked == asked:
        return ""
    steps = max(1, min(settings["multi_steps"], asked))
    why = {
        "fedavg-multistep": f"whole clients of {steps} steps",
        "fedmdcg": "whole batches of 2",
        "fediod": "its D-step needs a batch of 2 or more",
    }
    reason = why.get(setting, why.get(setting.split("/")[0], ""))
    return f"; {attacked} images attacked, not {asked}" + (f": {reason}" if reason else "")


def write_report(data: dict[str, Any], path_md: Path) -> None:
    """The Markdown report of a results record (`data`, as the JSON holds it) at ``path_md``."""
    args = data["settings"]
    lines = [
        "# Gradient inversion against what clients send",
        "",
        "`benchmarks/privacy_attacks.py`; FedMD-CG's Table 2 (DLG PSNR) extended with FedIOD. "
        f"{args['images']} private images per dataset and setting (a row that attacked another number "
        "says so); cells are **PSNR dB / SSIM** of the "
        "reconstruction against the client's actual batch (best one-to-one match, images in [0, 1]), mean "
        "over images. Higher = more leakage. Compare every cell with `reference/mean-image` (an attacker "
        "who knows only the data distribution): at or below it nothing was recovered.",
        "",
        f"Settings: {data['settings_line']}",
        "",
        "**Threat model.** An honest-but-curious server holding exactly what the client sent (what the "
        "ledger records), the requests it sent itself, and the public run configuration including the seed. "
        "`known-*` rows: the part a method keeps private is rebuilt from the run seed (exact in round 1 "
        "here, since every site starts from the seeded initialisation); `unknown-*`: the attacker must "
        "guess it (any later round, or an initialisation the server cannot derive). The FedIOD inversion "
        "grants the attacker *more* than the threat model: the client's teacher. Its discriminator's "
        "weights before the step are the seeded initialisation at this first step, which the server "
        "rebuilds; after it they are private too.",
        "",
        "Model variants:",
        "",
    ]
    for name in args["variants"].split(","):
        lines.append(
            f"* `{name}`: {VARIANTS[name].label} (`{VARIANTS[name].model}`, norm `{VARIANTS[name].norm}`)"
        )
    lines.append("")
    for dataset, by_variant in data["results"].items():
        variants = list(by_variant)
        lines += [f"## {dataset}", ""]
        header = (
            "| setting | what the server observes | "
            + " | ".join(f"{v} DLG | {v} iDLG" for v in variants)
            + " | paper (Table 2, DLG PSNR) |"
        )
        lines += [header, "|" + "---|" * (2 + 2 * len(variants) + 1)]
        for setting in SETTINGS:
            if not any(setting in by_variant[v] for v in variants):
                continue
            cells = []
            # the same images for every variant: the first variant's count speaks for the row
            note = images_note(setting, by_variant[variants[0]].get(setting, {}), args)
            for v in variants:
                entry = by_variant[v].get(setting)
                if entry is None:
                    cells += ["", ""]
                elif "attack" in entry["scores"]:
                    cells += [cell(entry["scores"]["attack"]), "—"]
                else:
                    cells += [cell(entry["scores"].get("dlg")), cell(entry["scores"].get("idlg"))]
            method = setting.split("/")[0].removesuffix("-1step").removesuffix("-multistep")
            paper = PAPER_TABLE2.get(dataset, {}).get(method)
            show_paper = paper is not None and (
                setting in ("fedavg-1step",)
                or setting.endswith("unknown-head")
                or setting.endswith("unknown-extractor")
            )
            lines.append(
                f"| `{setting}` | {OBSERVED[setting]}{note} | "
                + " | ".join(cells)
                + f" | {paper if show_paper else ''} |"
            )
        lines.append("")
        lines.append(
            "Label accuracy of the attacks (DLG / iDLG) and checks. *Gradient error*: the relative distance "
            "between the gradient the server derives from the reply and the true gradient of the captured "
            "batch at the weights the client started from (largest over clients); ~1e-7 shows the "
            "interception is exact, for multi-step FedAvg it is the error of the one-batch approximation "
            "DLG has to make."
        )
        lines.append("")
        for v in variants:
            parts = []
            for setting, entry in by_variant[v].items():
                sc = entry["scores"]
                if "dlg" in sc:
                    acc = [sc[a].get("label_accuracy") for a in ("dlg", "idlg")]
                    acc_s = "/".join("n/a" if a is None else f"{a:.2f}" for a in acc)
                    check = entry.get("gradient_check_max")
                    extra = f", gradient error {check:.1e}" if check is not None else ""
                    parts.append(f"`{setting}` {acc_s}{extra}")
                if entry.get("replay_error"):
                    err = entry["replay_error"]
                    reached = sc["attack"].get("final_distance")
                    parts.append(
                        f"`{setting}` exact replay from the true batch reproduces the reply to "
                        f"{err['input_gradient']:.1e} (input-gradients) and {err['ratio']:.1e} (ratios), "
                        "relative; matching objective (relative squared error): true batch "
                        f"{err['objective_true_batch']:.1e}, other real images "
                        f"{err['objective_other_batch']:.2g}, the inversion's result {reached:.2g}"
                    )
            lines.append(f"* `{v}`: " + "; ".join(parts))
        lines.append("")
    lines += [
        "## Reading the table",
        "",
        *data["notes"],
        "",
        "Image grids (top row: the client's batch; then DLG; then iDLG, except where the iDLG cell is "
        "n/a, as for FedPer, whose reply holds no last layer: the grid's title says so): "
        f"`benchmarks/results/privacy_attacks/`. Total time {data['seconds']:.0f} s on {data['machine']}.",
        "",
    ]
    disk.write_text(path_md, "\n".join(lines))


NOTES = [
    "* The paper's Table 2 has no MNIST column; its Fashion-MNIST numbers are shown next to the rows that "
    "match its setting (FedAvg: whole updates; FedPer, LG-FedAvg, FedMD-CG: the private part unknown to the "
    "server). The paper does not state the attacked model, batch size, round or what its attacker knew of "
    "the private parts. DLG is usually run on a Sigmoid LeNet without pooling, which the `dlg` variant "
    "mirrors. Its FedPer number (19.66 dB, close to FedAvg's) fits an attacker that knows the private head: "
    "here FedPer leaks with a known head and not with an unknown one.",
    "* ReLU with max-pool (the project's model) defeats DLG and iDLG even for FedAvg's single-image "
    "gradient: L-BFGS stalls in a poor local minimum. Swapping in Sigmoid alone does not help while the "
    "max-pools stay: each pool passes the gradient of one pixel in four. Only the DLG-friendly `dlg` variant "
    "shows how much a whole-model gradient can leak.",
    "* iDLG reads the label off the last layer's gradient. lenet-fedmdcg's head (every variant, every "
    "method here) is fc1 -> fc2 with no activation in between, so that layer's input can be negative and "
    "the paper's rule (the row that sums below zero) can name a wrong class. For one image the true "
    "class's row is the one pointing against all the others whatever that sign, which is the rule used: "
    "exact. For a batch (FedMD-CG's 2 images, multi-step FedAvg's images taken as one) the B most "
    "negative row sums are taken, a heuristic that keeps the paper's assumption and can be wrong (see the "
    "label accuracies); with a wrong label iDLG fails "
    "outright. DLG optimises the label instead. For FedPer the last layer is private, so iDLG has no "
    "label to read (n/a).",
    "* Multi-step FedAvg is attacked through the average-gradient approximation `(w_old - w_new) / (lr * "
    "steps)`, recovering the images as one batch. It fails here because at lr 0.05 one SGD step already "
    "changes these small models a lot (see the gradient errors above: the one-batch approximation is far "
    "off; with BatchNorm the attacker's batch statistics also differ from the client's per-step ones), not "
    "because the update hides the data: attacks on multi-step updates need smaller learning rates or an "
    "attack that simulates the local steps.",
    "* BatchNorm on a batch of one normalises each channel over its spatial positions, so the input is "
    "only determined up to an affine change of intensity: reconstructions can look right (high SSIM) at a "
    "modest PSNR.",
    "* FedIOD: no parameter or parameter-gradient leaves the client, so DLG and iDLG do not apply. The "
    "logits are T_k on the server's own x (inverting them returns x); the input-gradient is with respect to "
    "x, known to the server. The private batch enters the reply only through one Adam step of D_k and one "
    "scalar (the real batch's mean D-score); its labels cross once, in stage 1, as the client's class "
    "counts (here the whole private set is the batch, so its labels are known). Even given T_k and "
    "D_k's exact weights before the step (the "
    "replay reproduces the reply to rounding), the inversion recovers nothing beyond the data prior: Adam's "
    "first step transmits about the sign of D's parameter gradient, and the B ratios and B input-gradients "
    "of x do not pin down B private images through it by gradient descent. The reply does depend on the "
    "batch, though: the checks above show the true batch reproducing it to rounding (<= 1e-13) while other "
    "real images of the same size (and the inversion's result) only reach ~1e-4 to 1e-1. So this white-box "
    "attacker, if it also held candidate images, could tell whether they were the batch used (a membership "
    "test); reconstruction is what fails. After the first G-step D_k's weights are private too, which "
    "weakens that test as well. What FedIOD's server does hold is its synthetic data; how close a *trained* "
    "generator's samples come to private data is the separate question of `fedistill.analysis.similarity` "
    "(FedIOD's Figure 4). Here `fediod/server-inputs` is the untrained generator of the first step, i.e. "
    "noise.",
    "* `known-*` rows measure a property of this library's initialisation: every site starts from the run "
    "seed's model, so in round 1 the part a method keeps private is known to the server. With the "
    "DLG-friendly model the shared part's gradient alone then reconstructs the image through it: for a "
    "batch of one, the head's weight gradient gives the extractor's feature vector exactly, and the "
    "untrained extractor is inverted (LG-FedAvg, FedMD-CG). Once the private part differs from anything the "
    "server can rebuild (`unknown-*`: later rounds, or a per-client initialisation from a seed the server "
    'does not know; `private_init = "client"` derives its seed from the run seed, so the server can '
    "rebuild that one), nothing is recovered.",
    "* One round, round 1, one local step: the attacker's best case for the parameter-sharing methods "
    "(freshly initialised models leak most). Real runs use larger batches and more local steps.",
]
