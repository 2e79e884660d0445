"""The reconstruction table's rows: every method's SSIM and PSNR per test source, scored as the runs
score their models (per volume, the volume's maximum as the data range).

FedAvg's, FL-MRCM's and FedIOD's numbers are their runs' own summaries, their saved models re-scored
here as a check; Standalone's and Centralized's models are scored from their runs' last checkpoint with
the same harness, because their clients score test slices one by one (they hold no volume ids).
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fedistill import machine
from fedistill.federation.ledger import DOWN, UP
from fedistill.reproduce.paths import display_path
from fedistill.reproduce.reconstruction_plan import LABELS, run, run_specs


class Harness:
    """The runs' own evaluation (fedistill's runner): the test set, per volume and per source, on a model
    rebuilt from a run's config, so a saved state can be scored exactly as the server scores its model."""

    def __init__(self, run_dir: Path, data_dir: str) -> None:
        from fedistill.algorithms.shared.training import task_of
        from fedistill.config import read_config
        from fedistill.data.registry import load_dataset
        from fedistill.engine.setup import source_names

        self.config = read_config(run_dir / "config.toml").replace(data_dir=data_dir)
        options = self.config.options.get(self.config.dataset, {})
        self.dataset = load_dataset(self.config.dataset, self.config.data_dir, **options)
        self.task = task_of(self.config, self.dataset.info)
        self.sources = source_names(self.dataset)
        self.site_names = list(self.dataset.group_names)

    def model(self, state: dict[str, Any] | None = None) -> Any:
        from fedistill.algorithms.shared.training import new_model

        model = new_model(self.config, self.dataset.info)
        if state is not None:
            model.load_state_dict(state)
        return model.eval()

    def score(self, model: Any) -> dict[str, float]:
        from fedistill.algorithms.shared.training import evaluate_model

        data = self.dataset
        return evaluate_model(
            model, data.test, data.info, task=self.task, meta=data.test_meta, groups=self.sources
        )

    def zero_filled(self) -> dict[str, float]:
        """The undersampled input scored as a reconstruction: the input itself through the task (its masks,
        and its data consistency when on), i.e. what a net whose correction is zero returns."""
        from torch import nn

        from fedistill.algorithms.shared.training import evaluate_model

        task = self.task.identity_baseline()  # an identity net: the input is the output
        data = self.dataset
        return evaluate_model(
            nn.Identity(), data.test, data.info, task=task, meta=data.test_meta, groups=self.sources
        )

    def zero_filled_label(self) -> str:
        """The zero-filled row's label, naming data consistency where the task applies it."""
        dc = getattr(self.task, "data_consistency", False)
        return LABELS["zero-filled"].replace("input", "input + data consistency" if dc else "input")


def client_states(run_dir: Path) -> list[dict[str, Any]]:
    """Each client's model from the run's last checkpoint (evaluation only: the protocol sends none)."""
    from fedistill.engine.checkpoint import latest_checkpoint, read_checkpoint

    path = latest_checkpoint(run_dir / "checkpoints")
    if path is None:
        raise SystemExit(f"{run_dir}: no checkpoint to read the site models from")
    parts = read_checkpoint(path)
    return [parts[key]["model"] for key in sorted(k for k in parts if k.startswith("client_"))]


def saved_state(run_dir: Path, name: str) -> dict[str, Any]:
    """A model the run exported (`models/<name>.safetensors`)."""
    from safetensors.torch import load_file

    return load_file(str(run_dir / "models" / f"{name}.safetensors"))


def per_source(
    metrics: dict[str, float], sources: Sequence[str], prefix: str = ""
) -> dict[str, dict[str, float]]:
    """{"ssim": {source: value}, "psnr": {...}} from a metrics dict (`test_ssim_<source>` with prefix
    test_)."""
    return {m: {s: float(metrics[f"{prefix}{m}_{s}"]) for s in sources} for m in ("ssim", "psnr")}


def row(method: str, label: str, scores: dict[str, dict[str, float]], **extra: Any) -> dict[str, Any]:
    """A table row: per-source SSIM and PSNR, their means over the sources, and what else it records."""
    means = {f"{m}_mean": statistics.fmean(scores[m].values()) for m in ("ssim", "psnr")}
    return {"method": method, "label": label, **scores, **means, **extra}


def sent(summary: dict[str, Any]) -> dict[str, int]:
    """What a run's messages moved, from its ledger totals: sites to server, and both directions."""
    traffic = summary.get("communication", {})
    up = traffic.get(UP, {}).get("total_bytes", 0)
    return {"up_bytes": up, "all_bytes": up + traffic.get(DOWN, {}).get("total_bytes", 0)}


def rel(path: Path) -> str:
    """A run folder as the table cites it (`display_path`: no machine folder)."""
    return display_path(path)


