"""The model card written beside an exported model (`<file>.card.json` and `<file>.card.md`, e.g.
`student.onnx.card.md`, so that each export in one folder keeps its own): how it was
trained (method, dataset, partition, clients), what left the sites to train it and how many bytes, how
well it scores, its privacy budget where it has one, the versions and commit that made it, and the
preprocessing its inputs need."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

from fedistill import machine
from fedistill.engine.summary import metric_text, partition_text
from fedistill.federation.ledger import DOWN, UP
from fedistill.inference.selection import which_model
from fedistill.inference.trained_model import TrainedModel
from fedistill.metrics.thresholds import logit_margin

CARD_SUFFIXES = (".card.json", ".card.md")
UNKNOWN_COMMIT = (
    "unknown (this export's checkout is not the code that trained it, `code` under versions, or is no git "
    "checkout)"
)

#: What the exported model outputs, per task.
OUTPUTS = {
    "classification": "logits (N, classes): argmax is the class, softmax the probabilities",
    "text-classification": "logits (N, classes): argmax is the class, softmax the probabilities",
    "semantic-segmentation": "per-pixel logits (N, classes, H, W): argmax over classes is each pixel's class",
    "instance-segmentation": "per-pixel logits (N, 3, H, W) of background, nucleus inside, nucleus contour",
    "reconstruction": "images (N, C, H, W): the reconstruction of the zero-filled input images",
}


def output_description(model: TrainedModel, format: str) -> str:
    """What the file exported in `format` outputs: `OUTPUTS` for its task, except a safetensors export of a
    reconstruction net with a residual or output scale, whose bare net outputs what `Reconstruction.corrected`
    turns into the image (ONNX and TorchScript files have that step inside)."""
    from fedistill.tasks.reconstruction import Reconstruction

    task = model.task
    threshold = getattr(task, "decision_threshold", 0.5)  # a two-class segmentation's (instances: 0.5)
    if isinstance(threshold, float) and threshold != 0.5:
        margin = logit_margin(threshold)
        return (
            f"per-pixel logits (N, 2, H, W): a pixel is foreground where its softmax foreground probability "
            f"exceeds the run's decision threshold {threshold}, i.e. z_1 - z_0 > {margin:.4f}"
        )
    if format != "safetensors" or not isinstance(task, Reconstruction):
        return OUTPUTS.get(task.name, "the model's outputs")
    if task.standalone(model.module) is model.module:  # no residual, no output scale: the image itself
        return OUTPUTS[task.name]
    base = "x" if task.residual else ("mean(x)" if task.output_scale == "slice" else "0")
    unit = " * std(x)" if task.output_scale == "slice" else ""
    spread = ""
    if task.output_scale == "slice":
        which = "the unbiased std" if task.residual else "the mean and unbiased std"
        spread = f" ({which} over each slice's pixels, the std at least 1e-6)"
    return (
        f"the net's raw output y (N, C, H, W), not the image: the reconstruction of the zero-filled input "
        f"x is {base} + y{unit}{spread} (`Reconstruction.corrected`; ONNX and TorchScript exports return "
        "the image)"
    )


def git_commit() -> str | None:
    """The commit of the git checkout this package's files belong to; None outside one (an installed
    package) or without git."""
    package = Path(__file__).resolve().parents[1]

    def git(*args: str) -> subprocess.CompletedProcess[str] | None:
        try:
            return subprocess.run(
                ["git", *args], cwd=package, capture_output=True, text=True, timeout=10, check=False
            )
        except (OSError, subprocess.SubprocessError):
            return None

    tracked = git("ls-files", "--error-unmatch", "__init__.py")  # the package is part of the checkout
    if tracked is None or tracked.returncode != 0:
        return None
    head = git("rev-parse", "HEAD")
    commit = head.stdout.strip() if head is not None and head.returncode == 0 else ""
    return commit if re.fullmatch(r"[0-9a-f]{40,64}", commit) else None


def training_commit(summary: dict[str, Any]) -> str | None:
    """The commit of the code that trained the run: this checkout's (`git_commit`) where its code is the
    one the run's summary.json records (its fingerprint, `versions.code`, and no other code resumed it),
    else None: a model exported by later code was not trained at the commit that exports it."""
    from fedistill.version import code_fingerprint

    codes = summary.get("code_history") or [summary.get("versions", {}).get("code")]
    if len(set(codes)) != 1 or codes[0] != code_fingerprint():
        return None
    return git_commit()


def preprocessing(model: TrainedModel) -> dict[str, Any]:
    """What an input goes through before the exported model sees it (`TrainedModel.preprocess`)."""
    info = model.info
    if info.text is not None:
        return {
            "input": "token ids (N, L), int64, padded at the end",
            "tokenizer": info.text.tokenizer,
            "vocab_size": info.text.vocab_size,
            "pad_id": info.text.pad_id,
            "max_length": info.text.max_length,
            "class_names": list(info.class_names),
        }
    if model.task.outputs_images:  # a reconstruction net: zero-filled MRI slices, no classes
        options = model.task.options()
        return {
            "input": "float32 (N, channels, image_size, image_size): zero-filled magnitude images, the "
            "|centred orthonormal inverse Fourier transform| of the slice's k-space with the columns the "
            "mask skips set to 0",
            "scale": "each volume divided by its maximum (fully sampled, after resizing), as the run's "
            "slices were",
            "undersampling": {
                key: options[key]
                for key in ("mask", "acceleration", "center_fraction", "mask_mode", "mask_seed")
            },
            "normalise": "(x - mean) / std per channel",
            "image_size": info.image_size,
            "channels": info.channels,
            "mean": list(info.mean),
            "std": list(info.std),
        }
    return {
        **_volume_steps(model),
        "input": "float32 (N, channels, image_size, image_size)",
        "scale": "uint8 images divided by 255; float images taken to be in [0, 1]",
        "normalise": "(x - mean) / std per channel",
        "image_size": info.image_size,
        "channels": info.channels,
        "mean": list(info.mean),
        "std": list(info.std),
        "class_names": list(info.class_names),
    }


def _volume_steps(model: TrainedModel) -> dict[str, str]:
    """How a NIfTI volume became a nifti-folder model's uint8 slices (`nifti_folder.scaled_slices`,
    `model_slices`, as `fedistill predict` applies them); nothing for a model of any other dataset."""
    from fedistill.data.medical.nifti_folder import NAME, checked_window

    if model.config.dataset != NAME:
        return {}
    options = model.config.options.get(NAME, {})
    window = checked_window(options.get("window"))
    scale = (
        f"clipped to the window [{window[0]}, {window[1]}] and mapped to 0..255"
        if window
        else "each volume's 0.5th-99.5th percentiles of its voxels above its minimum mapped to 0..255"
    )
    return {
        "volumes": f"NIfTI volumes turned to the closest RAS orientation and cut into axial slices; {scale} "
        "(rounded to uint8); each slice centred on a square field of view as wide as the volume's larger "
        "physical side, resized to image_size (bilinear, antialiased); a predicted label slice goes back "
        "the same way (nearest) onto the volume's grid; of a 4-D file (several volumes along its 4th axis) "
        f"volume {options.get('channel', 0)} alone is read, the run's channel, and a 3-D file is taken as it"
    }


def privacy(final: dict[str, Any], options: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """The differential-privacy budget the run spent (the largest epsilon of any site) and what it covers,
    from the algorithm's options (`options`), or None. FedKD's is PATE's data-independent epsilon of the
    labels it released (the data-dependent one depends on the votes and is not published)."""
    options = options or {}
    if final.get("pate_epsilon_data_independent") is not None:
        seed = options.get("pate_noise_seed", "secret")
        return {
            "epsilon": final["pate_epsilon_data_independent"],
            "delta": final.get("pate_delta"),
            "epsilon_per_client": {},
            "accounting": "pate",
            "noise_seed": seed,
            "covers": _covers("pate", seed),
        }
    if final.get("epsilon_max") is None:
        return None
    prefix = "epsilon_client_"
    per_site = {k.removeprefix(prefix): v for k, v in final.items() if k.startswith(prefix)}
    accounting, seed = options.get("dp_accounting"), options.get("dp_noise_seed", "secret")
    return {
        "epsilon": final["epsilon_max"],
        "delta": final.get("dp_delta"),
        "epsilon_per_client": per_site,
        "accounting": accounting,
        "noise_seed": seed,
        "covers": _covers(accounting, seed, float(final.get("dp_sample_rate", 1.0))),
    }


def _covers(accounting: str | None, seed: str, sample_rate: float = 1.0) -> str:
    """What the epsilon bounds, in a sentence (docs/how-to/privacy.md has the whole account);
    `sample_rate`: the share of clients a round of client-level DP samples."""
    if accounting == "pate":
        what = (
            "the labels GNMax released, client-level (one client's whole data may change), and so the "
            "student trained on them and the public images alone; the server that aggregates sees every "
            "client's votes (a trusted aggregator), and the teachers' accuracies and the labels' agreement "
            "with the votes' plurality in the metrics are not noised"
        )
    elif accounting == "d-step":
        what = (
            "the paper's convention for FedIOD's discriminator steps, not a bound on what a site sends; the "
            "sites' logits and discriminator outputs are not noised, so this model carries no "
            "differential-privacy guarantee"
        )
    elif accounting == "release":
        what = (
            "the input-gradients FedIOD's sites return (clipped and noised); their logits and discriminator "
            "outputs are not noised, so this model carries no differential-privacy guarantee"
        )
    else:
        what = (
            "each client's model update (clipped and noised), per client; the sample counts and local "
            "step counts the clients report, and their model's accuracy on their own test share, are not "
            "noised"
        )
        if sample_rate < 1:
            what += (
                "; with a share of the clients sampled per round, the amplification it counts on holds "
                "only against whoever does not know which clients took part, not the server"
            )
    if seed == "run":
        what += "; the noise came from the run's seed, which anyone who knows it can regenerate: no privacy"
    return what


def _algorithm_options(model: TrainedModel) -> dict[str, Any]:
    """The privacy options of the algorithm that trained `model`, its defaults filled in."""
    from fedistill.engine.setup import resolve

    options = resolve(model.config, model.algorithm).options
    keys = ("dp_accounting", "dp_noise_seed", "pate_noise_seed")
    return {key: getattr(options, key) for key in keys if hasattr(options, key)}


def traffic(communication: dict[str, Any], direction: str) -> dict[str, Any]:
    """One direction's traffic as the model card states it: total bytes, messages and bytes per kind."""
    part = communication.get(direction, {})
    return {
        "total_bytes": part.get("total_bytes", 0),
        "messages": part.get("messages", 0),
        "bytes_per_kind": dict(part.get("per_kind", {})),
    }


