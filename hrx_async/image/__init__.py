"""Device-resident image operations: patchify, normalize, resize, affine, composite, and
the RGB operations of an alignment service (`RgbOps`: letterbox resize, affine crops from
run-time matrices, packed affine, similarity fitting).

Each is recorded into a graph as one GPU kernel over tensors (`ImageOps`), with a
bounded plan cache keyed by shapes, dtypes and parameters. The maths exists once as
C++ for NVRTC and hipRTC (`cxx`) and once as its numpy twin for the sim backend
(`host`), both reading one argument struct (`args`).
"""

from .args import MAX_CHANNELS
from .ops import BORDERS, RESIZE_MODES, ImageOps, ImageStats, invert_affine
from .rgb import AFFINE_MODES, RgbOps, RgbResize, fit_similarity_2d, letterbox

__all__ = [
    "AFFINE_MODES",
    "BORDERS",
    "MAX_CHANNELS",
    "RESIZE_MODES",
    "ImageOps",
    "ImageStats",
    "RgbOps",
    "RgbResize",
    "fit_similarity_2d",
    "invert_affine",
    "letterbox",
]
