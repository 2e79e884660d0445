"""Text: AG News and SST-2 loaders on small files written here, a tokenizer built here, a tiny random
DistilBERT, and FedAvg and FedDF fine-tuning it end to end (ledger, the held-out distillation texts,
exact resume, clear errors)."""

from __future__ import annotations

import csv
import dataclasses
import json
import logging
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from algorithm_helpers import check_resume_after_crash
from fedistill.algorithms.feddf.feddf import FedDFServer
from fedistill.algorithms.shared import distillation_data as dd
from fedistill.cli import main
from fedistill.config import RunConfig, build_config, read_config
from fedistill.data.base import DatasetInfo, TextInfo
from fedistill.data.registry import describe_files, load_dataset
from fedistill.data.text.ag_news import read_ag_news
from fedistill.data.text.sst2 import read_sst2
from fedistill.data.text.tokens import encode, load_tokenizer
from fedistill.engine.checkpoint import latest_checkpoint, read_checkpoint, save_model
from fedistill.engine.launch import run_suite, start_suite
from fedistill.engine.rundir import read_jsonl
from fedistill.engine.setup import canonical_dataset, validate_setup
from fedistill.errors import ConfigError, DataError
from fedistill.federation.ledger import DOWN, UP, read_ledger
from fedistill.models import build_model, count_parameters
from fedistill.seeding import seeded
from fedistill.tasks import TextClassification, make_task

TOPICS = [
    ["war", "election", "minister", "treaty"],
    ["match", "goal", "coach", "league"],
    ["stocks", "market", "profit", "bank"],
    ["software", "chip", "science", "space"],
]
MOODS = [["dull", "awful", "boring"], ["great", "moving", "funny"]]
FILLER = ["the", "a", "of", "new", "report", "today", "says", "after", "big", "week", "film", "story"]
SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]"]
WORDS = SPECIAL + FILLER + [w for topic in TOPICS for w in topic] + [w for mood in MOODS for w in mood]
TINY = {"dim": 16, "n_layers": 1, "n_heads": 2, "hidden_dim": 32}


