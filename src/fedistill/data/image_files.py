"""Image files as a model trained on `image_size` square images sees them: the reader the `image-folder`
dataset trains on and `fedistill predict` answers with, so both see the same pixels.

Reading: TIFF through tifffile (through Pillow where tifffile lacks the codec: LZW or JPEG compression
without the optional imagecodecs package), everything else through Pillow; any image becomes uint8
(H, W, C). Palette, bilevel and CMYK images are converted to RGB or greyscale first; images stored with
more than 8 bits (16-bit PNG or TIFF, float TIFF) are scaled by their own maximum (over the colour
channels: an alpha channel is scaled on its own), as the training loaders read theirs
(`fedistill.data.eight_bit`). Channels: greyscale becomes RGB by repetition and RGB becomes greyscale by
Pillow's luma; an alpha channel is dropped. Any other count of channels cannot be converted and is an
error. Resizing: Pillow's bilinear filter, which averages over the source pixels when shrinking.
"""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import numpy as np
import tifffile
from PIL import Image, UnidentifiedImageError

from fedistill.data.eight_bit import to_uint8
from fedistill.errors import DataError

_TO_RGB = ("P", "CMYK", "YCbCr", "LAB", "HSV", "RGBX")
_TO_RGBA = ("PA", "RGBa", "La")
CHANNEL_NAMES = {1: "greyscale", 3: "RGB"}
#: What reading a damaged image file raises: struct.error is tifffile on a TIFF cut short within its
#: 8-byte header, zlib.error a Deflate TIFF cut short within its pixels
IMAGE_READ_ERRORS = (
    OSError,
    ValueError,
    UnidentifiedImageError,
    tifffile.TiffFileError,
    struct.error,
    zlib.error,
)


def read_image(path: Path) -> np.ndarray:
    """The image at `path` as uint8 (H, W, C); DataError when it cannot be read or is no 2D image."""
    try:
        tiff = path.suffix.lower() in (".tif", ".tiff")
        array = read_tiff(path) if tiff else _read_with_pillow(path)
    except IMAGE_READ_ERRORS as e:
        raise DataError(f"cannot read image {path} ({e}); replace the file or move it elsewhere") from e
    if array.ndim == 2:
        array = array[:, :, None]
    if array.ndim != 3 or min(array.shape[:2]) < 1:
        raise DataError(
            f"{path} holds an array of shape {array.shape}, not one 2D image; save each image on its own"
        )
    if array.shape[2] in (2, 4) and array.dtype != np.uint8:  # alpha is no colour: scaled on its own
        return np.concatenate([to_uint8(array[:, :, :-1]), to_uint8(array[:, :, -1:])], axis=2)
    return to_uint8(array)


def read_tiff(path: Path) -> np.ndarray:
    """A one-page TIFF's pixels: tifffile, or Pillow where tifffile lacks the codec (LZW or JPEG
    compression needs the optional imagecodecs package there; Pillow decodes both, and the training
    loaders read such files through it)."""
    with tifffile.TiffFile(path) as tif:
        if len(tif.pages) > 1:  # a stack (a volume, a time series), not one image
            raise DataError(
                f"{path} holds {len(tif.pages)} images (a TIFF stack), not one 2D image; "
                "save each image on its own"
            )
        if not len(tif.pages):
            raise ValueError("it holds no image: a damaged or cut-short TIFF")
        try:
            array = np.asarray(tif.asarray())
        except ValueError as e:
            if "imagecodecs" not in str(e):
                raise
            return _read_with_pillow(path)
        if array.ndim == 3 and tif.pages[0].planarconfig == tifffile.PLANARCONFIG.SEPARATE:
            array = array.transpose(1, 2, 0)  # planar TIFF: channels first
        return array


def _read_with_pillow(path: Path) -> np.ndarray:
    """The pixels Pillow reads, palette, bilevel and CMYK-like modes converted to RGB(A) or grey."""
    with Image.open(path) as image:
        if image.mode in _TO_RGB:
            image = image.convert("RGB")
        elif image.mode in _TO_RGBA:
            image = image.convert("RGBA")
        elif image.mode == "1":
            image = image.convert("L")
        return np.asarray(image)


def to_channels(array: np.ndarray, channels: int, path: Path) -> np.ndarray:
    """uint8 (H, W, C) as (H, W, `channels`): alpha dropped, grey to RGB, RGB to grey (Pillow's luma)."""
    have = array.shape[2]
    if have in (2, 4):
        array, have = array[:, :, : have - 1], have - 1
    if have == channels:
        return np.ascontiguousarray(array)
    if have == 1 and channels == 3:
        return np.repeat(array, 3, axis=2)
    if have == 3 and channels == 1:
        return np.asarray(Image.fromarray(np.ascontiguousarray(array), "RGB").convert("L"))[:, :, None]
    wanted = CHANNEL_NAMES.get(channels, f"{channels}-channel")
    raise DataError(
        f"{path} has {array.shape[2]} channels; the model takes {wanted} images, and only "
        "greyscale, grey+alpha, RGB and RGBA images convert: save it as one of those"
    )


def resize_image(array: np.ndarray, size: int) -> np.ndarray:
    """uint8 (H, W, C) to (size, size, C) with Pillow's bilinear filter (unchanged when already so)."""
    if array.shape[:2] == (size, size):
        return array
    planes = [
        Image.fromarray(np.ascontiguousarray(array[:, :, c]), "L").resize(
            (size, size), Image.Resampling.BILINEAR
        )
        for c in range(array.shape[2])
    ]
    return np.stack([np.asarray(plane) for plane in planes], axis=2)


def model_image(path: Path, channels: int, size: int) -> tuple[np.ndarray, tuple[int, int]]:
    """The file as the model sees it, uint8 (channels, size, size), and its own (height, width)."""
    array = to_channels(read_image(path), channels, path)
    return resize_image(array, size).transpose(2, 0, 1), (array.shape[0], array.shape[1])
