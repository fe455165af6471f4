"""What several op families share, so that no family imports another's private names.

- :mod:`.scalars`: the scalar type a kernel computes a dtype in, and NaN-propagating
  ``maximum``/``minimum`` device functions (elementwise, activation, pooling, resize);
- :mod:`.scale_folding`: :func:`~.scale_folding.vector_along`, which anchors (Conv,
  MatMul, Gemm) use to fold a per-channel scale into their weights;
- :mod:`.dtypes`: ONNX's dtype codes of the NumPy dtypes (elementwise's Cast, shape's
  EyeLike);
- :mod:`.lines`: a tensor as lines along one axis and the one-thread-per-line tactic
  (reduction's CumSum/CumProd and TopK, normalization's LpNormalization);
- :mod:`.layout`: a Transpose's normalized permutation, and the channels-first view of a
  channels-last tensor (shape, matmul, conv, pooling).

No entry point: this package holds no op.
"""