def _save_tokenizer(folder: Path) -> None:
    """A WordLevel tokenizer in the layout transformers.AutoTokenizer reads (tokenizer.json and
    tokenizer_config.json), adding [CLS] ... [SEP] as BERT's does."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.Lowercase()
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, pad_token="[PAD]", unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]"
    )
    fast.save_pretrained(str(folder))


def _text(rng: np.random.Generator, keys: list[str], fill: int) -> str:
    return " ".join(rng.choice(keys, 2).tolist() + rng.choice(FILLER, fill).tolist())


def _write_ag_news(path: Path, rows: int, rng: np.random.Generator, header: bool = False) -> None:
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f, quoting=csv.QUOTE_ALL)
        if header:
            writer.writerow(["Class Index", "Title", "Description"])
        for _ in range(rows):
            c = int(rng.integers(4))
            writer.writerow([c + 1, _text(rng, TOPICS[c], 1), _text(rng, TOPICS[c], int(rng.integers(1, 8)))])


def _write_sst2(path: Path, rows: int, rng: np.random.Generator) -> None:
    lines = ["sentence\tlabel"]
    for _ in range(rows):
        c = int(rng.integers(2))
        lines.append(f"{_text(rng, MOODS[c], int(rng.integers(0, 5)))}\t{c}")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    """data_dir with ag-news/ and sst2/, and model/ holding the tokenizer."""
    root = tmp_path_factory.mktemp("text")
    rng = np.random.default_rng(0)
    _save_tokenizer(root / "model")
    (root / "ag-news").mkdir()
    _write_ag_news(root / "ag-news" / "train.csv", 400, rng)
    _write_ag_news(root / "ag-news" / "test.csv", 60, rng)
    (root / "sst2").mkdir()
    _write_sst2(root / "sst2" / "train.tsv", 50, rng)
    _write_sst2(root / "sst2" / "dev.tsv", 20, rng)
    return root


def _ag_news(root: Path, **options):
    return load_dataset("ag-news", root, model_dir=str(root / "model"), **options)


# --- data --------------------------------------------------------------------------------------------
def test_ag_news_reads_the_csv_files_into_padded_token_ids(root, tmp_path):
    data = _ag_news(root, max_length=12)
    info = data.info
    assert info.task == "text-classification" and info.num_classes == 4 and info.class_names[3] == "Sci/Tech"
    assert info.text is not None and info.text.pad_id == 0 and info.text.vocab_size == len(WORDS)
    assert len(data.train) == 400 and len(data.test) == 60 and data.train.tokens
    x = data.train.x
    assert x.dtype == torch.int64 and x.shape[1] <= 12 and bool((x[:, 0] == 2).all())  # [CLS] first
    rows = list(csv.reader((root / "ag-news" / "train.csv").open()))
    assert data.train.y.tolist() == [int(r[0]) - 1 for r in rows]
    padded = x == 0
    assert bool((padded[:, :-1] <= padded[:, 1:]).all())  # padding only at the end
    # a header row is skipped, backslashes (the release's line breaks) become spaces
    folder = tmp_path / "ag-news"
    folder.mkdir()
    _write_ag_news(folder / "train.csv", 5, np.random.default_rng(1), header=True)
    (folder / "test.csv").write_text('"3","stocks\\market","profit"\n', encoding="utf-8")
    other = load_dataset("ag-news", tmp_path, model_dir=str(root / "model"))
    assert len(other.train) == 5 and other.test.y.tolist() == [2]
    words = [WORDS.index(w) for w in ("stocks", "market", "profit")]
    assert other.test.x[0].tolist() == [2, *words, 3]  # [CLS] stocks market profit [SEP]


def test_special_tokens_typed_in_a_text_are_words(root):
    """A text quoting "[PAD]" or "[CLS]" must not gain padding ids (masked out) or extra special ids."""
    tokenizer = load_tokenizer(root / "model", "ag-news")
    padded, framed = encode(tokenizer, ["great [PAD] film", "a [CLS] b [SEP] c"], 16).tolist()
    great, film, unk = (WORDS.index(word) for word in ("great", "film", "[UNK]"))
    assert padded == [2, great, unk, unk, unk, film, 3, 0, 0, 0, 0]  # "[", "pad", "]": unknown words
    assert framed.count(2) == 1 and framed.count(3) == 1  # the tokenizer's own [CLS] and [SEP] only


def test_max_samples_take_a_fixed_subset_and_max_length_truncates(root):
    small = _ag_news(root, max_train_samples=50, max_test_samples=10, max_length=5)
    again = _ag_news(root, max_train_samples=50, max_test_samples=10, max_length=5)
    assert len(small.train) == 50 and len(small.test) == 10 and small.train.x.shape[1] == 5
    assert torch.equal(small.train.x, again.train.x) and torch.equal(small.train.y, again.train.y)
    assert bool((small.train.x[:, -1] == 3).all())  # truncated texts still end with [SEP]


def test_sst2_reads_glue_tsv_and_dev_is_the_test_set(root, tmp_path):
    data = load_dataset("sst-2", root, model_dir=str(root / "model"))
    assert data.info.name == "sst2" and data.info.class_names == ("negative", "positive")
    assert len(data.train) == 50 and len(data.test) == 20 and set(data.test.y.tolist()) <= {0, 1}
    assert "GLUE's test.tsv has no labels" in describe_files("sst2", tmp_path)
    folder = tmp_path / "sst2"
    folder.mkdir()
    (folder / "train.tsv").write_text("index\tsentence\n0\tgreat film\n", encoding="utf-8")
    (folder / "dev.tsv").write_text("sentence\tlabel\ngreat film\t1\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"train\.tsv.*sentence and label.*no labels"):
        load_dataset("sst2", tmp_path, model_dir=str(root / "model"))
    (folder / "train.tsv").write_text("sentence\tlabel\ngreat film\t7\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"train\.tsv:2: the label must be 0 or 1"):
        load_dataset("sst2", tmp_path, model_dir=str(root / "model"))


def test_loaders_read_what_editors_write_and_name_a_file_that_is_not_utf8(tmp_path):
    """A byte-order mark, blank lines and Unicode line separators inside a sentence lose no sample and
    split none; a file in another encoding is one clear error, not a decoding traceback."""
    ag, sst = tmp_path / "ag.csv", tmp_path / "sst.tsv"
    ag.write_text('\ufeff"3","stocks","profit"\n\n"1","war","treaty"\n\n', encoding="utf-8")
    assert read_ag_news(ag) == (["stocks profit", "war treaty"], [2, 0])
    ag.write_text("\ufeff3,stocks,profit\r\n", encoding="utf-8")
    assert read_ag_news(ag) == (["stocks profit"], [2])
    ag.write_text("\ufeffClass Index,Title,Description\n3,stocks,profit\n", encoding="utf-8")
    assert read_ag_news(ag) == (["stocks profit"], [2])
    sentences = ["great\u2028film", "awful \x85 dull\x0bfilm", "a\x0c\x1c\x1d\x1eboring film"]
    rows = "".join(f"{text}\t{label}\r\n" for text, label in zip(sentences, (1, 0, 0), strict=True))
    sst.write_text(f"\ufeffsentence\tlabel\r\n{rows}\n", encoding="utf-8")
    assert read_sst2(sst) == (sentences, [1, 0, 0])
    ag.write_bytes(b'"3","caf\xe9","profit"\n')  # Latin-1
    with pytest.raises(DataError, match=r"ag\.csv:1: the file is not UTF-8 text \(byte 0xe9"):
        read_ag_news(ag)
    sst.write_bytes(b"sentence\tlabel\ncaf\xe9\t1\n")
    with pytest.raises(DataError, match=r"sst\.tsv:2: the file is not UTF-8 text \(byte 0xe9"):
        read_sst2(sst)


def test_ag_news_errors_name_the_file_line_after_a_quoted_line_break(tmp_path):
    """A quoted field may hold line breaks; an error names the line the faulty row starts on in the file,
    not the row's number among the rows."""
    ag = tmp_path / "ag.csv"
    ag.write_text('"3","stocks","profit\nand\nloss"\n"5","war","treaty"\n', encoding="utf-8")
    with pytest.raises(DataError, match=r"ag\.csv:4: the class index must be 1-4"):
        read_ag_news(ag)
    ag.write_text('"3","stocks","profit\nand loss"\n\n"1","war"\n', encoding="utf-8")
    with pytest.raises(DataError, match=r"ag\.csv:4: expected 3 fields"):
        read_ag_news(ag)


