"""Aperio ImageScope XML annotations (MoNuSeg/TCGA's format) rasterised to an instance map.

Each `Annotations/Annotation/Regions/Region` is one nucleus outlined by `Vertices/Vertex` elements with
`X` (column) and `Y` (row) attributes in pixels. Every region with three or more vertices becomes one
instance, numbered in file order; where outlines overlap the later region wins (overlaps are a few
boundary pixels in MoNuSeg), and a region left with no pixel is dropped, so ids run 1..n. A region marked
`NegativeROA="1"` is ImageScope's exclusion, a hole: its pixels are cleared from the nuclei drawn, and it
is no instance itself (MoNuSeg has none). An annotation with more than a tenth of its outlines wholly outside
the image is refused: it was drawn on another image, or on this one at another scale.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
from skimage.draw import polygon

from fedistill.data.medical.patches import relabel
from fedistill.errors import DataError


def _read(path: Path) -> list[tuple[np.ndarray, bool]]:
    """Each region's outline (n, 2) as (row, column) pairs, with whether it is negative (a hole), in file
    order; regions of fewer than three vertices are left out."""
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError) as e:
        raise DataError(f"cannot read the Aperio XML annotation {path} ({e})") from e
    if (
        root.tag != "Annotations"
    ):  # another tool's XML (ASAP, for one) would give no region: no nucleus at all
        raise DataError(
            f"{path} is not an Aperio ImageScope annotation (its root element is <{root.tag}>, not "
            "<Annotations>); convert it to Aperio's XML, or give the instances another way"
        )
    outlines = []
    for region in root.iter("Region"):
        try:
            points = [(float(v.attrib["Y"]), float(v.attrib["X"])) for v in region.iter("Vertex")]
        except (KeyError, ValueError) as e:
            raise DataError(f"{path}: a Vertex lacks a numeric X or Y attribute ({e})") from e
        if len(points) >= 3:
            negative = region.attrib.get("NegativeROA", "0").strip() not in ("", "0")
            outlines.append((np.asarray(points, dtype=np.float64), negative))
    return outlines


def read_regions(path: Path) -> list[np.ndarray]:
    """The outline (n, 2) of each nucleus (each region but the negative ones) as (row, column) pairs, in file
    order."""
    return [outline for outline, negative in _read(path) if not negative]


def rasterise(
    outlines: list[np.ndarray], shape: tuple[int, int], holes: list[np.ndarray] | tuple = ()
) -> np.ndarray:
    """An int64 instance map (0 = background) of the polygons' interiors, less the interiors of `holes`."""
    instances = np.zeros(shape, dtype=np.int64)
    for index, outline in enumerate(outlines, start=1):
        rows, cols = polygon(outline[:, 0], outline[:, 1], shape=shape)
        instances[rows, cols] = index
    for hole in holes:
        rows, cols = polygon(hole[:, 0], hole[:, 1], shape=shape)
        instances[rows, cols] = 0
    return relabel(instances)


#: more than this share of the outlines wholly outside the image: the annotation of another image (or scale)
MAX_SHARE_OUTSIDE = 0.1


def read_instances(path: Path, shape: tuple[int, int]) -> np.ndarray:
    """The instance map of `shape` drawn from the regions of an Aperio XML annotation file."""
    regions = _read(path)
    nuclei = [outline for outline, negative in regions if not negative]
    outside = sum(_wholly_outside(outline, shape) for outline in nuclei)
    if outside > MAX_SHARE_OUTSIDE * len(nuclei):
        raise DataError(
            f"{path}: {outside} of the {len(nuclei)} nucleus outlines lie wholly outside the "
            f"{shape[0]}x{shape[1]} image it annotates; is it the annotation of another image, or of this "
            "one at another scale? Put the tile's own XML beside it"
        )
    return rasterise(nuclei, shape, [outline for outline, negative in regions if negative])


def _wholly_outside(outline: np.ndarray, shape: tuple[int, int]) -> bool:
    """Whether an outline's (row, column) vertices all lie beyond one edge of an image of `shape` (past its
    outermost pixel centres), so that it covers none of its pixels."""
    rows, cols = outline[:, 0], outline[:, 1]
    return bool(rows.max() < 0 or cols.max() < 0 or rows.min() > shape[0] - 1 or cols.min() > shape[1] - 1)
