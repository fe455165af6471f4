"""The channels-last pools (``plugrt.pooling::MaxPoolNHWC`` ...): their CUDA tactics against
the ONNX op's reference on the transposed input (simulator without a GPU), their
conformance examples, and :func:`channels_last_form`, which the layout pass asks."""

from __future__ import annotations

import numpy as np
import pytest

from plugrt.errors import PlugrtError
from plugrt.ir.graph import Graph, Node
from plugrt.ir.tensor import TensorInfo
from plugrt.onnx.importer import import_model
from plugrt.reference import ReferenceExecutor
from plugrt.testing import check_plugin
from plugrt.testing.nodes import node_tactics, run_tactic, single_node_model
from plugrt_builtin_ops.pooling.nhwc_ops import channels_last_form

DOMAIN = "plugrt.pooling"

TOL = {np.float16: dict(rtol=2e-3, atol=2e-3), np.float32: dict(rtol=2e-5, atol=1e-6)}

#: (NHWC input shape, attributes): 1-D, 2-D and 3-D spatial, odd sizes.
WINDOWS = [
    ((2, 7, 3), dict(kernel_shape=[3], strides=[2], pads=[1, 2])),
    ((2, 5, 7, 3), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),
    ((1, 5, 4, 2), dict(kernel_shape=[3, 2], strides=[2, 1], pads=[1, 0, 1, 1])),
    ((2, 6, 5, 3), dict(kernel_shape=[2, 3], strides=[2, 2], dilations=[2, 1], ceil_mode=1)),
    ((1, 5, 7, 3), dict(kernel_shape=[3, 3], strides=[2, 3], pads=[2, 1, 1, 2], ceil_mode=1)),
    ((1, 5, 6, 2), dict(kernel_shape=[3, 2], strides=[2, 2], auto_pad="SAME_UPPER")),
    ((1, 5, 6, 2), dict(kernel_shape=[2, 3], strides=[1, 2], dilations=[1, 2], auto_pad="SAME_LOWER")),
    ((1, 6, 5, 3), dict(kernel_shape=[2, 2], auto_pad="VALID", strides=[3, 2])),
    ((1, 3, 4, 3, 2), dict(kernel_shape=[2, 2, 2], strides=[1, 2, 1], pads=[1, 0, 0, 0, 1, 1])),
]


def _x(rng, shape, dtype=np.float32):
    return (rng.standard_normal(shape) + 0.2).astype(dtype)


def _reference(registry, op_type, x, attrs, domain="", opset=19):
    graph = import_model(single_node_model(op_type, {"x": x}, attrs, domain=domain, opset=opset), registry=registry)
    return graph, ReferenceExecutor(graph, registry).run({"x": x})[graph.outputs[0]]


def check_against_base(registry, op_type, x, attrs=None, rtol=1e-5, atol=1e-6):
    """Every tactic of ``<op_type>NHWC`` on NHWC ``x`` against ONNX ``op_type``'s reference
    on ``x`` transposed to NCHW; the NHWC reference equals the latter, transposed back."""
    attrs = dict(attrs or {})
    _, base = _reference(registry, op_type, np.ascontiguousarray(np.moveaxis(x, -1, 1)), attrs)
    want = np.moveaxis(base, 1, -1)
    graph, own = _reference(registry, f"{op_type}NHWC", x, attrs, domain=DOMAIN, opset=1)
    assert own.dtype == x.dtype and own.shape == want.shape
    np.testing.assert_array_equal(own, want)
    tactics = node_tactics(graph, registry)
    assert tactics, f"{op_type}NHWC offers no tactic"
    for tactic in tactics:
        (got,) = run_tactic(graph, tactic, {"x": x})
        label = f"{op_type}NHWC tactic {tactic.name!r}"
        assert got.dtype == want.dtype and got.shape == want.shape, label
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=rtol, atol=atol,
                                   err_msg=label, equal_nan=True)


# ---------------------------------------------------------------------- windowed pools


@pytest.mark.parametrize("shape, attrs", WINDOWS)
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_maxpool_nhwc(registry, rng, shape, attrs, dtype):
    check_against_base(registry, "MaxPool", _x(rng, shape, dtype), attrs, **TOL[dtype])