def test_an_ag_news_file_cut_short_inside_a_quoted_field_is_a_data_error(tmp_path):
    """The release quotes every field, so a copy cut short mostly ends inside a quote: its last article was
    read, shortened, as a whole one."""
    ag = tmp_path / "ag.csv"
    ag.write_text('"3","stocks","profit"\n"1","war","trea', encoding="utf-8")
    with pytest.raises(DataError, match=r"ag\.csv:2: the file ends inside a quoted field"):
        read_ag_news(ag)
    ag.write_text('"3","stocks","profit\nand loss"\n"1","war","treaty\nand peace', encoding="utf-8")
    with pytest.raises(DataError, match=r"ag\.csv:3: the file ends inside a quoted field"):
        read_ag_news(ag)
    ag.write_text('"3","stocks","profit"\n"1","war","treaty"', encoding="utf-8")  # no final line break
    assert read_ag_news(ag) == (["stocks profit", "war treaty"], [2, 0])


def test_an_empty_sst2_file_is_called_empty(tmp_path):
    """An empty file (a copy cut short) is no sign of GLUE's unlabelled test split."""
    sst = tmp_path / "dev.tsv"
    for content in ("", "\n", "\ufeff"):
        sst.write_text(content, encoding="utf-8")
        with pytest.raises(DataError) as e:
            read_sst2(sst)
        assert "dev.tsv is empty" in str(e.value) and "no labels" not in str(e.value)


