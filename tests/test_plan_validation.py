"""Plan header validation: one bad field of each kind, refused with a PlanError that names
the file, the field's JSON path and the fix, before anything is allocated."""

import struct

import numpy as np
import pytest
from fuzz_plan_targets import build_plans
from test_fuzz_plans import join_plan, split_plan

from plugrt import PlanError
from plugrt.engine import Engine
from plugrt.engine.plan_file import FORMAT_VERSION, decode_plan

REBUILD = r"rebuild the plan with plugrt"


@pytest.fixture(scope="module")
def plans():
    relu, conv_relu, dynamic = build_plans()
    return {"relu": relu, "conv_relu": conv_relu, "dynamic": dynamic}


def edited(plan: bytes, edit) -> bytes:
    """The plan with ``edit(header)`` applied and the checksum recomputed."""
    head, header, blob = split_plan(plan)
    edit(header)
    return join_plan(head, header, blob)


def refused(data: bytes, *patterns: str) -> str:
    with pytest.raises(PlanError) as info:
        Engine.deserialize(data, label="'m.plan'")
    message = str(info.value)
    assert "'m.plan'" in message, message
    for pattern in patterns:
        assert pattern in message, message
    return message


def test_the_valid_plans_load(plans):
    for plan in plans.values():
        Engine.deserialize(plan).inspect()


# ---------------------------------------------------------------------- container


def test_a_bit_flip_in_the_format_version_reads_as_corruption(plans):
    data = bytearray(plans["relu"])
    data[8] ^= 0x10
    refused(bytes(data), "checksum mismatch", "rebuild it")


def test_a_newer_format_version_says_upgrade_and_a_wild_one_says_damaged(plans):
    head, header, blob = split_plan(plans["relu"])
    newer = join_plan(head[:8] + struct.pack("<I", FORMAT_VERSION + 1), header, blob)
    refused(newer, f"format version {FORMAT_VERSION + 1}", "upgrade plugrt")
    for version in (0, 1 << 31):
        wild = join_plan(head[:8] + struct.pack("<I", version), header, blob)
        refused(wild, f"format version {version}", "damaged", "rebuild it")


def test_array_table_entry_without_dtype(plans):
    refused(edited(plans["conv_relu"], lambda h: h["arrays"][0].pop("dtype")), "arrays[0].dtype", "missing", REBUILD)


@pytest.mark.parametrize("dtype", ["O", "<U4", ">f4", "float32", "V4"])
def test_array_dtype_must_be_a_numeric_numpy_dtype_string(plans, dtype):
    def edit(h):
        h["arrays"][0]["dtype"] = dtype

    refused(edited(plans["conv_relu"], edit), "arrays[0].dtype", "NumPy dtype string", REBUILD)


@pytest.mark.parametrize("nbytes", [0, "72", 71])
def test_array_nbytes_must_match_its_shape(plans, nbytes):
    def edit(h):
        h["arrays"][0]["nbytes"] = nbytes

    refused(edited(plans["conv_relu"], edit), "arrays[0].nbytes", REBUILD)


def test_array_offset_into_header_padding_is_refused(plans):
    def edit(h):
        h["arrays"][0]["offset"] = -64

    refused(edited(plans["conv_relu"], edit), "arrays[0].offset", "an integer in 0..", REBUILD)


def test_unaligned_and_overlapping_array_offsets_are_refused(plans):
    def unaligned(h):
        h["arrays"][1]["offset"] += 4

    def overlapping(h):
        h["arrays"][1]["offset"] = h["arrays"][0]["offset"]

    refused(edited(plans["conv_relu"], unaligned), "arrays[1].offset", "a multiple of 64")
    refused(edited(plans["conv_relu"], overlapping), ".offset", "may not share bytes")


def test_array_past_the_data_region_is_refused(plans):
    def edit(h):
        h["arrays"][0]["offset"] = 64 * 100

    refused(edited(plans["conv_relu"], edit), "arrays[0].offset", REBUILD)


# ---------------------------------------------------------------------- engine header


def test_missing_graph_or_memory_offsets(plans):
    refused(edited(plans["relu"], lambda h: h.pop("graph")), "graph must be present", REBUILD)
    refused(edited(plans["relu"], lambda h: h["memory"].pop("offsets")), "memory.offsets", "missing", REBUILD)


@pytest.mark.parametrize("index", [0.5, -1, 1, "0", None])
def test_node_index_must_name_a_node(plans, index):
    def edit(h):
        h["layers"][0]["node_index"] = index

    refused(edited(plans["relu"], edit), "layers[0].node_index", REBUILD)


def test_profile_values_as_strings(plans):
    def edit(h):
        h["profiles"][0]["x"]["max"] = ["4", "3"]

    refused(edited(plans["dynamic"], edit), "profiles[0]['x'].max[0]", "an integer", REBUILD)


def test_profile_opt_outside_min_max(plans):
    def edit(h):
        h["profiles"][0]["x"]["opt"] = [9, 3]

    refused(edited(plans["dynamic"], edit), "profiles[0]['x'].opt[0]", "between min 1 and max 4")


@pytest.mark.parametrize("provider", ["ghost", {"plugin": "ghost", "distribution": None, "version": None,
                                                "provider_version": None}, {"plugin": 3}])
def test_bad_tactic_provider(plans, provider):
    def edit(h):
        h["layers"][0]["tactic_provider"] = provider

    refused(edited(plans["relu"], edit), "layers[0].tactic", REBUILD)


