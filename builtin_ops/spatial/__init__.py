"""Spatial data movement and resampling: Pad, DepthToSpace, SpaceToDepth, Resize, Upsample,
GridSample, AffineGrid, RoiAlign, Col2Im and NonMaxSuppression.

- :mod:`.ops`: Pad, DepthToSpace and SpaceToDepth;
- :mod:`.resize_ops`: Resize and Upsample;
- :mod:`.grid_sample_ops`: GridSample (2-D at opset 16, 1-D to 3-D from opset 20);
- :mod:`.affine_grid_ops`: AffineGrid (F.affine_grid's export, opset 20);
- :mod:`.roi_align_ops`: RoiAlign;
- :mod:`.col2im_ops`: Col2Im;
- :mod:`.nms_ops`: NonMaxSuppression (on the host: how many boxes it keeps is data);
- kernels: :mod:`.pad`, :mod:`.permute` (DepthToSpace/SpaceToDepth's permuting gather),
  :mod:`.resize`, :mod:`.grid_sample`, :mod:`.affine_grid`, :mod:`.roi_align` and :mod:`.col2im`.
"""

from plugrt import hookimpl

from . import affine_grid_ops, col2im_ops, grid_sample_ops, nms_ops, ops, resize_ops, roi_align_ops

#: Every op of the family, in the order they register.
OPS = (ops.OPS + resize_ops.OPS + grid_sample_ops.OPS + affine_grid_ops.OPS + roi_align_ops.OPS + col2im_ops.OPS
       + nms_ops.OPS)

#: The plugrt plugin API versions this package is written for (see plugrt.registry).
PLUGRT_API = (1, 1)


@hookimpl
def plugrt_ops():
    return [op() for op in OPS]