def test_missing_files_and_model_folders_are_clear_errors(root, tmp_path):
    with pytest.raises(DataError, match=r"(?s)missing dataset files .*ag-news/train\.csv.*class index 1-4"):
        load_dataset("ag-news", tmp_path, model_dir=str(root / "model"))
    with pytest.raises(DataError, match=r"ag-news needs a tokenizer: set ag-news\.model_dir"):
        load_dataset("ag-news", root)
    with pytest.raises(DataError, match=rf"model folder {tmp_path / 'nowhere'} does not exist"):
        load_dataset("ag-news", root, model_dir=str(tmp_path / "nowhere"))
    with pytest.raises(DataError, match=r"holds no tokenizer \(found: nothing\)"):
        load_dataset("ag-news", root, model_dir=str(tmp_path))
    with pytest.raises(ConfigError, match="max_length"):
        load_dataset("ag-news", root, model_dir=str(root / "model"), max_length=1)


def test_text_batches_cut_padding_and_carry_dropout_seeds(root):
    data = _ag_news(root)
    task = make_task(data.info)
    assert isinstance(task, TextClassification) and not task.usual_augment(data.info)
    train = task.batches(data.train, data.info, 8, shuffle=True, generator=torch.Generator(), augment=False)
    (ids, seed), _ = next(train)
    assert ids.shape[0] == 8 and bool((ids[:, -1] != 0).any()) and seed.dtype == torch.int64
    ids, _ = next(task.batches(data.train, data.info, 8, shuffle=False, generator=None, augment=False))
    assert torch.equal(ids, data.train.x[:8, : ids.shape[1]])
    with pytest.raises(ConfigError, match="no augmentation"):
        task.batches(data.train, data.info, 8, shuffle=False, generator=None, augment=True)


# --- the model ---------------------------------------------------------------------------------------
def test_distilbert_is_transformers_forward_with_a_plain_state_dict(root, tmp_path):
    from transformers import DistilBertForSequenceClassification

    info = _ag_news(root).info
    model = seeded(0, lambda: build_model("distilbert", info, options=TINY)).eval()
    state = model.state_dict()
    assert all(k.startswith(("extractor.", "classifier.")) for k in state)
    assert len({t.data_ptr() for t in state.values()}) == len(state)  # nothing tied or shared
    hf = DistilBertForSequenceClassification(model.extractor.distilbert.config).eval()
    hf.load_state_dict(
        {k.split(".", 1)[1]: v for k, v in state.items() if k.startswith("extractor.")}, strict=False
    )
    hf.classifier.load_state_dict(model.classifier.state_dict())
    ids = torch.tensor([[2, 20, 21, 5, 3, 0, 0], [2, 24, 3, 0, 0, 0, 0]])
    want = hf(input_ids=ids, attention_mask=(ids != 0).long()).logits
    assert torch.allclose(model(ids), want, atol=1e-6)
    assert torch.allclose(model(ids[:, :5]), model(ids), atol=1e-5)  # padding changes nothing
    save_model(model, tmp_path / "m.safetensors")
    assert all(torch.equal(load_file(tmp_path / "m.safetensors")[k], v) for k, v in state.items())


def test_distilbert_at_base_sizes_has_distilbert_base_parameter_count():
    """distilbert-base-uncased (30,522 tokens, 512 positions) with a 2-class classification head has
    66,955,010 parameters (transformers' DistilBertForSequenceClassification); built on the meta device."""
    text = TextInfo("tokenizer", 30_522, 0, 128)
    info = DatasetInfo("sst2", 1, 128, 2, (0.0,), (1.0,), task="text-classification", text=text)
    with torch.device("meta"):
        model = build_model("distilbert", info, options={"dim": 768})
    assert count_parameters(model) == 66_955_010