@pytest.mark.parametrize("key,value,expected", [("workspace_bytes", -1, "memory.workspace_bytes"),
                                                ("workspace_bytes", 1 << 40, "memory.workspace_bytes"),
                                                ("arena_bytes", 1 << 40, "memory.arena_bytes"),
                                                ("arena_bytes", 4096, "memory.arena_bytes")])
def test_arena_and_workspace_bounded_by_what_the_shapes_need(plans, key, value, expected):
    def edit(h):
        h["memory"][key] = value

    refused(edited(plans["relu"], edit), expected, REBUILD)


def test_layer_workspace_beyond_its_tactic_is_refused(plans):
    def edit(h):
        h["layers"][0]["workspace_bytes"] = 1 << 30
        h["memory"]["workspace_bytes"] = 1 << 30

    refused(edited(plans["relu"], edit), "layers[0].workspace_bytes", "at the profile's max shapes")


@pytest.mark.parametrize("offset,why", [(-1, "an integer"), (128, "a multiple of 256"), (0, "shares arena bytes"),
                                        (512, "inside the 512-byte arena")])
def test_memory_offsets_are_aligned_inside_and_apart(plans, offset, why):
    def edit(h):
        h["memory"]["offsets"]["y"] = offset

    refused(edited(plans["relu"], edit), "memory.offsets['y']", why, REBUILD)


def test_unknown_field_is_refused(plans):
    def edit(h):
        h["layers"][0]["priority"] = 1

    refused(edited(plans["relu"], edit), "layers[0].priority", "knows no such field", REBUILD)


# ---------------------------------------------------------------------- attributes and graph


def test_node_attributes_are_revalidated_through_the_plugin(plans):
    def unknown(h):
        h["graph"]["nodes"][0]["attrs"]["alpha"] = 1.0

    refused(edited(plans["relu"], unknown), "graph.nodes[0].attrs", "'alpha' is not known to plugin", REBUILD)


def test_fused_layer_body_attributes_are_revalidated(plans):
    def wrong_kind(h):
        h["graph"]["nodes"][0]["attrs"]["body"][0]["attrs"]["pads"] = "VALID"

    def bad_value(h):
        h["graph"]["nodes"][0]["attrs"]["body"][0]["attrs"]["auto_pad"] = "SIDEWAYS"

    refused(edited(plans["conv_relu"], wrong_kind), "graph.nodes[0].attrs.body[0].attrs",
            "'pads' must be of type ints", REBUILD)
    refused(edited(plans["conv_relu"], bad_value), "node 'Conv_0'", "auto_pad='SIDEWAYS' is not supported", REBUILD)


def test_graph_output_that_nothing_makes(plans):
    def edit(h):
        h["graph"]["outputs"] = ["nowhere"]

    refused(edited(plans["relu"], edit), "graph", "'nowhere'", REBUILD)


def test_initializer_without_its_array(plans):
    def edit(h):
        h["graph"]["initializers"].append("ghost")

    refused(edited(plans["conv_relu"], edit), "graph.initializers[2]", "'init/NAME'", REBUILD)


def test_layers_must_cover_the_device_nodes(plans):
    refused(edited(plans["relu"], lambda h: h["layers"].clear()), "layers", "must run nodes [0]", REBUILD)


def test_unknown_tactic_is_refused(plans):
    def edit(h):
        h["layers"][0]["tactic"] = {"name": "warp_speed", "params": {}}

    refused(edited(plans["relu"], edit), "layers[0].tactic", "offers no tactic 'warp_speed'", REBUILD)


def test_deeply_nested_header_is_refused_before_it_is_walked(plans):
    def edit(h):
        value = 1
        for _ in range(400):
            value = [value]
        h["graph"]["nodes"][0]["attrs"]["alpha"] = value

    refused(edited(plans["relu"], edit), "nests deeper than 32 levels", REBUILD)


def test_decode_refuses_a_table_that_is_not_a_list():
    from plugrt.engine.plan_file import encode_plan

    data = encode_plan({}, {"w": np.zeros(3, np.float32)})
    head, header, blob = split_plan(data)
    header["arrays"] = {"w": 1}
    with pytest.raises(PlanError, match=r"arrays must be a list"):
        decode_plan(join_plan(head, header, blob), "m.plan")


# ---------------------------------------------------------------------- valid plans still load


def test_plans_with_fused_gelu_and_layernorm_load(rng):
    from test_fusion_models import bert_mlp

    from plugrt.engine import Builder, BuilderConfig

    model = bert_mlp(rng)
    model = model[0] if isinstance(model, tuple) else model
    engine = Builder().build_engine(model, BuilderConfig(optimization_level=0, progress=False))
    ops = [layer["op"] for layer in Engine.deserialize(engine.serialize()).inspect()["layers"]]
    assert "LayerNormalization" in ops and any("Gelu" in op for op in ops)


def test_plan_with_float_shape_tensor_values_loads():
    """The ONNX backend makes small float inputs shape tensors; their values are floats."""
    from onnx import TensorProto, helper

    from plugrt.engine import Builder, BuilderConfig, OptimizationProfile

    graph = helper.make_graph([helper.make_node("ReduceL2", ["x"], ["y"], keepdims=0)], "l2",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    config = BuilderConfig(optimization_level=0, progress=False)
    config.add_optimization_profile(OptimizationProfile().set_shape("x", (2, 2), (2, 2), (2, 2))
                                    .set_shape_values("x", [0.5, 1.5, 2.5, 3.5]))
    engine = Builder().build_engine(model, config)
    assert Engine.deserialize(engine.serialize()).profile.shape_values == {"x": [0.5, 1.5, 2.5, 3.5]}
