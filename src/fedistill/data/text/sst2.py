"""SST-2 (Socher et al. 2013, as GLUE distributes it): sentence polarity, 67,349 training sentences.

GLUE's TSV files: `train.tsv` and `dev.tsv`, a header `sentence<TAB>label` and one sentence a line with
label 0 (negative) or 1 (positive). GLUE's test split has no labels, so `dev.tsv` (872 sentences) is
the test set here, as in FedDF's experiments; a validation split is held out of `train.tsv`
(`val_fraction`; the paper holds out 1%). Files are UTF-8, with or without a byte-order mark.
"""

from __future__ import annotations

from pathlib import Path

from fedistill.data.base import LoadedDataset
from fedistill.data.text.tokens import read_text_file, require_files, text_dataset, tokenizer_line
from fedistill.errors import DataError

CLASSES = ("negative", "positive")
FILES = ("train.tsv", "dev.tsv")
DEFAULT_MAX_LENGTH = 128  # the released FedDF NLP code's --max_seq_len (SST-2's sentences are shorter)


def read_sst2(path: Path) -> tuple[list[str], list[int]]:
    """(sentences, labels 0/1) of one GLUE SST-2 TSV file."""
    # lines end at "\n" only: str.splitlines would also cut a sentence at U+2028, U+0085 or a form feed
    lines = [line.removesuffix("\r") for line in read_text_file(path).split("\n")]
    if not any(line.strip() for line in lines):
        raise DataError(f"{path} is empty: expected a header sentence<TAB>label, then one sentence a line")
    header = lines[0].split("\t")
    if "sentence" not in header or "label" not in header:
        # a sentence column without labels is GLUE's test split (index<TAB>sentence)
        unlabelled = (
            " (GLUE's test split has no labels: use dev.tsv as the test set)" if "sentence" in header else ""
        )
        raise DataError(
            f"{path}: expected a header with columns sentence and label, got {header}{unlabelled}"
        )
    at_sentence, at_label = header.index("sentence"), header.index("label")
    texts, labels = [], []
    for line, text in enumerate(lines[1:], start=2):
        if not text.strip():
            continue
        row = text.split("\t")
        if len(row) != len(header):
            raise DataError(f"{path}:{line}: expected {len(header)} tab-separated fields, got {len(row)}")
        if row[at_label].strip() not in ("0", "1"):
            raise DataError(f"{path}:{line}: the label must be 0 or 1, got {row[at_label]!r}")
        texts.append(row[at_sentence].strip())
        labels.append(int(row[at_label]))
    if not texts:
        raise DataError(f"{path} holds no sentences")
    return texts, labels


def describe_sst2(folder: str) -> str:
    """Where to put GLUE's SST-2 files, and which tokenizer encodes them."""
    return (
        f"SST-2: put GLUE's SST-2 files in {folder}/ (header sentence<TAB>label, label 0 or 1):\n"
        f"  {folder}/train.tsv  67,349 sentences\n"
        f"  {folder}/dev.tsv    872 sentences, the test set (GLUE's test.tsv has no labels)\n"
        + tokenizer_line("sst2")
    )


def load_sst2(
    folder: Path,
    *,
    model_dir: str = "",
    max_length: int = DEFAULT_MAX_LENGTH,
    max_train_samples: int = 0,
    max_test_samples: int = 0,
) -> LoadedDataset:
    """SST-2's sentiment sentences encoded to token ids, GLUE's dev set as the test set; the sample caps keep
    small runs small (0: all)."""
    train, test = require_files(folder, FILES, describe_sst2(str(folder)))
    return text_dataset(
        "sst2",
        {"train": read_sst2(train), "test": read_sst2(test)},
        CLASSES,
        model_dir=model_dir,
        max_length=max_length,
        max_train_samples=max_train_samples,
        max_test_samples=max_test_samples,
    )