@pytest.mark.parametrize("shape, attrs", WINDOWS)
@pytest.mark.parametrize("count_include_pad", [0, 1])
def test_averagepool_nhwc(registry, rng, shape, attrs, count_include_pad):
    attrs = dict(attrs, count_include_pad=count_include_pad)
    check_against_base(registry, "AveragePool", _x(rng, shape), attrs, **TOL[np.float32])


@pytest.mark.parametrize("shape, attrs", [WINDOWS[1], WINDOWS[4]])
@pytest.mark.parametrize("count_include_pad", [0, 1])
def test_averagepool_nhwc_float16(registry, rng, shape, attrs, count_include_pad):
    attrs = dict(attrs, count_include_pad=count_include_pad)
    check_against_base(registry, "AveragePool", _x(rng, shape, np.float16), attrs, **TOL[np.float16])


@pytest.mark.parametrize("dtype", [np.float64, np.int8, np.uint8])
def test_maxpool_nhwc_other_dtypes(registry, rng, dtype):
    shape, attrs = WINDOWS[2]
    if np.dtype(dtype).kind == "f":
        x = _x(rng, shape, dtype)
    else:
        info = np.iinfo(dtype)
        x = rng.integers(info.min, info.min + 3, shape).astype(dtype)  # ties and the minimum itself
    check_against_base(registry, "MaxPool", x, attrs, rtol=0, atol=0)


def test_maxpool_nhwc_nan_and_infinities(registry, rng):
    x = _x(rng, (1, 4, 5, 2))
    x[0, 1, 2, 1] = np.nan
    x[0, 3, :, 0] = -np.inf
    check_against_base(registry, "MaxPool", x, dict(kernel_shape=[2, 2], pads=[0, 0, 1, 1]))


def test_windowed_nhwc_ops_refuse_what_the_onnx_ops_refuse(registry, rng):
    x = _x(rng, (1, 5, 5, 2))
    with pytest.raises(PlugrtError, match="storage_order"):
        _reference(registry, "MaxPoolNHWC", x, dict(kernel_shape=[2, 2], storage_order=1), domain=DOMAIN, opset=1)
    with pytest.raises(PlugrtError, match="pads"):
        _reference(registry, "AveragePoolNHWC", x, dict(kernel_shape=[2, 2], pads=[1, 1]), domain=DOMAIN, opset=1)
    with pytest.raises(PlugrtError, match="rank 2"):
        _reference(registry, "MaxPoolNHWC", _x(rng, (4, 3)), dict(kernel_shape=[2]), domain=DOMAIN, opset=1)


# ---------------------------------------------------------------------- the vector tactic

#: (NHWC input shape, attributes) of 2-D pools with C a multiple of 8: edges clamped on
#: each side, strides, dilation (with windows reaching into the padding), ceil_mode, auto_pad.
VECTOR_WINDOWS = [
    ((2, 5, 7, 8), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),
    ((1, 5, 4, 16), dict(kernel_shape=[3, 2], strides=[2, 1], pads=[1, 0, 1, 1])),
    ((1, 6, 5, 8), dict(kernel_shape=[2, 3], strides=[2, 2], dilations=[2, 1], ceil_mode=1)),
    ((1, 7, 6, 8), dict(kernel_shape=[3, 3], strides=[1, 2], dilations=[2, 3], pads=[2, 2, 1, 2])),
    ((1, 5, 7, 8), dict(kernel_shape=[3, 3], strides=[2, 3], pads=[2, 1, 1, 2], ceil_mode=1)),
    ((1, 5, 6, 8), dict(kernel_shape=[2, 3], strides=[1, 2], dilations=[1, 2], auto_pad="SAME_LOWER")),
]


def _vector_and_direct(registry, op_type, x, attrs):
    """The reference of ``<op_type>NHWC`` on ``x``, and the outputs of its first tactic (which
    must be the vector one) and of its first direct tactic."""
    graph, want = _reference(registry, f"{op_type}NHWC", x, attrs, domain=DOMAIN, opset=1)
    tactics = node_tactics(graph, registry)
    assert tactics[0].name.startswith("nhwc_vec8_t"), [t.name for t in tactics]
    assert tactics[0].params["format"] == "channels_last" and tactics[0].params["vector"] == 8
    direct = next(t for t in tactics if t.name.startswith("nhwc_direct_t"))
    (vector,) = run_tactic(graph, tactics[0], {"x": x})
    (scalar,) = run_tactic(graph, direct, {"x": x})
    return want, vector, scalar


