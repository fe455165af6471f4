"""The plugin against plugrt's conformance kit, over every example the op claims."""

from __future__ import annotations

from plugrt.registry import default_registry
from plugrt.testing import check_plugin


def test_conformance():
    report = check_plugin("contrib-attention")
    assert report.ok and report.results


def test_registered_through_the_entry_point():
    registry = default_registry()
    record = registry.plugins["contrib-attention"]
    assert record.distribution == "plugrt-contrib-attention"
    assert [op.op_type for op in record.ops] == ["MultiHeadAttention"]
    assert [p.name for p in record.passes] == ["fuse_attention"]
    assert not [failure for failure in registry.failures if failure.name == "contrib-attention"]
