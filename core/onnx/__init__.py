"""ONNX front end: importing models into the IR, and the ONNX backend interface."""

from plugrt.onnx.importer import import_model, load_model

__all__ = ["import_model", "load_model"]
