"""Text classification data: token ids (N, L) made by a local model folder's tokenizer.

  ag-news  AG News' CSV files (4 topics)          <data_dir>/ag-news/{train,test}.csv
  sst2     GLUE's SST-2 TSV files (2 polarities)  <data_dir>/sst2/{train,dev}.tsv (dev: the test set)

Options (`--set ag-news.model_dir=...`): `model_dir` the model folder whose tokenizer reads the texts
(required; the `distilbert` model reads its weights from the same folder unless told otherwise),
`max_length` (tokens per text, default 128), `max_train_samples` and `max_test_samples` (a fixed random
subset, 0 = all). Each entry is (subdir under data_dir, load(folder, **options), describe(folder), the
option names).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from fedistill.data.base import LoadedDataset
from fedistill.data.text.ag_news import describe_ag_news, load_ag_news
from fedistill.data.text.sst2 import describe_sst2, load_sst2
from fedistill.data.text.tokens import OPTIONS, encode, load_tokenizer


class Entry(NamedTuple):
    """How a text dataset is found, loaded and described, and which options it takes."""

    subdir: str
    load: Callable[..., LoadedDataset]  # (folder, **options)
    describe: Callable[[str], str]  # (folder shown to the user) -> which files go where
    options: tuple[str, ...]


ENTRIES: dict[str, Entry] = {
    "ag-news": Entry("ag-news", load_ag_news, describe_ag_news, OPTIONS),
    "sst2": Entry("sst2", load_sst2, describe_sst2, OPTIONS),
}

__all__ = ["ENTRIES", "encode", "load_ag_news", "load_sst2", "load_tokenizer"]