@pytest.mark.parametrize("shape, attrs", VECTOR_WINDOWS)
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_maxpool_nhwc_vector_tactic(registry, rng, shape, attrs, dtype):
    x = _x(rng, shape, dtype)
    want, vector, scalar = _vector_and_direct(registry, "MaxPool", x, attrs)
    np.testing.assert_array_equal(vector, want)  # a max rounds nothing: exact
    np.testing.assert_array_equal(vector, scalar)


@pytest.mark.parametrize("shape, attrs", VECTOR_WINDOWS)
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("count_include_pad", [0, 1])
def test_averagepool_nhwc_vector_tactic(registry, rng, shape, attrs, dtype, count_include_pad):
    x = _x(rng, shape, dtype)
    attrs = dict(attrs, count_include_pad=count_include_pad)
    want, vector, scalar = _vector_and_direct(registry, "AveragePool", x, attrs)
    np.testing.assert_allclose(vector.astype(np.float64), want.astype(np.float64), **TOL[dtype])
    np.testing.assert_array_equal(vector, scalar)  # the same taps summed in the same order


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_maxpool_nhwc_vector_nan_and_infinities(registry, rng, dtype):
    x = _x(rng, (1, 5, 6, 8), dtype)
    bits = x.view(np.uint16 if dtype == np.float16 else np.uint32)
    quiet = 0x7E00 if dtype == np.float16 else 0x7FC00000
    x[0, 1, 2, 1] = np.nan
    bits[0, 1, 2, 6] = quiet | 1
    bits[0, 3, 3, 6] = quiet | 2  # a second NaN in windows of the first: the first wins
    x[0, 3:, :, :4] = -np.inf  # the last output row's windows, channels 0-3
    x[0, 0, 0, 7] = np.inf
    want, vector, scalar = _vector_and_direct(registry, "MaxPool", x, dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1]))
    assert np.isnan(want).any() and np.isneginf(want).any()
    np.testing.assert_array_equal(vector, want)
    np.testing.assert_array_equal(vector.view(bits.dtype), scalar.view(bits.dtype))  # NaN payloads too


