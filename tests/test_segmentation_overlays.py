"""The nuclei figure's overlays: instance outlines in the colours its title names, on the pixel grid."""

from __future__ import annotations

import numpy as np
from matplotlib.colors import to_rgba
from matplotlib.figure import Figure
from skimage.segmentation import find_boundaries

from fedistill.reproduce.segmentation_figures import PREDICTED, TRUE, outline


def test_instance_outlines_are_drawn_in_the_colour_the_title_names():
    """The title says true green and predicted red: a sequential colour map at its top end gave near-black
    (#00441b, #67000d), so both outlines read as black on stained tissue."""
    instances = np.zeros((10, 10), dtype=np.int64)
    instances[2:6, 2:6] = 1
    instances[6:9, 6:9] = 2
    for colour in (TRUE, PREDICTED):
        ax = Figure().subplots()
        outline(ax, instances, colour)
        (image,) = ax.images
        shown = ~np.ma.getmaskarray(image.get_array())
        assert np.array_equal(shown, find_boundaries(instances, mode="inner"))  # the outline, not the inside
        rgba = image.to_rgba(image.get_array())[shown]
        assert np.allclose(rgba, to_rgba(colour))
        assert image.get_interpolation() == "nearest"  # a one-pixel outline is not smeared


def test_an_image_with_no_instance_draws_no_outline():
    ax = Figure().subplots()
    outline(ax, np.zeros((6, 6), dtype=np.int64), TRUE)
    assert not ax.images
