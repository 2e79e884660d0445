"""Texts to token ids with the tokenizer of a local model folder, and the dataset they make.

The tokenizer is the one a Hugging Face model folder holds (`tokenizer.json` with its
`tokenizer_config.json`, or a BERT-style `vocab.txt` with `config.json`), read by
`transformers.AutoTokenizer` from that folder only: nothing is downloaded. Every text is truncated to
`max_length` tokens (special tokens included) and padded at the end with the tokenizer's padding id;
the dataset keeps the columns some text uses, so short texts (SST-2's sentences) cost no more. A special
token's string typed in a text ("[PAD]") is read as words, never as that token's id.
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedistill.data.base import DatasetInfo, ImageSet, LoadedDataset, TextInfo, is_plain_int
from fedistill.data.files import read_file
from fedistill.errors import ConfigError, DataError
from fedistill.seeding import numpy_generator

#: The options every text dataset takes.
OPTIONS = ("model_dir", "max_length", "max_train_samples", "max_test_samples")
_CHUNK = 4096  # texts tokenised per call: bounds the memory of the tokenizer's Python lists


def model_folder_text(key: str) -> str:
    """What to put in the model folder, for error messages and `describe`."""
    return (
        f"set {key}.model_dir to a local Hugging Face model folder whose tokenizer reads the texts, for "
        "example a copy of distilbert-base-uncased (tokenizer.json and tokenizer_config.json, or vocab.txt "
        "and config.json; the distilbert model also reads config.json and model.safetensors there); "
        "nothing is downloaded"
    )


def tokenizer_line(key: str) -> str:
    """The last line of a text dataset's `describe`: which tokenizer reads its texts, as the run's dataset
    and as another run's distillation source (where `{key}.model_dir` is not set)."""
    return (
        f"Texts are tokenised by a local model folder's tokenizer: {model_folder_text(key)}. As the "
        f'distillation source of a run on another text dataset (feddf.source = "dataset:{key}"), they are '
        f"read by that run's tokenizer and {key}.model_dir stays unset."
    )


def check_model_folder(model_dir: str | Path, key: str) -> Path:
    """The model folder as a Path; DataError when it is not given or not a folder."""
    if not str(model_dir).strip():
        raise DataError(f"{key} needs a tokenizer: {model_folder_text(key)}")
    folder = Path(model_dir).expanduser()
    if not folder.is_dir():
        raise DataError(f"model folder {folder} does not exist: {model_folder_text(key)}")
    return folder


def load_tokenizer(model_dir: str | Path, key: str) -> Any:
    """The tokenizer of the local model folder `model_dir` (`key` names the option in messages)."""
    folder = check_model_folder(model_dir, key)
    if not any((folder / name).is_file() for name in ("tokenizer.json", "vocab.txt")):
        found = ", ".join(sorted(p.name for p in folder.iterdir())) or "nothing"
        raise DataError(f"{folder} holds no tokenizer (found: {found}); {model_folder_text(key)}")
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    except (OSError, ValueError, KeyError) as exc:
        raise DataError(f"cannot read the tokenizer in {folder} ({exc}); {model_folder_text(key)}") from None
    if tokenizer.pad_token_id is None:
        raise DataError(
            f"the tokenizer in {folder} has no padding token: its tokenizer_config.json must name a "
            "pad_token (distilbert-base-uncased: [PAD])"
        )
    tokenizer.padding_side = "right"  # padding at the end: batches drop the all-padding columns
    return tokenizer


def encode(tokenizer: Any, texts: Sequence[str], max_length: int) -> torch.Tensor:
    """Token ids (N, L) int64, L <= max_length the longest text's length, padded at the end."""
    pad = int(tokenizer.pad_token_id)
    chunks = [
        tokenizer(
            list(texts[start : start + _CHUNK]),
            padding="max_length",
            truncation=True,
            max_length=max_length,
            split_special_tokens=True,  # "[PAD]" typed in a text is words, not a padding id that is masked
            return_tensors="np",
            return_attention_mask=False,
            return_token_type_ids=False,
        )["input_ids"].astype(np.int64)
        for start in range(0, len(texts), _CHUNK)
    ]
    ids = np.concatenate(chunks) if chunks else np.full((0, 1), pad, dtype=np.int64)
    used = np.flatnonzero((ids != pad).any(0))
    return torch.from_numpy(np.ascontiguousarray(ids[:, : int(used.max()) + 1 if used.size else 1]))


def subsample(count: int, keep: int, name: str, split: str) -> np.ndarray:
    """Indices of a fixed random subset of `keep` of `count` samples (all when keep <= 0), in order.
    Fixed, not drawn from the run seed: every run on the dataset sees the same texts."""
    if keep <= 0 or keep >= count:
        return np.arange(count)
    return np.sort(numpy_generator(0, name, "subsample", split).choice(count, size=keep, replace=False))


def text_dataset(
    name: str,
    splits: dict[str, tuple[list[str], list[int]]],
    class_names: tuple[str, ...],
    *,
    model_dir: str | Path,
    max_length: int,
    max_train_samples: int,
    max_test_samples: int,
) -> LoadedDataset:
    """The LoadedDataset of a text classification set: `splits` holds "train" and "test" as (texts,
    class indices from 0); the subsets are taken before tokenising."""
    if not is_plain_int(max_length) or max_length < 3:
        raise ConfigError(
            f"{name}.max_length must be an integer >= 3 (special tokens included), got {max_length!r}"
        )
    for key, value in (("max_train_samples", max_train_samples), ("max_test_samples", max_test_samples)):
        if not is_plain_int(value) or value < 0:
            raise ConfigError(f"{name}.{key} must be an integer >= 0 (0: every sample), got {value!r}")
    tokenizer = load_tokenizer(model_dir, name)
    sets = {}
    for split, keep in (("train", max_train_samples), ("test", max_test_samples)):
        texts, labels = splits[split]
        index = subsample(len(texts), keep, name, split)
        ids = encode(tokenizer, [texts[i] for i in index], max_length)
        sets[split] = ImageSet(ids, torch.as_tensor(np.asarray(labels, dtype=np.int64)[index]))
    text = TextInfo(
        # absolute: the model file records it, and is loaded from wherever the user then stands
        tokenizer=str(Path(model_dir).expanduser().resolve()),
        vocab_size=len(tokenizer),
        pad_id=int(tokenizer.pad_token_id),
        max_length=max_length,
    )
    info = DatasetInfo(
        name=name,
        channels=1,
        image_size=max_length,
        num_classes=len(class_names),
        mean=(0.0,),
        std=(1.0,),
        class_names=class_names,
        task="text-classification",
        text=text,
    )
    return LoadedDataset(info, sets["train"], sets["test"])


def read_text_file(path: Path) -> str:
    """A dataset file's text, UTF-8 with a byte-order mark dropped (editors on Windows add one, and it
    would glue itself to the first field); DataError naming the file and line when it is not UTF-8."""
    data = read_file(path).removeprefix(codecs.BOM_UTF8)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise DataError(
            f"{path}:{line}: the file is not UTF-8 text (byte 0x{data[exc.start]:02x} is not UTF-8); "
            "save it as UTF-8"
        ) from None


def require_files(folder: Path, names: Sequence[str], describe: str) -> list[Path]:
    """The dataset's files in `folder`; DataError naming the missing ones, with `describe`."""
    missing = [str(folder / n) for n in names if not (folder / n).is_file()]
    if missing:
        raise DataError(f"missing dataset files {', '.join(missing)}.\n{describe}")
    return [folder / n for n in names]
