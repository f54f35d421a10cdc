"""ONNX's Resize as one matrix per resized axis, made at import from static shapes.

Every Resize mode (nearest, linear, cubic, with antialias, any coordinate transformation) is
separable and linear along each axis: output = M_k applied along axis k, for each resized axis k
in turn, as ONNX's reference evaluator computes it. Each M_k (out_k x in_k) is that evaluator's
own 1-D interpolation (``onnx.reference.ops.op_resize``) run on the identity, so the weights are
ONNX's to the last rounding rule. ``tf_crop_and_resize`` writes ``extrapolation_value`` where a
sample falls outside the input on any axis: M_k's rows are zero there, and the mask of such rows
(the same interpolation run with extrapolation value 1 on zeros) gives the constant to add.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class AxisMap:
    """One resized axis: its ONNX axis, its matrix (out, in) and its extrapolated outputs (0/1)."""
    axis: int
    matrix: np.ndarray
    outside: np.ndarray


def _coefficients(mode: str, nearest_mode: str, cubic_coeff_a: float, antialias: bool):
    """The evaluator's weight function for the mode, as its Resize op picks it."""
    from onnx.reference.ops import op_resize as r
    if mode == "nearest":
        if antialias:
            raise ValueError("antialias with mode nearest")
        return lambda x, scale: r._nearest_coeffs(x, mode=nearest_mode)
    if mode == "cubic":
        cubic = r._cubic_coeffs_antialias if antialias else r._cubic_coeffs
        return lambda x, scale: cubic(x, scale, A=cubic_coeff_a)
    if mode == "linear":
        return r._linear_coeffs_antialias if antialias else r._linear_coeffs
    raise ValueError(f"mode {mode!r}")


def _per_axis(shape, out_shape, axes, scales, sizes, policy: str) -> list[tuple[int, float]]:
    """(axis, scale) of every axis the op lists, in its order: the given scales, or from sizes
    out/in (one scale for all listed axes under a keep_aspect_ratio_policy, as the evaluator)."""
    if scales is not None:
        return list(zip(axes, (float(s) for s in scales)))
    ratios = [sizes[i] / shape[a] for i, a in enumerate(axes)]
    if policy in ("not_larger", "not_smaller"):
        ratios = [min(ratios) if policy == "not_larger" else max(ratios)] * len(axes)
    return list(zip(axes, ratios))


def axis_maps(shape, out_shape, *, axes, scales, sizes, roi, mode="nearest", coordinate_transformation_mode="half_pixel",
              nearest_mode="round_prefer_floor", cubic_coeff_a=-0.75, exclude_outside=0, antialias=0,
              keep_aspect_ratio_policy="stretch") -> list[AxisMap]:
    """The maps of every axis the Resize changes (the evaluator skips an axis of scale 1, the
    same length and a whole roi, and so does this). ``shape``, ``out_shape``: the input's and
    output's ONNX shapes; ``axes``: the axes ``scales``, ``sizes`` and ``roi`` list."""
    from onnx.reference.ops import op_resize as r
    fct = _coefficients(mode, nearest_mode, cubic_coeff_a, bool(antialias))
    maps = []
    for i, (axis, scale) in enumerate(_per_axis(shape, out_shape, axes, scales, sizes, keep_aspect_ratio_policy)):
        n, out = shape[axis], out_shape[axis]
        window = None if roi is None else (float(roi[i]), float(roi[i + len(axes)]))
        if math.isclose(scale, 1.0) and out == n and (window is None or (math.isclose(window[0], 0.0)
                                                                        and math.isclose(window[1], 1.0))):
            continue
        run = dict(roi=window, coordinate_transformation_mode=coordinate_transformation_mode,
                   exclude_outside=bool(exclude_outside))
        matrix = r._interpolate_1d_along_axis(np.eye(n), 0, scale, out, fct, extrapolation_value=0.0, **run)
        outside = r._interpolate_1d_along_axis(np.zeros(n), 0, scale, out, fct, extrapolation_value=1.0, **run)
        maps.append(AxisMap(axis, np.asarray(matrix, dtype=np.float64), np.asarray(outside, dtype=np.float64)))
    return maps