def test_distilbert_loads_a_pretrained_folder_and_refuses_a_missing_one(root, tmp_path):
    from transformers import DistilBertConfig, DistilBertModel

    info = _ag_news(root).info
    folder = tmp_path / "pretrained"
    config = DistilBertConfig(vocab_size=40, dim=16, n_layers=1, n_heads=2, hidden_dim=32)
    body = seeded(1, lambda: DistilBertModel(config))
    body.save_pretrained(str(folder))  # a checkpoint without a classification head, as distilbert-base
    build = lambda: build_model("distilbert", info, options={"model_dir": str(folder)})  # noqa: E731
    model, again = seeded(0, build), seeded(0, build)
    assert model.training and model.num_classes == 4
    for key, value in body.state_dict().items():
        assert torch.equal(model.state_dict()[f"extractor.distilbert.{key}"], value)
    assert all(torch.equal(v, again.state_dict()[k]) for k, v in model.state_dict().items())  # head: seeded
    with pytest.raises(DataError, match=rf"model folder {tmp_path / 'none'} does not exist"):
        build_model("distilbert", info, options={"model_dir": str(tmp_path / "none")})
    with pytest.raises(DataError, match=r"holds no model \(config\.json and model\.safetensors\)"):
        build_model("distilbert", info)  # the default: the tokenizer's folder, which has no weights
    with pytest.raises(ConfigError, match="not both"):
        build_model("distilbert", info, options={"model_dir": str(folder), "dim": 8})
    with pytest.raises(ConfigError, match="embeds only 10"):
        build_model("distilbert", info, options={**TINY, "vocab_size": 10})


def test_a_folder_fine_tuned_for_another_class_count_gets_a_new_seeded_head(root, tmp_path):
    """A folder fine-tuned on SST-2's 2 classes serves AG News's 4: its body loads, the head is new."""
    from transformers import DistilBertConfig, DistilBertForSequenceClassification

    info = _ag_news(root).info
    folder = tmp_path / "sst2-fine-tuned"
    config = DistilBertConfig(vocab_size=40, dim=16, n_layers=1, n_heads=2, hidden_dim=32, num_labels=2)
    tuned = seeded(1, lambda: DistilBertForSequenceClassification(config))
    tuned.save_pretrained(str(folder))
    build = lambda: build_model("distilbert", info, options={"model_dir": str(folder)})  # noqa: E731
    model, again = seeded(0, build), seeded(0, build)
    assert model.num_classes == 4 and model.classifier.weight.shape == (4, 16)
    for key, value in tuned.distilbert.state_dict().items():
        assert torch.equal(model.state_dict()[f"extractor.distilbert.{key}"], value)
    assert all(torch.equal(v, again.state_dict()[k]) for k, v in model.state_dict().items())  # head: seeded


def test_a_relative_model_folder_is_recorded_absolute(root, tmp_path, monkeypatch):
    """The model file records the tokenizer's folder, and a trained model is loaded from any directory."""
    from transformers import DistilBertConfig, DistilBertModel

    folder = tmp_path / "pretrained"
    config = DistilBertConfig(vocab_size=len(WORDS), dim=16, n_layers=1, n_heads=2, hidden_dim=32)
    seeded(1, lambda: DistilBertModel(config)).save_pretrained(str(folder))
    _save_tokenizer(folder)
    monkeypatch.chdir(tmp_path)
    info = load_dataset("sst2", root, model_dir="pretrained", max_length=16).info
    assert info.text.tokenizer == str(folder.resolve())
    monkeypatch.chdir(root)
    assert seeded(0, lambda: build_model("distilbert", info)).num_classes == 2


