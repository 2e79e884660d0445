"""Brain extraction's constants: the outline rule's depth (`brain_extraction.STRIP_MM`) and the tissue
rule's (`SCALP_MM`, `TISSUE_LEVEL`, `NECK_MM`, `CLOSE_MM`). The real lesion patients are not read.

Depth: semi-synthetic heads whose brain is known, the Colin 27 and MNI152 brains of
`brats-synthetic-lesions` at `--image-size` (256: 0.94 mm pixels, near the real patients' 0.78 mm), each
subject wrapped in CSF, skull and scalp of random thickness (`lesion_randomisation.synthetic_head`, the
ranges of its `HEAD_MM`), on the axial slices that hold at least a fifth of the largest slice's brain. For
every depth, the mask of the pixels deeper than it inside the head's outline (per slice, as
`extract_brain` does) is scored against the true brain: Dice, and the share of the non-brain head it
keeps. The depth of best mean Dice is the one chosen.

Rules: the outline rule at the chosen depth and the tissue rule on a grid of its constants, on
- a real head: the Colin 27 T1 with its skull, orbits and neck (`colin27_t1.nii.gz`) against its brain
  (`colin27_t1_brain.nii.gz`, holes filled), at its 1 mm slices and at every 7th slice from three offsets
  (the patients' slices are 6.5 mm apart);
- `--lesion-subjects` semi-synthetic heads as above, every 7th slice, with 1-3 lesions of
  `lesion_randomisation`'s wide looks painted in (dark ones too): brain Dice, and the share of the
  lesions' voxels the mask keeps.
The tissue constants chosen are those of best mean brain Dice (the real head's and the semi-synthetic
heads' means, averaged) among those that keep at least as much of the lesions as the outline rule does,
on average and in the worst subject: the outline rule looks at no intensity, and the tissue rule must not
lose more lesion than it to fit the brain better.

    python benchmarks/brain_extraction.py [--subjects 20] [--lesion-subjects 24] [--image-size 256]

Writes benchmarks/results/brain_extraction.{md,json}.
"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import numpy as np
from scipy import ndimage

from fedistill.data.medical import brain_extraction as bx
from fedistill.data.medical.brain_synthetic import COLIN27, MNI152, load_host
from fedistill.data.medical.lesion_randomisation import paint_random_lesions, synthetic_head
from fedistill.data.medical.volumes import axial_slices, read_volume
from fedistill.reproduce.arguments import benchmark_parser, shown_arguments
from fedistill.reproduce.paths import RESULTS
from fedistill.reproduce.tables import write_table

DEPTHS_MM = tuple(float(d) for d in range(4, 27, 2))
COLIN27_HEAD = "colin27_t1.nii.gz"
SLICE_STRIDE = 7  # about the patients' 6.5 mm between slices, on 0.94-1 mm voxels
COLIN_OFFSETS = (0, 3, 5)
#: the tissue rule's grid: scalp_mm, level, neck_mm, close_mm
GRID = tuple(itertools.product((8.0, 10.0), (0.6, 0.7), (4.0, 6.0), (6.0, 10.0, 14.0)))


def main(argv: list[str] | None = None) -> int:
    parser = benchmark_parser(__doc__)
    parser.add_argument("--subjects", type=int, default=20)
    parser.add_argument("--lesion-subjects", type=int, default=24)
    parser.add_argument("--image-size", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--results", default=str(RESULTS))
    args = parser.parse_args(argv)
    folder = Path(args.data_dir) / "brain-mri"
    hosts = [load_host(str(folder / name), name.split("_")[0], args.image_size) for name in (COLIN27, MNI152)]
    depth_rows, best = depth_sweep(hosts, args.subjects, args.seed)
    cases = colin_cases(folder) + lesion_cases(hosts, args.lesion_subjects, args.seed)
    outline = score(cases, lambda image, px: bx.extract_brain(image, px, depth_mm=best))
    tissue_rows = []
    for i, (scalp, level, neck, close) in enumerate(GRID, start=1):
        row = score(cases, lambda image, px, s=(scalp, level, neck, close): tissue(image, px, *s))
        tissue_rows.append({"scalp_mm": scalp, "level": level, "neck_mm": neck, "close_mm": close} | row)
        print(f"tissue {i}/{len(GRID)}: {tissue_rows[-1]}", flush=True)
    safe = [
        r
        for r in tissue_rows
        if r["lesion_kept"] >= outline["lesion_kept"] and r["lesion_kept_min"] >= outline["lesion_kept_min"]
    ]
    chosen = max(safe, key=lambda r: (r["colin_dice"] + r["semi_dice"]) / 2) if safe else None
    shown = shown_arguments(sys.argv[1:] if argv is None else argv)
    command = " ".join(["python benchmarks/brain_extraction.py", *shown])
    lines = [
        "# Brain extraction's constants: on semi-synthetic heads and on the Colin 27 head",
        "",
        f"Command: `{command}`",
        "",
        *depth_lines(depth_rows, best, args.subjects, args.image_size, hosts[0].voxel_mm),
        "",
        *rule_lines(outline, tissue_rows, chosen, best, args.lesion_subjects),
    ]
    record = {
        "command": command, "data": "semi-synthetic heads; the real Colin 27 head", "subjects": args.subjects,
        "lesion_subjects": args.lesion_subjects, "image_size": args.image_size, "seed": args.seed,
        "rows": depth_rows, "chosen_mm": best, "outline": outline, "tissue_rows": tissue_rows,
        "tissue_chosen": chosen,
    }  # fmt: skip
    print(write_table(args.results, "brain_extraction", lines, record).read_text(encoding="utf-8"))
    return 0


def tissue(image: np.ndarray, pixel_mm: tuple[float, float], scalp, level, neck, close) -> np.ndarray:
    return bx.tissue_brain(image, pixel_mm, scalp_mm=scalp, level=level, neck_mm=neck, close_mm=close)


def depth_sweep(hosts: list, subjects: int, seed: int) -> tuple[list[dict], float]:
    """Brain Dice and non-brain kept of the outline rule at every depth of DEPTHS_MM; the best depth."""
    dice = {d: [] for d in DEPTHS_MM}
    kept = {d: [] for d in DEPTHS_MM}
    for i in range(subjects):
        host = hosts[i % len(hosts)]
        brain, image = axial_slices(host.brain), axial_slices(host.volume)
        area = brain.sum(axis=(1, 2))
        keep = area >= 0.2 * area.max()
        brain, image = brain[keep], image[keep]
        _, head = synthetic_head(image, brain, host.voxel_mm, np.random.default_rng([seed, i]))
        inside = bx.inside_distance(head, (host.voxel_mm, host.voxel_mm))
        for depth in DEPTHS_MM:
            mask = inside > depth
            dice[depth].append(2.0 * (mask & brain).sum() / (mask.sum() + brain.sum()))
            kept[depth].append((mask & ~brain).sum() / (head & ~brain).sum())
    best = max(DEPTHS_MM, key=lambda d: float(np.mean(dice[d])))
    rows = [
        {"depth_mm": d, "dice": float(np.mean(dice[d])), "dice_min": float(np.min(dice[d])),
         "non_brain_kept": float(np.mean(kept[d])), "non_brain_kept_p95": float(np.percentile(kept[d], 95))}
        for d in DEPTHS_MM
    ]  # fmt: skip
    return rows, best


def colin_cases(folder: Path) -> list[tuple]:
    """(kind, image, brain, lesion, slices scored, pixel mm) of the Colin 27 head: all its slices, and every
    SLICE_STRIDE-th from each offset of COLIN_OFFSETS."""
    head, _ = read_volume(folder / COLIN27_HEAD)
    brain, _ = read_volume(folder / COLIN27)
    image = axial_slices(head)
    truth = np.stack([ndimage.binary_fill_holes(s) for s in axial_slices(brain) > 0])
    out = []
    for step, offset in [(1, 0), *((SLICE_STRIDE, o) for o in COLIN_OFFSETS)]:
        im, br = image[offset::step], truth[offset::step]
        area = br.sum(axis=(1, 2))
        out.append(("colin", im, br, None, area >= 0.2 * area.max(), 1.0))
    return out


def lesion_cases(hosts: list, count: int, seed: int) -> list[tuple]:
    """Semi-synthetic heads with painted lesions of the wide looks, every SLICE_STRIDE-th slice."""
    out = []
    for i in range(count):
        host = hosts[i % len(hosts)]
        rng = np.random.default_rng([seed, 1, i])
        painted, lesion = paint_random_lesions(host.volume, host.brain, host.depth, host.voxel_mm, rng)
        offset = int(rng.integers(SLICE_STRIDE))
        image, brain, lesion = (axial_slices(v)[offset::SLICE_STRIDE] for v in (painted, host.brain, lesion))
        area = brain.sum(axis=(1, 2))
        with_head, _ = synthetic_head(image, brain, host.voxel_mm, rng)
        out.append(("semi", with_head, brain, lesion, area >= 0.2 * area.max(), host.voxel_mm))
    return out


def score(cases: list[tuple], extract) -> dict[str, float]:
    """Mean (and worst) brain Dice on the real head's and the semi-synthetic heads' scored slices, and the
    share of the lesions' voxels kept (over the whole stack)."""
    dice: dict[str, list[float]] = {"colin": [], "semi": []}
    kept = []
    for kind, image, brain, lesion, scored, pixel in cases:
        mask = extract(image, (pixel, pixel))
        m, b = mask[scored], brain[scored]
        dice[kind].append(float(2.0 * (m & b).sum() / (m.sum() + b.sum())))
        if lesion is not None and lesion.any():
            kept.append(float((mask & lesion).sum() / lesion.sum()))
    return {
        "colin_dice": float(np.mean(dice["colin"])), "colin_dice_min": float(np.min(dice["colin"])),
        "semi_dice": float(np.mean(dice["semi"])), "semi_dice_min": float(np.min(dice["semi"])),
        "lesion_kept": float(np.mean(kept)), "lesion_kept_min": float(np.min(kept)),
    }  # fmt: skip


