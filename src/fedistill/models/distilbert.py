"""DistilBERT (Sanh et al. 2019) as a sequence classifier of token ids, from Hugging Face transformers.

Built one of two ways (`[model_options]`):

- from a local model folder, `model_dir` (default: the folder whose tokenizer made the dataset's token
  ids): `DistilBertForSequenceClassification.from_pretrained` on that folder alone, never the hub. A
  plain pretrained checkpoint such as distilbert-base-uncased has no classification head; its head is
  initialised from the run seed, as every model here, so all sites and the server start identical. So
  is the final Linear of a folder fine-tuned for another number of classes.
- a randomly initialised DistilBERT when any size is given (`dim`, `n_layers`, `n_heads`,
  `hidden_dim`; the others then take distilbert-base's 768, 6, 12 and 4 x dim); `vocab_size` defaults to
  the tokenizer's.

The model is a `Classifier`: `extractor` runs the transformer on token ids (attention mask: ids differing
from the tokenizer's padding id) and returns the first token's pre-classifier features (Linear, ReLU,
dropout), `classifier` is the final Linear: transformers' forward step for step, so `forward(ids)` gives
its logits. The state dict is plain, unshared tensors (sequence classification ties no weights), which
FedAvg averages and safetensors checkpoints hold exactly. Attention is transformers' eager
implementation (matmul, softmax), the same arithmetic on any CPU.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import nn

from fedistill.data.base import DatasetInfo, TextInfo
from fedistill.errors import ConfigError, DataError
from fedistill.models.base import Classifier

BASE_SIZES = {"dim": 768, "n_layers": 6, "n_heads": 12}  # distilbert-base
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")
#: The exported files' entry holding the transformers config (`DistilBertClassifier.export_metadata`).
RECORD_KEY = "distilbert_config"
_REPORTED: set[str] = set()  # folders whose loading report (e.g. the new head's weights) was shown


class DistilBertFeatures(nn.Module):
    """Token ids (B, L) -> the first token's pre-classifier features (B, dim)."""

    def __init__(self, hf: nn.Module, pad_id: int) -> None:
        super().__init__()
        self.distilbert = hf.distilbert
        self.pre_classifier = hf.pre_classifier
        self.dropout = hf.dropout
        self.pad_id = int(pad_id)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        mask = (ids != self.pad_id).long()
        hidden = self.distilbert(input_ids=ids, attention_mask=mask, return_dict=True).last_hidden_state
        return self.dropout(torch.relu(self.pre_classifier(hidden[:, 0])))


def distilbert(
    info: DatasetInfo,
    norm: str,
    groups: int,
    *,
    model_dir: str = "",
    vocab_size: int = 0,
    dim: int = 0,
    n_layers: int = 0,
    n_heads: int = 0,
    hidden_dim: int = 0,
) -> Classifier:
    """DistilBERT classifying token ids, loaded from a local model folder (`model_dir`), or a random one
    of the given sizes; its extractor ends at the first token's pre-classifier features."""
    text = _text_of(info)
    sizes = {
        "vocab_size": vocab_size,
        "dim": dim,
        "n_layers": n_layers,
        "n_heads": n_heads,
        "hidden_dim": hidden_dim,
    }
    for key, value in sizes.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ConfigError(f"distilbert option {key} must be an integer >= 0 (0: unset), got {value!r}")
    random = any((dim, n_layers, n_heads, hidden_dim))
    if random and model_dir:
        raise ConfigError(
            "distilbert takes a model_dir (pretrained) or sizes (dim, n_layers, n_heads, hidden_dim: a "
            "random model), not both"
        )
    if random:
        hf = _random(info, text, vocab_size, dim, n_layers, n_heads, hidden_dim)
    else:
        hf = _pretrained(info, text, model_dir or text.tokenizer, vocab_size)
    return _classifier(info, text, hf)


class DistilBertClassifier(Classifier):
    """A DistilBERT `Classifier` that records its transformers config in the files a run exports, so that
    a trained model is rebuilt (`from_record`) where the folder it started from does not exist."""

    def export_metadata(self) -> dict[str, str]:
        return {RECORD_KEY: self.extractor.distilbert.config.to_json_string()}


def from_record(info: DatasetInfo, record: str) -> Classifier:
    """The architecture an exported file's `RECORD_KEY` entry describes, with fresh weights for the file's
    own to replace: no model folder is read."""
    from transformers import DistilBertConfig, DistilBertForSequenceClassification

    text = _text_of(info)
    try:
        config = DistilBertConfig.from_dict(json.loads(record))
    except (ValueError, TypeError) as exc:
        raise DataError(f"distilbert: the recorded architecture cannot be read ({exc})") from None
    config._attn_implementation = "eager"
    return _classifier(info, text, DistilBertForSequenceClassification(config))


