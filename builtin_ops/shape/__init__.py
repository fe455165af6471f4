"""Data movement and generators: Reshape, Transpose, Concat, Slice, Gather, GatherND, ...,
Shape, Constant, Range, OneHot, Trilu, and the scatters.

- :mod:`.ops`: the ops that keep the elements' order (Reshape, Flatten, Squeeze, Unsqueeze,
  Identity, Dropout), and the helpers the other op modules share;
- :mod:`.movement_ops`: Transpose, Concat, Split, Slice, Gather, GatherElements, Expand,
  Tile;
- :mod:`.indexed_ops`: GatherND, ReverseSequence (movement steered by a runtime integer
  tensor);
- :mod:`.generator_ops`: Shape, Size, Constant, ConstantOfShape, Range, OneHot, Trilu,
  EyeLike, NonZero;
- :mod:`.scatter_ops`: ScatterElements (and the deprecated Scatter), ScatterND;
- kernels: :mod:`.copies` (plain, strided, row-block and gathering copies),
  :mod:`.transpose` (the shared-memory tiled transpose), :mod:`.generators` and
  :mod:`.scatter` (the scatters: per update with atomics, or in index order);
- :mod:`.simplify_pairs`: the cleanup pass for layout pairs that cancel or merge;
- :mod:`.channels_last`: the fusion pass running convolutions (and the pools and
  pointwise ops between them) channels-last, with the Transposes between layouts cancelled;
- :mod:`.sink_reshapes`: the fusion pass moving Reshapes below the pointwise nodes reading
  them, so that those fuse into the node before.
"""

from plugrt import hookimpl
from plugrt.plugin import GraphPass

from . import (
    channels_last, generator_ops, indexed_ops, io_formats, movement_ops, ops, scatter_ops, simplify_pairs, sink_reshapes,
)

#: Every op of the family, in the order they register.
OPS = ops.OPS + movement_ops.OPS + indexed_ops.OPS + generator_ops.OPS + scatter_ops.OPS

#: The plugrt plugin API versions this package is written for (see plugrt.registry).
PLUGRT_API = (1, 1)


@hookimpl
def plugrt_ops():
    return [op() for op in OPS]


#: Among the plugins' cleanup passes, lowest first.
PASS_PRIORITY = 10
#: Among the fusion passes: after the recognizers (LayerNorm, attention: 100) and the matmul
#: family's transpose folding (200), on the ops they leave.
CHANNELS_LAST_PRIORITY = 300
#: Last of the fusion passes: on the graph the recognizers and channels_last leave (whose
#: patterns read the model's Reshapes where it put them), right before epilogue fusion.
SINK_RESHAPES_PRIORITY = 900


@hookimpl
def plugrt_passes():
    return [GraphPass("simplify_pairs", simplify_pairs.run, priority=PASS_PRIORITY, stage="cleanup",
                      description="pairs of layout ops that cancel or merge"),
            GraphPass("channels_last", channels_last.run, priority=CHANNELS_LAST_PRIORITY,
                      description="convolutions channels-last (NHWC) on tensor cores, layout changes cancelled"),
            GraphPass("io_formats", io_formats.run, stage="bindings",
                      description="bindings asked channels-last (--io-format): a Transpose inside the engine"),
            GraphPass("sink_reshapes", sink_reshapes.run, priority=SINK_RESHAPES_PRIORITY,
                      description="Reshapes moved below pointwise nodes, which then fuse into the node before")]