def architecture_facts(model: TrainedModel) -> dict[str, Any]:
    """What rebuilds the net besides its weights and options: its norm ("auto" resolved to the model's
    default) and, for GroupNorm, its groups (its weights have one shape for every group count, so a wrong
    count loads without a word and answers wrong)."""
    from fedistill.models.registry import resolved_norm

    norm = resolved_norm(model.architecture, model.config.norm)
    return {"norm": norm, "group_norm_groups": model.config.group_norm_groups if norm == "group" else None}


def model_card(
    model: TrainedModel, summary: dict[str, Any], file: Path, format: str, check: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The card of `model` exported to `file` in `format`, from the run's summary.json."""
    partition = summary.get("partition", {})
    return {
        "model": {
            "file": file.name,
            "format": format,
            "exported_model": model.name,
            "selection": model.selection or which_model(summary),  # load_model worked it out
            "architecture": model.architecture,
            **architecture_facts(model),
            "model_options": dict(model.config.options.get("model_options", {})),
            "task": model.task.name,
            "task_options": model.task.options(),
            "parameters": sum(p.numel() for p in model.module.parameters()),
            "input_shape": ["N", *model.input_shape],
            "output": output_description(model, format),
            "batchnorm_statistics": _norm_statistics(model, summary["final"]),
        },
        "method": {
            "algorithm": summary["algorithm"],
            "description": summary["description"],
            "federated": summary["federated"],
            "rounds": summary["rounds"],
            "seed": summary.get("seed"),
        },
        "dataset": summary.get("dataset", model.config.dataset),
        "partition": {k: partition.get(k) for k in ("method", "alpha", "hash")},
        "clients": summary.get("clients"),
        "left_the_sites": traffic(summary["communication"], UP),
        "sent_to_the_sites": traffic(summary["communication"], DOWN),
        "final_metrics": summary["final"],
        "differential_privacy": privacy(summary["final"], _algorithm_options(model)),
        "versions": summary.get("versions", {}),
        "trained_on": machine.of_summary(summary),  # its numbers are this machine's (kernels round apart)
        "git_commit": training_commit(summary),
        "preprocessing": preprocessing(model),
        "check": check,
    }


def _norm_statistics(model: TrainedModel, final: dict[str, Any]) -> str | None:
    """How the exported global model's BatchNorm statistics came to be, when not by training alone
    (`recalibrate_norm`: the engine's norm_statistics step)."""
    samples = final.get("norm_statistics_samples")
    if samples is None or model.name != "global":
        return None
    return f"recomputed after the last round over the sites' training data ({int(samples)} samples)"


def card_markdown(card: dict[str, Any]) -> str:
    """The model card as Markdown: the model, how it was trained, what left the sites, privacy, results and
    preprocessing."""
    m, method, pre = card["model"], card["method"], card["preprocessing"]
    part, up = card["partition"], card["left_the_sites"]
    lines = [
        f"# {method['algorithm']} {m['exported_model']} model on {card['dataset']}",
        "",
        f"{method['description']}" + ("" if method["federated"] else "  **(not federated: data pooled)**"),
        "",
        f"- file: `{m['file']}` ({m['format']}); architecture: {m['architecture']}; "
        f"task: {m['task']}; {m['parameters']:,} parameters",
        f"- input: {tuple(m['input_shape'])}; output: {m['output']}",
        f"- which model: {m['selection']}",
        *([f"- BatchNorm statistics: {m['batchnorm_statistics']}"] if m.get("batchnorm_statistics") else []),
        f"- trained by {_count(card['clients'], 'client')} over {_count(method['rounds'], 'round')} "
        f"(seed {method['seed']})",
        f"- partition: {partition_text(part, brackets=True)}, hash `{part['hash']}`",
        f"- git commit: {card['git_commit'] or UNKNOWN_COMMIT}",
        f"- versions: {', '.join(f'{k} {v}' for k, v in card['versions'].items())}",
        f"- trained on: {card.get('trained_on', machine.NOT_RECORDED)}",
    ]
    if card["check"]:
        check = card["check"]
        verdict = ""
        if "within" in check:
            verdict = " (within" if check["within"] else " (ABOVE"
            verdict += f" the tolerance {check['tolerance']:.3g})"
        lines.append(
            f"- checked against PyTorch: max abs difference {check['max_abs_difference']:.3g}{verdict}"
        )
    lines += ["", "## What left the sites", "", "| kind | bytes |", "|---|---|"]
    lines += [f"| {kind} | {size:,} |" for kind, size in up["bytes_per_kind"].items()]
    lines += [f"| **total** ({up['messages']} messages) | {up['total_bytes']:,} |"]
    dp = card["differential_privacy"]
    lines += ["", "## Privacy", ""]
    if dp:
        lines.append(f"Differential privacy: epsilon {dp['epsilon']:.4g} at delta {dp['delta']:g}.")
        if dp.get("covers"):
            lines.append(f"It covers {dp['covers']}.")
    else:
        lines.append("Trained without differential privacy.")
    lines += ["", "## Final metrics", "", "| metric | value |", "|---|---|"]
    lines += [f"| {k} | {metric_text(v)} |" for k, v in card["final_metrics"].items()]
    lines += ["", "## Preprocessing", ""]
    lines += [f"- {key}: {value}" for key, value in pre.items()]
    return "\n".join(lines) + "\n"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def card_paths(exported: Path) -> tuple[Path, Path]:
    """The card files of the exported file `exported`: its name with `.card.json` and `.card.md`."""
    json_suffix, md_suffix = CARD_SUFFIXES
    return exported.with_name(exported.name + json_suffix), exported.with_name(exported.name + md_suffix)


def write_model_card(exported: Path, card: dict[str, Any]) -> tuple[Path, Path]:
    """The card of the exported file `exported` beside it (`card_paths`)."""
    exported.parent.mkdir(parents=True, exist_ok=True)
    as_json, as_md = card_paths(exported)
    as_json.write_text(json.dumps(card, indent=2) + "\n", encoding="utf-8")
    as_md.write_text(card_markdown(card), encoding="utf-8")
    return as_json, as_md
