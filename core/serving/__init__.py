"""Serving plans on the servers people already run: NVIDIA Triton Inference Server (a model
repository for its Python backend, :mod:`plugrt.serving.triton`) and Ray Serve
(:mod:`plugrt.serving.ray`), both speaking the KServe v2 / Open Inference Protocol
(:mod:`plugrt.serving.kserve`), with requests batched along the batch axis
(:mod:`plugrt.serving.batching`) and a load generator for either (:mod:`plugrt.serving.load`).
"""