@pytest.mark.parametrize("op_type", ["MaxPool", "AveragePool"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_vector_tactic_falls_back_on_misaligned_data(registry, rng, op_type, dtype):
    """Input or output one element past a 16-byte boundary: the direct kernel runs instead."""
    from numba import cuda

    from plugrt.launcher import PreparedLaunch

    x = _x(rng, (1, 5, 7, 8), dtype)
    attrs = dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    graph, want = _reference(registry, f"{op_type}NHWC", x, attrs, domain=DOMAIN, opset=1)
    tactics = node_tactics(graph, registry)
    vector, direct = tactics[0], next(t for t in tactics if t.name.startswith("nhwc_direct_t"))
    direct_kernel = direct.launches([cuda.to_device(x)], [cuda.device_array(want.shape, dtype)], None)[0].kernel
    for x_offset, y_offset in ((0, 0), (1, 0), (0, 1)):
        x_room = cuda.device_array(x.size + 1, dtype)
        x_room[x_offset:x_offset + x.size].copy_to_device(x.ravel())
        y_room = cuda.device_array(want.size + 1, dtype)
        y = y_room[y_offset:y_offset + want.size].reshape(want.shape)
        launches = vector.launches([x_room[x_offset:x_offset + x.size].reshape(x.shape)], [y], None)
        assert (launches[0].kernel is direct_kernel) == bool(x_offset or y_offset)
        for launch in launches:
            PreparedLaunch(launch)(0)
        cuda.synchronize()
        np.testing.assert_allclose(y.copy_to_host().astype(np.float64), want.astype(np.float64), **TOL[dtype])


@pytest.mark.parametrize("shape, dtype, attrs", [
    ((1, 5, 7, 12), np.float32, dict(kernel_shape=[3, 3])),      # C not a multiple of 8
    ((1, 5, 7, 8), np.float64, dict(kernel_shape=[3, 3])),       # neither float16 nor float32
    ((2, 7, 8), np.float32, dict(kernel_shape=[3])),             # 1-D
    ((1, 3, 4, 3, 8), np.float16, dict(kernel_shape=[2, 2, 2])),  # 3-D
])
def test_vector_tactic_only_where_it_applies(registry, rng, shape, dtype, attrs):
    for op_type in ("MaxPoolNHWC", "AveragePoolNHWC"):
        graph, _ = _reference(registry, op_type, _x(rng, shape, dtype), attrs, domain=DOMAIN, opset=1)
        names = [t.name for t in node_tactics(graph, registry)]
        assert names and all(name.startswith("nhwc_direct_t") for name in names), names


# ---------------------------------------------------------------------- global pools


@pytest.mark.parametrize("op_type", ["GlobalAveragePool", "GlobalMaxPool"])
@pytest.mark.parametrize("shape", [(2, 5, 3), (2, 3, 5, 4), (1, 2, 3, 2, 3), (2, 1, 1, 3)])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_global_pools_nhwc(registry, rng, op_type, shape, dtype):
    check_against_base(registry, op_type, _x(rng, shape, dtype), **TOL[dtype])


def test_global_maxpool_nhwc_nan(registry, rng):
    x = _x(rng, (1, 3, 4, 2))
    x[0, 2, 0, 1] = np.nan
    check_against_base(registry, "GlobalMaxPool", x)


@pytest.mark.parametrize("op_type", ["GlobalAveragePoolNHWC", "GlobalMaxPoolNHWC"])
def test_global_pools_nhwc_keep_the_channels_last(registry, rng, op_type):
    graph, y = _reference(registry, op_type, _x(rng, (2, 3, 5, 4)), {}, domain=DOMAIN, opset=1)
    assert y.shape == (2, 1, 1, 4)
    assert tuple(graph.info(graph.outputs[0]).shape) == (2, 1, 1, 4)


# ---------------------------------------------------------------------- the conformance kit


@pytest.mark.parametrize("op_type", ["MaxPoolNHWC", "AveragePoolNHWC", "GlobalAveragePoolNHWC", "GlobalMaxPoolNHWC"])
def test_nhwc_ops_pass_the_conformance_kit(registry, op_type):
    report = check_plugin("builtin-pooling", registry=registry, ops=[f"{DOMAIN}::{op_type}"])
    assert report.ops() == [f"{DOMAIN}::{op_type}"]
    assert len(report.results) > 1 + 4  # claims, then every check of every example


# ---------------------------------------------------------------------- channels_last_form


def _pool_graph(op_type, attrs, outputs=("y",), rank=4, domain="", graph_outputs=("y",), readers=()):
    """A graph of one ``op_type`` node on input ``x`` of ``rank`` (None: no info), and a
    Relu reading each value in ``readers``."""
    graph = Graph()
    graph.add_input("x", TensorInfo(np.float32, tuple(range(2, 2 + rank))) if rank else None)
    node = graph.add_node(Node("pool", op_type, domain, ("x",), tuple(outputs), dict(attrs), opset=17))
    for name in readers:
        graph.add_node(Node(f"read_{name}", "Relu", "", (name,), (f"{name}_relu",), {}, opset=17))
    for name in graph_outputs:
        graph.add_output(name)
    return node, graph


MAXPOOL_ATTRS = dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], auto_pad="NOTSET", dilations=None,
                     ceil_mode=1, storage_order=0)
AVERAGEPOOL_ATTRS = dict(kernel_shape=[2, 2], strides=None, pads=None, auto_pad="SAME_UPPER", dilations=[1, 1],
                         ceil_mode=0, count_include_pad=1)


