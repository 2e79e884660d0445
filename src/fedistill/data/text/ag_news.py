"""AG News (Zhang et al. 2015): 4 news topics, 120,000 training and 7,600 test articles.

The CSV files of the original release, as torchtext distributes them: `train.csv` and `test.csv`, one
article a row, `"class index","title","description"` with class index 1-4 (World, Sports, Business,
Sci/Tech) and no header (a header row of column names, as some copies have, is skipped, and so are blank
lines). The text is the title and the description joined by a space, the release's backslashes (its line
breaks) turned into spaces. Files are UTF-8, with or without a byte-order mark. A file that ends inside a
quoted field, as a copy cut short mostly does, is refused.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Iterator
from pathlib import Path

from fedistill.data.base import LoadedDataset
from fedistill.data.text.tokens import read_text_file, require_files, text_dataset, tokenizer_line
from fedistill.errors import DataError

CLASSES = ("World", "Sports", "Business", "Sci/Tech")
FILES = ("train.csv", "test.csv")
DEFAULT_MAX_LENGTH = 128  # the released FedDF NLP code's --max_seq_len
_COLUMN_NAME = re.compile(r"[A-Za-z][A-Za-z0-9 _.-]{0,39}")  # "Class Index", "Title", "Description"


def read_ag_news(path: Path) -> tuple[list[str], list[int]]:
    """(texts, class indices 0-3) of one AG News CSV file; blank lines are skipped."""
    texts, labels = [], []
    for line, row in _rows(read_text_file(path), path):
        if not "".join(row).strip() and len(row) <= 1:
            continue  # a blank line (one at the end, as some copies have)
        if line == 1 and all(_COLUMN_NAME.fullmatch(field.strip()) for field in row):
            continue  # a header row: column names, never an article (whose class index is a number)
        if len(row) != 3:
            raise DataError(
                f"{path}:{line}: expected 3 fields (class index, title, description), got {len(row)}"
            )
        label = row[0].strip()
        if label not in ("1", "2", "3", "4"):
            raise DataError(f"{path}:{line}: the class index must be 1-4, got {row[0]!r}")
        texts.append(" ".join(part.replace("\\", " ").strip() for part in row[1:]))
        labels.append(int(label) - 1)
    if not texts:
        raise DataError(f"{path} holds no articles")
    return texts, labels


def _rows(text: str, path: Path) -> Iterator[tuple[int, list[str]]]:
    """Each CSV row with the file line it starts on (a quoted field may hold line breaks); DataError when the
    file ends inside a quoted field, as a copy cut short mostly does (the release quotes every field)."""
    rows = csv.reader(io.StringIO(text, newline=""))
    end = 0  # the file line the previous row ended on
    for row in rows:
        yield end + 1, row
        start, end = end + 1, rows.line_num
    if end and _ends_inside_quotes(text, start):
        raise DataError(f"{path}:{start}: the file ends inside a quoted field; is it cut short? Replace it")


def _ends_inside_quotes(text: str, line: int) -> bool:
    """Whether the row that starts on `line`, the last, runs to the end of `text` inside a quoted field (the
    lenient reader takes the rest as the field; the strict one says so)."""
    tail = "".join(io.StringIO(text, newline="").readlines()[line - 1 :])
    try:
        for _ in csv.reader(io.StringIO(tail, newline=""), strict=True):
            pass
    except csv.Error as e:
        return "unexpected end of data" in str(e)
    return False


def describe_ag_news(folder: str) -> str:
    """Where to put AG News's CSV files, and which tokenizer encodes them."""
    return (
        f"AG News: put the CSV files of the original release (as torchtext distributes them) in {folder}/:\n"
        f'  {folder}/train.csv  120,000 rows "class index","title","description" (class index 1-4)\n'
        f"  {folder}/test.csv   7,600 rows, the same columns\n" + tokenizer_line("ag-news")
    )


def load_ag_news(
    folder: Path,
    *,
    model_dir: str = "",
    max_length: int = DEFAULT_MAX_LENGTH,
    max_train_samples: int = 0,
    max_test_samples: int = 0,
) -> LoadedDataset:
    """AG News's four topics, its texts encoded to token ids by the local tokenizer; the sample caps keep
    small runs small (0: all)."""
    train, test = require_files(folder, FILES, describe_ag_news(str(folder)))
    return text_dataset(
        "ag-news",
        {"train": read_ag_news(train), "test": read_ag_news(test)},
        CLASSES,
        model_dir=model_dir,
        max_length=max_length,
        max_train_samples=max_train_samples,
        max_test_samples=max_test_samples,
    )