@pytest.mark.parametrize("norm", ["group", "batch"])
def test_distilbert_refuses_another_norm_before_a_run_writes(root, tmp_path, norm):
    """DistilBERT's LayerNorms are its architecture: a run asking for another norm is refused up front."""
    with pytest.raises(ConfigError, match=rf"'distilbert' has its own layer norm .* norm = '{norm}'"):
        start_suite(_config(root, norm=norm, out=str(tmp_path)), progress=False)
    assert not any(tmp_path.iterdir())


# --- federated fine-tuning ---------------------------------------------------------------------------
def _config(root: Path, **changes) -> RunConfig:
    settings = {
        "algorithm": "fedavg",
        "dataset": "ag-news",
        "data_dir": str(root),
        "clients": 3,
        "alpha": 1.0,
        "rounds": 3,
        "model": "distilbert",
        "optimizer": "adam",
        "lr": 0.01,
        "batch_size": 16,
        "local_epochs": 3,
        "val_fraction": 0.5,
        "ag-news": {"model_dir": str(root / "model"), "max_length": 16},
        "model_options": TINY,
        "feddf": {"source": "holdout", "holdout_val_share": 0.1, "steps": 20, "eval_every_steps": 10},
    }
    return build_config(RunConfig(), settings, changes)


@pytest.fixture(scope="module")
def suite(root, tmp_path_factory) -> tuple[Path, dict[str, dict], list[str]]:
    out = tmp_path_factory.mktemp("suite")
    handler = _Records()
    logging.getLogger("fedistill").addHandler(handler)
    logging.getLogger("fedistill").setLevel(logging.INFO)
    try:
        summaries = run_suite(_config(root, algorithm="fedavg,feddf"), out, progress=False)
    finally:
        logging.getLogger("fedistill").removeHandler(handler)
    return out, {s["algorithm"]: s for s in summaries}, handler.lines


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def test_fedavg_and_feddf_fine_tune_and_report_test_accuracy(suite):
    _, summaries, _ = suite
    for name in ("fedavg", "feddf"):
        assert summaries[name]["task"] == "text-classification"
        assert summaries[name]["headline"] == "test_accuracy"
        assert summaries[name]["test_accuracy"] > 0.4  # chance: 0.25


def test_fedavg_ledger_shows_parameters_both_ways(suite):
    out, _, _ = suite
    entries = read_ledger(out / "fedavg" / "ledger.jsonl")
    assert {e["direction"] for e in entries if "parameters" in e["kinds"]} == {DOWN, UP}
    assert all(set(e["kinds"]) <= {"parameters", "config", "metrics"} for e in entries)


def test_feddf_distils_on_the_held_out_texts(suite):
    out, _, logs = suite
    held = 200  # val_fraction 0.5 of 400 texts; 10% of them stay labelled for validation
    assert f"FedDF distils on {held - 20} unlabeled texts of the held-out split of ag-news" in logs
    rows = read_jsonl(out / "feddf" / "metrics.jsonl")
    assert all(row["distill_steps_distilbert"] >= 10 and row["teachers"] == 3 for row in rows)
    assert all(row["distill_loss_last_distilbert"] < row["distill_loss_first_distilbert"] for row in rows)


def test_a_checkpoint_and_the_exported_model_hold_the_same_tensors(suite):
    out, _, _ = suite
    run = out / "feddf"
    state = read_checkpoint(latest_checkpoint(run / "checkpoints"))["server"]["models"]["distilbert"]
    exported = load_file(run / "models" / "global.safetensors")
    assert state.keys() == exported.keys() and all(torch.equal(state[k], exported[k]) for k in state)


def test_a_resumed_feddf_run_is_exact(root, tmp_path):
    check_resume_after_crash(
        _config(root, algorithm="feddf", rounds=2, local_epochs=1), FedDFServer, tmp_path, 2
    )


