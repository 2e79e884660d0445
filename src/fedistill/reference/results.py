"""The results pages of the documentation and the README's headline table, generated from the files
the benchmarks write (`benchmarks/results/*.json` and the Markdown tables beside them).

Each section shows a benchmark's own table (its `.md`, written from the same run as its JSON twin) under
the command, the commit and the machine that produced it. The pages are committed, and
tests/test_docs.py regenerates them and fails when they differ, so a new result file means
`python -m fedistill.reference.results` (or `make docs`) before the commit.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

from fedistill.reference.demo_block import with_demo
from fedistill.reference.headline import HEADLINE_END, HEADLINE_START, headline_markdown
from fedistill.reference.markdown import between_markers
from fedistill.reference.provenance import provenance_lines

#: The repository's root, when running from a checkout (src/fedistill/reference/results.py).
ROOT = Path(__file__).resolve().parents[3]
RESULTS = Path("benchmarks/results")


@dataclass(frozen=True)
class ResultPage:
    """One generated page: which result files it shows and where their story is told."""

    slug: str
    title: str
    intro: str
    stems: tuple[str, ...]  # result files under benchmarks/results, without .json / .md
    figures: tuple[str, ...] = ()  # PNGs under benchmarks/results shown on the page (served by docs/hooks.py)


PAGES = (
    ResultPage(
        "one-shot",
        "One-shot methods on identical teachers",
        "Every method distils (or averages) the very same stage-1 models. The story: "
        "[DENSE and Co-Boosting](../methods/one-shot.md).",
        ("one_shot_fashion-mnist", "one_shot_mnist"),
    ),
    ResultPage(
        "fediod-classification",
        "FedIOD on classification",
        "The story: [FedIOD's results](../methods/fediod/results.md).",
        ("fediod_classification", "fediod_heterogeneous", "fediod_ablation_fashion-mnist"),
    ),
    ResultPage(
        "fediod-robustness",
        "FedIOD over many federations",
        "The story: [robustness and time to quality](../methods/fediod/robustness.md).",
        (
            "fediod_robustness_digits",
            "fediod_robustness_digits-centred",
            "fediod_robustness_fashion-mnist",
            "fediod_robustness_mnist",
            "fediod_share_power_fashion-mnist-alpha0.1",
            "fediod_robustness_digits-share1",
            "fediod_robustness_digits-share05",
            "fediod_robustness_fashion-mnist-share05",
            "fediod_robustness_mnist-share05",
        ),
    ),
    ResultPage(
        "fediod-time-to-quality",
        "FedIOD's time and bytes to quality",
        "The story: [robustness and time to quality](../methods/fediod/robustness.md).",
        (
            "fediod_time_to_quality_fashion-mnist-alpha0.1",
            "fediod_time_to_quality_fashion-mnist-alpha1",
            "fediod_time_to_quality_mnist-alpha0.1",
            "fediod_time_to_quality_mnist-alpha1",
            "fediod_time_to_quality_fashion-mnist-alpha0.1_cuda",
            "fediod_time_to_quality_fashion-mnist-alpha1_cuda",
            "bytes_to_quality_digits",
            "bytes_to_quality_fashion-mnist-alpha0.1",
            "bytes_to_quality_fashion-mnist-alpha1",
            "bytes_to_quality_fashion-mnist-alpha0.1_resnet8_cuda_32px_3ch",
            "bytes_to_quality_fashion-mnist-alpha0.1_resnet8-wide_cuda_32px_3ch",
        ),
        figures=(
            "bytes_to_quality_digits.png",
            "fediod_time_to_quality_fashion-mnist-alpha0.1.png",
            "fediod_time_to_quality_mnist-alpha0.1.png",
        ),
    ),
    ResultPage(
        "fedmdcg-table",
        "FedMD-CG's table and the foundation benchmark",
        "The story: [FedMD-CG and its baselines](../methods/fedmdcg.md).",
        (
            "foundation_fmnist",
            "fedmdcg_table_fashion-mnist",
            "fedmdcg_table_mnist",
            "fedmdcg_variants_fashion-mnist",
        ),
        figures=("fedmdcg_variants_fashion-mnist.png",),
    ),
    ResultPage(
        "feddf",
        "FedDF",
        "The story: [FedDF's results](../methods/feddf-results.md).",
        (
            "feddf_classification",
            "feddf_distillation_data",
            "feddf_heterogeneous",
            "feddf_heterogeneous_fashion-mnist_resnet20_resnet32_shufflenetv2",
            "feddf_tables_digits",
            "feddf_tables_digits_dirichlet-balanced",
        ),
        figures=(
            "feddf_classification.png",
            "feddf_distillation_data.png",
        ),
    ),
    ResultPage(
        "privacy",
        "Privacy: DP, PATE, attacks and similarity",
        "The story: [differential privacy](../how-to/privacy.md) and "
        "[PATE and privacy attacks](../how-to/privacy-analysis.md).",
        (
            "fediod_privacy_utility_fashion-mnist",
            "fediod_privacy_utility_digits",
            "fediod_pate_fashion-mnist",
            "pate_fedkd_fediod_fashion-mnist",
            "privacy_attacks",
            "fediod_similarity_fashion-mnist",
        ),
        figures=(
            "fediod_similarity_fashion-mnist.png",
            "privacy_attacks/fashion-mnist_relu_fedavg-1step.png",
            "privacy_attacks/fashion-mnist_relu_fediod_server-inputs.png",
        ),
    ),
    ResultPage(
        "medical",
        "Segmentation and reconstruction",
        "The story: [FedIOD on segmentation and reconstruction](../methods/fediod/per-pixel.md).",
        (
            "segmentation_table2",
            "segmentation_table4",
            "reconstruction_table9",
            "fediod_dense_communication",
            "fediod_dense_communication_margin",
            "fediod_dense_communication_lean-segmentation",
            "fediod_dense_communication_lean-reconstruction",
            "fediod_dense_communication_uniform-reconstruction",
            "lesion_randomisation",
            "brain_extraction",
            "batchnorm_statistics",
        ),
        figures=(
            "segmentation_figure5.png",
            "segmentation_real_patients.png",
            "segmentation_real_patients_tissue.png",
            "segmentation_figure6_nuclei.png",
            "reconstruction_figure7.png",
        ),
    ),
    ResultPage(
        "trust-and-scale",
        "Trust and scale: faults, poisoning, a thousand sites",
        "The story: [resume and failures](../concepts/resume.md) and "
        "[misbehaving sites and large federations](../how-to/misbehaving-sites.md).",
        ("fault_battery", "poisoning", "scale_clients", "scale_clients_cuda"),
    ),
    ResultPage(
        "speed",
        "Speed: transports and FedIOD's step",
        "The story: [transport speed](../how-to/flower.md#transport-speed) and "
        "[devices](../concepts/devices.md).",
        (
            "flower_speed_digits",
            "flower_speed_fashion-mnist",
            "demo_arithmetic",
            "fediod_step_time_digits",
            "fediod_step_time_fashion-mnist",
            "fediod_step_time_fashion-mnist_32px_3ch_channels-last",
            "fediod_step_time_fashion-mnist_cuda_32px_3ch_channels-last",
            "fediod_sites_together",
            "fediod_sites_together_cuda",
            "fediod_sites_together_fashion-mnist_k10_cuda",
            "fediod_sites_together_mnist_k100_cuda",
        ),
    ),
)

_IMAGE = re.compile(r"!\[([^\]]*)\]\(([^)]+)\)")
_COMMAND_LINE = re.compile(r"^(Command|Commands):\s")


def twin_section(stem: str, root: Path, taken: set[str] | None = None) -> str:
    """One result file as a page section: its own title (with the file's name when an earlier section of
    the page has the same title, listed in `taken`), what produced it, then its table(s)."""
    json_path = root / RESULTS / f"{stem}.json"
    lines = (root / RESULTS / f"{stem}.md").read_text(encoding="utf-8").splitlines()
    title = stem
    if lines and lines[0].startswith("# "):
        title, lines = lines[0][2:].strip(), lines[1:]
    body, written = [], []
    for line in lines:
        if _COMMAND_LINE.match(line):  # the command is in the provenance list above the table
            written += [c for c in re.findall(r"`([^`]+)`", line) if c not in written]
            continue
        if line.startswith("#"):
            line = "##" + line  # one level under the section's own heading
        body.append(_IMAGE.sub(lambda m: f"(figure: `{RESULTS}/{m.group(2)}`)", line))
    text = "\n".join(body).strip("\n")
    if taken is not None:
        title = f"{title} (`{stem}`)" if title in taken else title
        taken.add(title)
    tables = ['<div class="result-tables" markdown>', "", text, "", "</div>"]
    return "\n".join([f"## {title}", "", *provenance_lines(json_path, root, written), "", *tables, ""])


def page_markdown(page: ResultPage, root: Path = ROOT) -> str:
    """The Markdown of one generated results page."""
    parts = [
        f"# {page.title}",
        "",
        "<!-- generated by `python -m fedistill.reference.results` from benchmarks/results; do not edit -->",
        "",
        page.intro,
        "",
    ]
    taken = {page.title}
    if page.figures:
        parts += [f"![{Path(name).stem}](figures/{Path(name).name})" for name in page.figures] + [""]
    parts += [twin_section(stem, root, taken) for stem in page.stems]
    return "\n".join(parts)


def figure_files(root: Path = ROOT) -> dict[str, Path]:
    """Site path -> PNG under benchmarks/results, for every figure a results page shows."""
    return {
        f"results/figures/{Path(name).name}": root / RESULTS / name for page in PAGES for name in page.figures
    }


def results_pages(root: Path = ROOT) -> dict[str, str]:
    """Path under docs/ -> Markdown, for every generated results page."""
    return {f"results/{page.slug}.md": page_markdown(page, root) for page in PAGES}


def readme_with_headline(readme: str, root: Path = ROOT) -> str:
    """`readme` with the headline table and the demo block between their marker comments made afresh."""
    with_headline = between_markers(readme, HEADLINE_START, HEADLINE_END, headline_markdown(root))
    return with_demo(with_headline, root)


def write_all(root: Path = ROOT) -> list[Path]:
    """Write every results page under docs/ and refresh the README's headline; returns what changed."""
    changed = []
    targets = {root / "docs" / path: text for path, text in results_pages(root).items()}
    readme = root / "README.md"
    targets[readme] = readme_with_headline(readme.read_text(encoding="utf-8"), root)
    for path, text in targets.items():
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
            changed.append(path)
    return changed


def main(argv: list[str]) -> int:
    """Write the pages; a result file the pages cite that is missing is one line and exit 2 (nothing is
    written: every page is built before any is)."""
    root = Path(argv[0]) if argv else ROOT
    try:
        changed = write_all(root)
    except FileNotFoundError as exc:
        print(
            f"error: {exc.filename} is missing; the results pages are built from benchmarks/results/: "
            "restore it (git checkout) or re-run the benchmark that writes it",
            file=sys.stderr,
        )
        return 2
    for path in changed:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