def measure(args: argparse.Namespace) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Run every asked method and score it; returns the table's rows and what the notes cite."""
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    done = [(spec, *run(spec, args)) for spec in run_specs(args)]
    harness = Harness(done[0][1], args.data_dir)
    sites = harness.site_names
    zero = per_source(harness.zero_filled(), sites)
    rows = [row("zero-filled", harness.zero_filled_label(), zero, wall_time_s=None)]
    facts: dict[str, Any] = {"sites": sites, "rescore_max_abs_diff": 0.0,
                             "machine": machine.of_summaries(summary for _, _, summary in done)}  # fmt: skip

    def check(run_dir: Path, state_name: str, summary: dict[str, Any]) -> None:
        """The saved model, re-scored here, gives the run's own numbers (the harness is the runner's)."""
        again = harness.score(harness.model(saved_state(run_dir, state_name)))
        diff = max(abs(again[f"ssim_{s}"] - summary["final"][f"test_ssim_{s}"]) for s in sites)
        facts["rescore_max_abs_diff"] = max(facts["rescore_max_abs_diff"], diff)

    flmrcm = []
    for spec, run_dir, summary in done:
        wall = summary["wall_time_s"]
        if spec.method in ("standalone", "centralized"):
            states = client_states(run_dir)
            scored = [per_source(harness.score(harness.model(s)), sites) for s in states]
            models = [{"site": sites[k] if spec.method == "standalone" else "pooled", "run_dir": rel(run_dir),
                       "checkpoint_client": k} for k in range(len(states))]  # fmt: skip
            if spec.method == "centralized":
                rows.append(row("centralized", LABELS["centralized"], scored[0], wall_time_s=wall,
                                run_dir=rel(run_dir), models=models, **sent(summary)))  # fmt: skip
                continue
            mean = {
                m: {s: statistics.fmean(x[m][s] for x in scored) for s in sites} for m in ("ssim", "psnr")
            }
            std = {
                m: {s: statistics.pstdev(x[m][s] for x in scored) for s in sites} for m in ("ssim", "psnr")
            }
            rows.append(row("standalone", LABELS["standalone"], mean, std=std, wall_time_s=wall,
                            run_dir=rel(run_dir), models=models, **sent(summary)))  # fmt: skip
            site_rows = [
                row("standalone-site", f"Standalone: {sites[k]}'s model", scores, site=sites[k],
                    wall_time_s=None, run_dir=rel(run_dir), models=[models[k]])
                for k, scores in enumerate(scored)
            ]  # fmt: skip
            rows += [own_site_row(site_rows), *site_rows]
        elif spec.method == "fedavg":
            check(run_dir, "global", summary)
            model = {"site": "global", "run_dir": rel(run_dir), "file": "models/global.safetensors"}
            rows.append(row("fedavg", LABELS["fedavg"], per_source(summary["final"], sites, "test_"),
                            wall_time_s=wall, run_dir=rel(run_dir), models=[model],
                            **sent(summary)))  # fmt: skip
        elif spec.method == "flmrcm":
            check(run_dir, "global", summary)
            flmrcm.append((spec.target, run_dir, summary))
        else:
            check(run_dir, "student", summary)
            final = summary["final"]
            facts[spec.row] = {
                "up_per_kind": summary["communication"][UP]["per_kind"],
                "down_total": summary["communication"][DOWN]["total_bytes"],
                **{
                    k: final.get(k)
                    for k in ("ensemble_ssim", "teacher_mean_ssim", "selected_epoch", "val_ssim")
                },
                "setup_time_s": summary.get("setup_time_s"),
            }
            model = {"site": "student", "run_dir": rel(run_dir), "file": "models/student.safetensors"}
            rows.append(row(spec.row, LABELS[spec.row], per_source(final, sites, "test_"), wall_time_s=wall,
                            run_dir=rel(run_dir), models=[model], **sent(summary)))  # fmt: skip
    if flmrcm:
        rows += flmrcm_rows(flmrcm, sites)
    order = [
        "zero-filled",
        "standalone",
        "standalone-own",
        "standalone-site",
        "centralized",
        "fedavg",
        "flmrcm",
        "flmrcm-target",
        "fediod",
        "fediod-paper",
    ]
    rows.sort(key=lambda r: order.index(r["method"]))
    return rows, facts


def own_site_row(site_rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Standalone as each site deploys it: every source scored by its own site's model (the diagonal of the
    per-site rows), as FL-MRCM's row scores each source by the run whose target it is."""
    own = {m: {r["site"]: r[m][r["site"]] for r in site_rows} for m in ("ssim", "psnr")}
    models = [model for r in site_rows for model in r["models"]]
    return row("standalone-own", LABELS["standalone-own"], own, wall_time_s=None, models=models)


def flmrcm_rows(
    runs: list[tuple[int | None, Path, dict[str, Any]]], sites: list[str]
) -> list[dict[str, Any]]:
    """One row per target, and the paper's row: each source scored by the run whose target it is."""
    rows, diagonal, models = [], {"ssim": {}, "psnr": {}}, []
    for target, run_dir, summary in runs:
        assert target is not None
        scores = per_source(summary["final"], sites, "test_")
        model = {"site": sites[target], "run_dir": rel(run_dir), "file": "models/global.safetensors"}
        rows.append(row("flmrcm-target", f"FL-MRCM, target {sites[target]}", scores, target=sites[target],
                        wall_time_s=summary["wall_time_s"], run_dir=rel(run_dir),
                        models=[model], **sent(summary)))  # fmt: skip
        for m in ("ssim", "psnr"):
            diagonal[m][sites[target]] = scores[m][sites[target]]
        models.append(model)
    if len(runs) == len(sites):
        wall = sum(s["wall_time_s"] for _, _, s in runs)
        moved = {k: sum(sent(s)[k] for _, _, s in runs) for k in ("up_bytes", "all_bytes")}
        rows.insert(0, row("flmrcm", LABELS["flmrcm"], diagonal, wall_time_s=wall, models=models, **moved))
    return rows
