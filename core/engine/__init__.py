"""The GPU engine: builder, plan files, execution contexts."""

from plugrt.engine.builder import Builder
from plugrt.engine.engine import Engine
from plugrt.engine.pool import ContextPool
from plugrt.engine.profile import BuilderConfig, OptimizationProfile

__all__ = ["Builder", "BuilderConfig", "ContextPool", "Engine", "OptimizationProfile"]
