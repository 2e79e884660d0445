"""The ready configs of FedIOD's segmentation tables (configs/segmentation/): each parses as `fedistill run
--config` parses it, holds the paper's protocol (same net, partition and local epochs per site for every
method of a setting), and states the paper's numbers in its header exactly as configs/expected.toml holds
them, in the format fedistill.reproduce.expected reads and rewrites."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

import pytest

from fedistill.algorithms.registry import get_algorithm
from fedistill.config import RunConfig, build_config, load_toml, options_for
from fedistill.engine import setup as runner
from fedistill.reproduce import expected

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"
SEGMENTATION = sorted((CONFIGS / "segmentation").glob("*.toml"))
HEADER = re.compile(r"^#   paper(?: \[(\w+)\])?: (.+)$", re.MULTILINE)
VALUE = re.compile(r"(\w+) ([\d.]+)(?: ± ([\d.]+))? (?:%|px)")
SETTINGS = {  # setting -> (dataset, K, local epochs per site, lr, batch)
    "brats2018-k10": ("brats", 10, 50, 0.002, 16),
    "tcga-cross-organ-k4": ("monuseg", 4, 100, 0.00025, 4),
    "nuclei-cross-site-k3": ("nuclei-cross-site", 3, 100, 0.00025, 4),
}


def _expected() -> dict:
    return tomllib.loads((CONFIGS / "expected.toml").read_text(encoding="utf-8"))


def test_every_method_of_the_papers_tables_has_a_config():
    names = {p.stem for p in SEGMENTATION}
    for setting in SETTINGS:
        assert {f"{setting}-{m}" for m in ("standalone", "fedavg", "asyndgan", "fediod")} <= names
    assert "brats2018-k10-centralized" in names
    assert len(SEGMENTATION) == 13


@pytest.mark.parametrize("path", SEGMENTATION, ids=lambda p: p.stem)
def test_a_config_parses_holds_the_protocol_and_has_its_paper_values(path):
    config = build_config(RunConfig(), load_toml(path))  # what `fedistill run --config` builds
    runner.check_sections(config)
    (name,) = config.algorithms
    options = options_for(config, name, get_algorithm(name).options)
    setting, _, method = path.stem.rpartition("-")
    dataset, clients, epochs, lr, batch = SETTINGS[setting]
    assert (config.dataset, config.clients, config.partition, config.model) == (
        dataset, clients, "natural", "unet-chang"
    )  # fmt: skip
    assert (config.optimizer, config.lr, config.batch_size, name) == ("adam", lr, batch, method)
    if name == "fediod":  # stage 1: the same local epochs as every other method's sites
        assert options.teacher_epochs == epochs and options.mask_source == "clients"
        assert (options.generator_blocks, options.discriminator_layers) == (9, 3)  # pix2pix's, as the paper
    elif name in ("standalone", "centralized", "fedavg"):
        assert config.rounds * config.local_epochs == epochs and config.local_steps <= 0

    entry = _expected()[f"segmentation/{path.name}"]
    assert (entry["tolerance"], entry["tolerance_hd95"]) == (2.0, 3.0)
    stated = {}
    for scope, values in HEADER.findall(path.read_text(encoding="utf-8")):
        suffix = f"_{scope}" if scope else ""
        for metric, value, std in VALUE.findall(values):
            stated[f"paper_{metric}{suffix}"] = float(value)
            if std:
                stated[f"paper_{metric}{suffix}_std"] = float(std)
    assert stated, "the comment header states the paper's numbers"
    assert stated == {k: v for k, v in entry.items() if k.startswith("paper_")}
    assert not any(k.startswith("ours_") for k in entry)  # nothing measured at the paper's scale yet


def test_expected_toml_round_trips_through_the_table_scripts_writer():
    """`benchmarks/fedmdcg_table.py --update-expected` rewrites the whole file (fedistill.reproduce.expected):
    the segmentation entries must come back unchanged, so they are written in its format (source,
    tolerance, then sorted keys)."""
    text = (CONFIGS / "expected.toml").read_text(encoding="utf-8")
    entries = expected.read_expected(CONFIGS / "expected.toml")
    blocks = dict(_blocks(text))
    for key, entry in entries.items():
        if key.startswith("segmentation/"):
            order = [k for k in ("source", "tolerance") if k in entry]
            order += sorted(k for k in entry if k not in order)
            assert blocks[key] == [f"{k} = {expected.toml_value(entry[k])}" for k in order], key


def _blocks(text: str) -> list[tuple[str, list[str]]]:
    out: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        if line.startswith("[") and line.endswith("]"):
            out.append((json.loads(line[1:-1]), []))  # the writer's [<json string>] headers
        elif out and line and not line.startswith("#"):
            out[-1][1].append(line)
    return out
