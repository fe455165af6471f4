"""QuantizeLinear and DequantizeLinear (being built)."""

OPS: list = []