def _classifier(info: DatasetInfo, text: TextInfo, hf: nn.Module) -> Classifier:
    """Checks the transformer fits the token ids (vocabulary, length) and wraps it as a Classifier."""
    config = hf.config
    if config.vocab_size < text.vocab_size:
        raise ConfigError(
            f"the tokenizer of {text.tokenizer} has {text.vocab_size} tokens but the distilbert model embeds "
            f"only {config.vocab_size}: use the tokenizer of the model's own folder"
        )
    if config.max_position_embeddings < text.max_length:
        raise ConfigError(
            f"{info.name}.max_length = {text.max_length} exceeds the model's "
            f"{config.max_position_embeddings} positions: lower max_length"
        )
    return DistilBertClassifier(
        DistilBertFeatures(hf, text.pad_id),
        hf.classifier,
        feature_dim=config.dim,
        num_classes=info.num_classes,
    )


def _text_of(info: DatasetInfo) -> TextInfo:
    if info.text is None:
        raise ConfigError(f"distilbert reads token ids, and dataset {info.name!r} is not a text dataset")
    return info.text


def _random(
    info: DatasetInfo, text: TextInfo, vocab_size: int, dim: int, n_layers: int, n_heads: int, hidden_dim: int
) -> nn.Module:
    from transformers import DistilBertConfig, DistilBertForSequenceClassification

    dim = dim or BASE_SIZES["dim"]
    n_layers, n_heads = n_layers or BASE_SIZES["n_layers"], n_heads or BASE_SIZES["n_heads"]
    if dim % n_heads:
        raise ConfigError(f"distilbert: dim = {dim} must be a multiple of n_heads = {n_heads}")
    config = DistilBertConfig(
        vocab_size=vocab_size or text.vocab_size,
        dim=dim,
        n_layers=n_layers,
        n_heads=n_heads,
        hidden_dim=hidden_dim or 4 * dim,
        max_position_embeddings=max(512, text.max_length),
        pad_token_id=text.pad_id,
        num_labels=info.num_classes,
    )
    config._attn_implementation = "eager"
    return DistilBertForSequenceClassification(config)


def _pretrained(info: DatasetInfo, text: TextInfo, model_dir: str, vocab_size: int) -> nn.Module:
    folder = Path(model_dir).expanduser()
    what = (
        "put a Hugging Face DistilBERT folder there (config.json and model.safetensors, e.g. a copy of "
        "distilbert-base-uncased) and name it with [model_options] model_dir, or give sizes (dim, "
        "n_layers, ...) for a random model; nothing is downloaded"
    )
    if not folder.is_dir():
        raise DataError(f"distilbert: model folder {folder} does not exist: {what}")
    missing = [name for name in ("config.json",) if not (folder / name).is_file()]
    if missing or not any((folder / name).is_file() for name in WEIGHT_FILES):
        raise DataError(f"distilbert: {folder} holds no model (config.json and model.safetensors): {what}")
    if vocab_size:
        raise ConfigError("distilbert: vocab_size sizes a random model; a model folder has its own")
    from transformers import AutoConfig, DistilBertForSequenceClassification

    try:
        config = AutoConfig.from_pretrained(str(folder), local_files_only=True)
        if config.model_type != "distilbert":
            raise ConfigError(f"{folder} holds a {config.model_type!r} model, not a DistilBERT one")
        # A folder fine-tuned for another number of classes (SST-2's 2 for AG News's 4): its head cannot
        # serve, so it is replaced by a new one, initialised like a plain checkpoint's missing head.
        other_head = config.num_labels != info.num_classes
        config.num_labels = info.num_classes
        with _quiet_loading(report=str(folder.resolve()) not in _REPORTED):
            model = DistilBertForSequenceClassification.from_pretrained(
                str(folder),
                config=config,
                local_files_only=True,
                attn_implementation="eager",
                dtype=torch.float32,
                ignore_mismatched_sizes=other_head,
            )
    except (OSError, ValueError, RuntimeError) as exc:
        raise DataError(f"distilbert: cannot load the model in {folder} ({exc})") from None
    _REPORTED.add(str(folder.resolve()))
    model.train()  # from_pretrained returns eval mode; every other model starts in train mode
    return model


@contextmanager
def _quiet_loading(*, report: bool) -> Iterator[Any]:
    """transformers' progress bar off while a site's copy loads, and its loading report (which weights
    are new) only with `report`: once per folder, not once per site."""
    from transformers.utils import logging

    shown, verbosity = logging.is_progress_bar_enabled(), logging.get_verbosity()
    logging.disable_progress_bar()
    if not report:
        logging.set_verbosity_error()
    try:
        yield
    finally:
        logging.set_verbosity(verbosity)
        if shown:
            logging.enable_progress_bar()