def test_feddf_refuses_image_sources_for_text_and_reads_another_text_dataset(root):
    info = _ag_news(root).info
    for spec in ("noise", "generator:g.safetensors"):
        with pytest.raises(ConfigError, match=r"mean nothing to a text model.*'holdout'"):
            dd.build_source(spec, info, data_dir=root, size=0, seed=0)
    with pytest.raises(ConfigError, match="is an image dataset"):
        dd.build_source("dataset:digits", info, data_dir=root, size=0, seed=0)
    source = dd.build_source("dataset:sst2", info, data_dir=root, size=30, seed=0)
    batch = source.batch(8, torch.Generator().manual_seed(0))
    assert (
        source.description == "30 unlabeled texts of sst2" and batch.dtype == torch.int64 and len(batch) == 8
    )
    assert int(batch.max()) < info.text.vocab_size and bool((batch[:, 0] == 2).all())


def test_a_text_distillation_source_without_its_files_says_it_takes_the_runs_tokenizer(root, tmp_path):
    """`feddf.source = "dataset:sst2"` on an AG News run without SST-2's files: the missing-files message
    says the source is read by the run's tokenizer, not only "set sst2.model_dir", which the run refuses
    ([sst2] options belong to a run on sst2)."""
    info = _ag_news(root).info
    with pytest.raises(DataError, match=r"(?s)missing dataset files.*distillation source.*run's tokenizer"):
        dd.build_source("dataset:sst2", info, data_dir=tmp_path, size=0, seed=0)


@pytest.mark.parametrize("source", ["dataset:sst-2", "dataset:SST_2", "dataset: Sst2 "])
def test_feddf_refuses_its_own_dataset_under_any_spelling(root, tmp_path, source):
    """An alias or another spelling of the run's dataset loads the clients' training texts all the same."""
    settings = {
        "algorithm": "feddf",
        "dataset": "sst2",
        "data_dir": str(root),
        "clients": 2,
        "rounds": 1,
        "model": "distilbert",
        "val_fraction": 0.2,
        "sst2": {"model_dir": str(root / "model"), "max_length": 16},
        "model_options": TINY,
        "feddf": {"source": source, "steps": 1},
    }
    with pytest.raises(ConfigError, match="federation's own dataset"):
        run_suite(build_config(RunConfig(), settings), tmp_path, progress=False)


def _sst2_settings(root: Path, dataset: str, table: str) -> dict:
    return {
        "algorithm": "fedavg",
        "dataset": dataset,
        "data_dir": str(root),
        "clients": 2,
        "rounds": 1,
        "local_epochs": 1,
        "model": "distilbert",
        table: {"model_dir": str(root / "model"), "max_length": 16},
        "model_options": TINY,
    }


def test_a_dataset_alias_and_its_options_table_are_one_dataset(root, tmp_path):
    """`--dataset sst-2` with an [sst2] table (or any spelling of either) reads the table's options, and
    the run spells the registered name; a config that already does is left exactly as it is."""
    for dataset, table in (("sst-2", "sst2"), ("SST_2", "sst-2"), ("sst2", "sst-2")):
        config = build_config(RunConfig(), _sst2_settings(root, dataset, table))
        assert validate_setup(config).dataset.info.text.max_length == 16  # the table's, not the default
        canonical = canonical_dataset(config)
        assert canonical.dataset == "sst2" and canonical.options["sst2"] == config.options[table]
        assert set(canonical.options) == {"sst2", "model_options"}
    config = build_config(RunConfig(), _sst2_settings(root, "sst2", "sst2"))
    assert canonical_dataset(config) is config
    both = build_config(RunConfig(), _sst2_settings(root, "sst-2", "sst2"), {"sst-2": {"max_length": 8}})
    with pytest.raises(ConfigError, match=r"\[sst2\], \[sst-2\] all set options of dataset 'sst2'"):
        validate_setup(both)
    alias = build_config(RunConfig(), _sst2_settings(root, "sst-2", "sst-2"), {"out": str(tmp_path)})
    suite_dir, summaries = start_suite(alias, progress=False)
    assert suite_dir.name.startswith("sst2-") and summaries[0]["dataset"] == "sst2"
    assert read_config(suite_dir / "config.toml") == canonical_dataset(alias)