def depth_lines(rows: list[dict], best: float, subjects: int, size: int, voxel_mm: float) -> list[str]:
    return [
        "## The outline rule's depth, on semi-synthetic heads",
        "",
        f"{subjects} semi-synthetic subjects (the Colin 27 and MNI152 brains at {size} px, {voxel_mm:.2f} mm "
        "pixels, in synthetic CSF, skull and scalp of random thickness); the brain mask is the pixels "
        "deeper than the depth inside the head's outline, slice by slice.",
        "",
        "| depth mm | brain Dice, mean | brain Dice, worst subject | non-brain head kept, mean | "
        "non-brain head kept, 95th pct |",
        "|---|---|---|---|---|",
        *(
            f"| {r['depth_mm']:.0f}{' (chosen)' if r['depth_mm'] == best else ''} | {r['dice']:.4f} | "
            f"{r['dice_min']:.4f} | {r['non_brain_kept']:.4f} | {r['non_brain_kept_p95']:.4f} |"
            for r in rows
        ),
        "",
        f"Chosen: {best:.0f} mm, the best mean Dice (`brain_extraction.STRIP_MM` = {bx.STRIP_MM:g}).",
    ]


def rule_lines(outline: dict, rows: list[dict], chosen: dict | None, best: float, subjects: int) -> list[str]:
    def cells(r: dict) -> str:
        return (
            f"{r['colin_dice']:.4f} ({r['colin_dice_min']:.4f}) | {r['semi_dice']:.4f} ({r['semi_dice_min']:.4f})"
            f" | {r['lesion_kept']:.4f} ({r['lesion_kept_min']:.4f})"
        )

    table = [f"| outline, {best:.0f} mm | | | | | {cells(outline)} |"]
    for r in rows:
        mark = " (chosen)" if r is chosen else ""
        table.append(
            f"| tissue{mark} | {r['scalp_mm']:g} | {r['level']:g} | {r['neck_mm']:g} | {r['close_mm']:g} "
            f"| {cells(r)} |"
        )
    verdict = (
        f"Chosen: scalp {chosen['scalp_mm']:g} mm, level {chosen['level']:g}, neck {chosen['neck_mm']:g} mm, "
        f"closing {chosen['close_mm']:g} mm (`brain_extraction`: SCALP_MM = {bx.SCALP_MM:g}, TISSUE_LEVEL = "
        f"{bx.TISSUE_LEVEL:g}, NECK_MM = {bx.NECK_MM:g}, CLOSE_MM = {bx.CLOSE_MM:g})."
        if chosen
        else "No setting keeps as much of the lesions as the outline rule; none is chosen."
    )
    return [
        "## The two rules, on a real head and on semi-synthetic heads with lesions",
        "",
        "Brain Dice on the real Colin 27 head (skull, orbits and neck on; its brain mask as the truth), the "
        f"mean over its 1 mm slices and every {SLICE_STRIDE}th slice from offsets "
        f"{', '.join(map(str, COLIN_OFFSETS))} (worst in brackets); on {subjects} semi-synthetic heads "
        f"(every {SLICE_STRIDE}th slice) with 1-3 lesions of `lesion_randomisation`'s wide looks, bright "
        "and dark; and the share of those lesions' voxels inside the mask (mean, worst subject). The "
        "tissue rule is chosen by its mean brain Dice over both kinds of head among the settings that keep "
        "at least as much of the lesions as the outline rule, on average and in the worst subject.",
        "",
        "| rule | scalp mm | tissue level | neck mm | closing mm | Colin 27 brain Dice | semi-synthetic "
        "brain Dice | lesion voxels kept |",
        "|---|---|---|---|---|---|---|---|",
        *table,
        "",
        verdict,
    ]


if __name__ == "__main__":
    sys.exit(main())
