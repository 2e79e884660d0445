"""Stage-1 models trained once: a site's local model, cached by everything that determines it.

One-shot methods (FedIOD and the one-shot baselines) distil the local models each site trains once.
Training them again for every method of a comparison costs time and, worse, invites comparisons of
methods that did not distil the same models. A site therefore keeps each stage-1 model it trains in
a cache folder on its own disk, keyed by what determines the model exactly: the site's training data
(a digest of its images and labels), the architecture, its normalisation layers and `[model_options]`
(a pretrained folder, a width), the training options, the dataset's description (its normalisation and
augmentation: a crop's padding, a flip), the run seed, the site's id (its random streams derive from
it), the code's fingerprint (fedistill's own code, comments and docstrings aside), the torch version,
and the device type, the CPU's kernel path (ATen's and oneDNN's: AVX-512, AVX2, SSE4.1), the thread
count and, on CUDA, the GPU model and cuDNN version it trains with (all change float rounding, so a
model trained on two threads or through AVX2 kernels is not the one a one-thread or AVX-512 run would
train). A later run that needs exactly that model loads it instead of training it; anything else
trains afresh.

The cache is the site's own: nothing of it crosses the client/server boundary. Each entry carries a
sha256 record written with it (stage1_entry.py); an entry that is damaged, altered or without its
record is logged in one line, trained afresh and overwritten.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from fedistill import devices
from fedistill.algorithms.base import ClientContext
from fedistill.algorithms.shared.stage1_entry import DamagedEntry, load_entry, store_entry
from fedistill.algorithms.shared.training import LocalTraining, train_local
from fedistill.config import RunConfig
from fedistill.federation.fleet import Fleet, successful
from fedistill.federation.messages import Message, state_specs
from fedistill.federation.plausibility import screen_parameters
from fedistill.federation.reply_spec import TRAIN_METRICS, ReplySpec
from fedistill.seeding import torch_generator
from fedistill.version import code_fingerprint

log = logging.getLogger(__name__)

#: Bump when the stage-1 training code changes what a given key trains (2: the dataset's description joined
#: the key; before, a run with another crop padding or flip could load a model trained without it).
STAGE1_FORMAT = 2


#: The common keys a method whose sites train their stage-1 model once never reads (`Algorithm.unused_keys`).
STAGE1_UNUSED_KEYS = {
    "local_epochs": "its sites train their stage-1 models once, for {name}.teacher_epochs epochs",
    "local_steps": "its sites train their stage-1 models once, for {name}.teacher_epochs epochs",
    "fraction": "every site trains and answers; none is sampled out",
}


def cache_folder(config: RunConfig, beside: Path) -> Path | None:
    """Where sites keep stage-1 models: `cache_dir`, else `.cache` in `beside` (None: caching is off)."""
    if not config.stage1_cache:
        return None
    return Path(config.cache_dir).expanduser() if config.cache_dir else beside / ".cache"


def stage1_key(ctx: ClientContext, architecture: str, spec: LocalTraining, purpose: str) -> str:
    """A digest of everything that determines the trained model."""
    config, data = ctx.config, ctx.train
    facts = {
        "format": STAGE1_FORMAT,
        "purpose": purpose,
        "dataset": dataclasses.asdict(ctx.info),
        "architecture": architecture,
        "norm": config.norm,
        "group_norm_groups": config.group_norm_groups,
        "training": dataclasses.asdict(spec),
        "task": spec.task.name,
        "seed": config.seed,
        "client": ctx.client_id,
        "torch": torch.__version__,
        "code": code_fingerprint(),
        "device": devices.current().type,
        "threads": torch.get_num_threads(),
        "kernels": torch.backends.cpu.get_cpu_capability(),
        "onednn_max_isa": os.environ.get("ONEDNN_MAX_CPU_ISA", ""),
    }
    if devices.current().type == "cuda":  # only on CUDA, so a CPU run's entries keep their keys
        facts["gpu"] = torch.cuda.get_device_name(devices.current())
        facts["cudnn"] = torch.backends.cudnn.version()
    model_options = config.options.get("model_options")
    if model_options:  # only when set, so the entries of runs without them keep their keys
        facts["model_options"] = model_options
    digest = hashlib.sha256(json.dumps(facts, sort_keys=True).encode())
    digest.update(data.x.contiguous().numpy().tobytes())
    digest.update(data.y.contiguous().numpy().tobytes())
    return digest.hexdigest()[:40]


def trained_once(
    model: nn.Module,
    ctx: ClientContext,
    architecture: str,
    spec: LocalTraining,
    train: Callable[[], dict[str, float]],
    *,
    purpose: str,
) -> dict[str, float]:
    """Train `model` in place with `train()`, or load it from the site's cache when it holds exactly it.

    Returns the training metrics (those of the original training on a cache hit) plus
    `stage1_cached` (1.0 on a hit, 0.0 otherwise).
    """
    folder = ctx.cache_dir
    if folder is None:
        return train() | {"stage1_cached": 0.0}
    key = stage1_key(ctx, architecture, spec, purpose)
    path = folder / "stage1" / f"{purpose}-{architecture}-client{ctx.client_id:03d}-{key}.safetensors"
    if path.is_file():
        try:
            metrics = load_entry(model, path)
            log.info(
                "client %d: stage-1 %s loaded from the cache (%s)", ctx.client_id, architecture, path.name
            )
            return metrics | {"stage1_cached": 1.0}
        except DamagedEntry as exc:
            log.warning(
                "client %d: cached stage-1 model %s is unusable (%s); training it again and overwriting it",
                ctx.client_id,
                path,
                exc,
            )
    metrics = train()
    _store(model, path, metrics)
    return metrics | {"stage1_cached": 0.0}


def train_teacher(model: nn.Module, ctx: ClientContext, architecture: str, epochs: int) -> dict[str, float]:
    """A one-shot method's stage-1 model of this site, trained (or loaded) exactly as FedIOD's teacher.

    Every method that distils local models trained once (FedIOD, DENSE, Co-Boosting) goes through here,
    so on the same config and seed they all distil the same models and share one cache entry per site:
    the run's common local-training options with `epochs` epochs, the site's "teacher-training" random
    stream, and the cache purpose "teacher".
    """
    spec = dataclasses.replace(LocalTraining.from_config(ctx.config, ctx.info), epochs=epochs, steps=0)
    generator = torch_generator(ctx.config.seed, "teacher-training", ctx.client_id)
    return trained_once(
        model,
        ctx,
        architecture,
        spec,
        lambda: train_local(model, ctx.train, ctx.info, spec, generator),
        purpose="teacher",
    )


def _store(model: nn.Module, path: Path, metrics: dict[str, float]) -> None:
    """A cache that cannot be written only costs the reuse, never the run."""
    try:
        store_entry(model, path, metrics)
    except OSError as exc:
        log.warning("stage-1 cache %s not written (%s); later runs will train this model again", path, exc)


def collect_local_models(
    fleet: Fleet, config: RunConfig, model_of: Callable[[int], nn.Module], *, screen_norms: bool = False
) -> dict[int, Message]:
    """The one exchange of the one-shot methods that upload models: every site trains (or loads) its
    stage-1 model and sends its parameters once; `model_of(cid)` gives the expected architecture. With
    `screen_norms`, a model whose parameter norm is far beyond its architecture's others is dropped and
    named (FedAvg's and FedDF's `plausibility_checks`)."""
    expect = {
        cid: ReplySpec(
            {"parameters": state_specs(model_of(cid).state_dict())}, (*TRAIN_METRICS, "teacher_val_accuracy")
        )
        for cid in fleet.clients
    }
    sent = fleet.broadcast(Message.build("train"), timeout=config.timeout or None, expect=expect)
    if screen_norms:
        sent = screen_parameters(fleet, sent)
    return successful(sent, minimum=min(config.min_clients, len(fleet.clients)), what="local models")


def teachers_from_cache(replies: dict[int, Message]) -> float:
    """How many of the replying sites loaded their stage-1 model from the cache (`stage1_cached`)."""
    return float(sum(float(r.scalar("metrics", "stage1_cached", 0.0)) for r in replies.values()))