def test_the_holdout_source_splits_the_held_out_set_for_images_too():
    digits = load_dataset("digits")
    held = digits.train.subset(range(100))
    validation, pool = dd.split_holdout(held, 0.1, seed=0)
    assert len(validation) == 10 and len(pool) == 90
    assert validation.x.shape[1:] == held.x.shape[1:] and not set(validation.y.tolist()) - set(
        held.y.tolist()
    )
    source = dd.build_source("holdout", digits.info, data_dir=".", size=0, seed=0, held_out=pool)
    assert source.description == "90 unlabeled images of the held-out split of digits"
    with pytest.raises(ConfigError, match="raise val_fraction"):
        dd.split_holdout(held.subset([0]), 0.1, seed=0)


@pytest.mark.parametrize("key", ["ag-news.model_dir", "model_options.model_dir"])
def test_a_missing_model_folder_is_one_clear_error(root, tmp_path, capsys, key):
    argv = ["run", "--algorithm", "fedavg", "--dataset", "ag-news", "--data-dir", str(root), "--quiet"]
    argv += ["--model", "distilbert"]
    argv += ["--out", str(tmp_path), "--set", f"ag-news.model_dir={root / 'model'}"]
    assert main([*argv, "--set", f"{key}={tmp_path / 'missing'}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"model folder {tmp_path / 'missing'} does not exist" in err[0]


def test_a_loaded_text_model_refuses_ids_it_was_not_trained_on(suite):
    """Token ids wider than the training length (a plain tokenizer call pads to the longest text) or
    outside the vocabulary passed the check and were answered, differently or with a bare IndexError."""
    import fedistill
    from fedistill.inference import InputError

    out, _, _ = suite
    model = fedistill.load_model(out, "fedavg")
    text = model.info.text
    ids = torch.full((2, text.max_length), text.pad_id, dtype=torch.int64)
    ids[:, 0] = 1
    assert model.predict(ids).shape == (2,)
    with pytest.raises(InputError, match=f"more than the {text.max_length} the model was trained on"):
        model.predict(torch.ones((2, text.max_length + 5), dtype=torch.int64))
    with pytest.raises(InputError, match=r"token ids must lie in \[0, "):
        model.predict(torch.full((1, 4), text.vocab_size, dtype=torch.int64))


def test_a_model_fine_tuned_from_a_folder_loads_without_it(root, tmp_path):
    """A trained DistilBERT is rebuilt from the architecture its file records: the pretrained folder it
    started from (or the tokenizer's) may be gone on the machine that loads it."""
    from transformers import DistilBertConfig, DistilBertModel

    import fedistill

    folder = tmp_path / "pretrained"
    config = DistilBertConfig(vocab_size=len(WORDS), dim=16, n_layers=1, n_heads=2, hidden_dim=32)
    seeded(1, lambda: DistilBertModel(config)).save_pretrained(str(folder))
    _save_tokenizer(folder)
    config = _config(root, rounds=1, local_epochs=1, **{"ag-news": {"model_dir": str(folder)}})
    config = dataclasses.replace(config, options={**config.options, "model_options": {}})  # pretrained
    out = tmp_path / "run"
    run_suite(config, out, progress=False)
    ids = load_dataset("ag-news", root, model_dir=str(folder), max_length=16).test.x[:8]
    before = fedistill.load_model(out, "fedavg").predict(ids)
    folder.rename(tmp_path / "moved")
    model = fedistill.load_model(out, "fedavg")
    assert torch.equal(model.predict(ids), before)
    from safetensors import safe_open

    from fedistill.inference.export import export_model

    export_model(model, "safetensors", tmp_path / "exported.safetensors")
    with safe_open(str(tmp_path / "exported.safetensors"), framework="pt") as handle:
        assert json.loads(handle.metadata()["distilbert_config"])["dim"] == 16