@pytest.mark.parametrize("op_type, attrs, want_op, want_attrs", [
    ("MaxPool", MAXPOOL_ATTRS, "MaxPoolNHWC", {k: v for k, v in MAXPOOL_ATTRS.items() if k != "storage_order"}),
    ("AveragePool", AVERAGEPOOL_ATTRS, "AveragePoolNHWC", AVERAGEPOOL_ATTRS),
    ("GlobalAveragePool", {}, "GlobalAveragePoolNHWC", {}),
    ("GlobalMaxPool", {}, "GlobalMaxPoolNHWC", {}),
])
def test_channels_last_form_of_each_pool(op_type, attrs, want_op, want_attrs):
    node, graph = _pool_graph(op_type, attrs)
    assert channels_last_form(node, graph) == (DOMAIN, want_op, want_attrs)
    node, graph = _pool_graph(op_type, attrs, domain="ai.onnx")
    assert channels_last_form(node, graph) == (DOMAIN, want_op, want_attrs)


def test_channels_last_form_takes_every_rank_from_3():
    for rank in (3, 5):
        node, graph = _pool_graph("GlobalAveragePool", {}, rank=rank)
        assert channels_last_form(node, graph) == (DOMAIN, "GlobalAveragePoolNHWC", {})


def test_maxpool_indices_count_only_when_used():
    unused = [dict(outputs=("y", "")), dict(outputs=("y", "idx")), dict(outputs=("y",))]
    for case in unused:
        node, graph = _pool_graph("MaxPool", MAXPOOL_ATTRS, **case)
        assert channels_last_form(node, graph)[1] == "MaxPoolNHWC", case
    used = [dict(outputs=("y", "idx"), graph_outputs=("y", "idx")), dict(outputs=("y", "idx"), readers=("idx",))]
    for case in used:
        node, graph = _pool_graph("MaxPool", MAXPOOL_ATTRS, **case)
        assert channels_last_form(node, graph) is None, case


@pytest.mark.parametrize("op_type, domain, rank", [
    ("LpPool", "", 4),                 # no channels-last form
    ("GlobalLpPool", "", 4),
    ("Relu", "", 4),
    ("MaxPool", "com.example", 4),     # another domain's MaxPool
    ("MaxPoolNHWC", DOMAIN, 4),        # already channels last
    ("GlobalMaxPool", "", 2),          # no spatial dim
    ("GlobalMaxPool", "", None),       # rank not known
])
def test_channels_last_form_is_none_for_the_rest(op_type, domain, rank):
    node, graph = _pool_graph(op_type, {"kernel_shape": [2, 2]}, domain=domain, rank=rank)
    assert channels_last_form(node, graph) is None


# ---------------------------------------------------------------------- GPU typing


def test_kernels_compile_for_the_gpu():
    """The simulator does not type kernels: compile every variant for sm_90 (no GPU needed)."""
    from cuda_typing import compile_kernels

    failures = compile_kernels("""
        from plugrt_builtin_ops.common.scalars import compute_type
        from plugrt_builtin_ops.pooling import nhwc_pool as nk
        G = arr(np.int64, 2)
        for dt in ("float16", "float32", "float64", "int8", "uint8"):
            c = scalar(compute_type(dt)[1])
            check(f"MaxPoolNHWC {dt}", nk.max_pool_nhwc_kernel(np.dtype(dt).str),
                  [arr(dt), arr(dt), I64, I64, I64, I64, I64, I64, G, c], dt != "float64")
            check(f"MaxPoolNHWC 2-D {dt}", nk.max_pool_nhwc_2d_kernel(np.dtype(dt).str),
                  [arr(dt), arr(dt), I64, I64, I64, I64, I64, I64, G, c], dt != "float64")
        for dt in ("float16", "float32"):
            for kind in ("max", "avg"):
                check(f"vec8 {kind} NHWC {dt}", nk.pool_nhwc_vec8_kernel(kind),
                      [arr(dt), arr(dt), I64, I64, G, I64], True)
        for dt in ("float16", "float32", "float64"):
            check(f"AveragePoolNHWC {dt}", nk.average_pool_nhwc_kernel(np.dtype(dt).str),
                  [arr(dt), arr(dt), I64, I64, I64, I64, I64, I64, G, I64], dt != "float64")
            for kind in ("avg", "max"):
                check(f"global {kind} NHWC {dt}", nk.global_pool_nhwc_kernel(np.dtype(dt).str, kind),
                      [arr(dt), arr(dt), I64, I64, I64], dt != "float64")
    """)
    assert not failures, "\n".join(failures)
