"""CUDA graphs: one specialization's launches captured once and replayed in one call.

A :class:`LaunchGraph` is made by stream capture (``cuStreamBeginCapture``, the launches,
``cuStreamEndCapture``, ``cuGraphInstantiate``) on the context's own capture stream, so
nothing runs while it is recorded and the caller's stream may be any stream, the legacy
default one included. The kernel node of each launch is noted as it is captured
(``cuStreamGetCaptureInfo``), so that a binding moved to another address is patched into
the executable graph node by node (``cuGraphExecKernelNodeSetParams``) rather than captured
again. A graph exec runs one launch at a time: each context owns its graphs.

Capture can fail (an operation not permitted while capturing, an old driver): the caller
gets ``None`` and one warning, and runs the launches directly.
"""

from __future__ import annotations

import logging

from plugrt.errors import PlugrtError

log = logging.getLogger("plugrt.engine")


class LaunchGraph:
    """An instantiated CUDA graph of prepared launches, with one kernel node per launch."""

    def __init__(self, launches, capture_stream: int):
        from cuda.bindings import driver as drv

        self._drv = drv
        self.graph = self.exec = None
        self.nodes: list = []
        mode = drv.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
        _check(drv.cuStreamBeginCapture(capture_stream, mode)[0], "cuStreamBeginCapture")
        try:
            for launch in launches:
                launch(capture_stream)
                self.nodes.append(_last_node(drv, capture_stream))
        finally:
            err, graph = drv.cuStreamEndCapture(capture_stream)
            if err == drv.CUresult.CUDA_SUCCESS:
                self.graph = graph
        if self.graph is None:
            raise PlugrtError(f"cuStreamEndCapture failed: {err}")
        err, self.exec = drv.cuGraphInstantiate(self.graph, 0)
        if err != drv.CUresult.CUDA_SUCCESS:
            self.exec = None
            self.close()
            raise PlugrtError(f"cuGraphInstantiate failed: {err}")
        #: Whether each launch's node is known, so bindings can be patched in place.
        self.patchable = len(self.nodes) == len(launches) and all(n is not None for n in self.nodes)

    def launch(self, stream: int) -> None:
        err, = self._drv.cuGraphLaunch(self.exec, stream)
        if err != self._drv.CUresult.CUDA_SUCCESS:
            _check(err, "cuGraphLaunch")

    def patch(self, index: int, launch) -> None:
        """Give launch ``index``'s node the launch's current parameters."""
        _check(self._drv.cuGraphExecKernelNodeSetParams(self.exec, self.nodes[index], launch.node_params())[0],
               "cuGraphExecKernelNodeSetParams")

    def close(self) -> None:
        if self.exec is not None:
            self._drv.cuGraphExecDestroy(self.exec)
            self.exec = None
        if self.graph is not None:
            self._drv.cuGraphDestroy(self.graph)
            self.graph = None


def capture(launches, capture_stream: int, label: str) -> LaunchGraph | None:
    """A graph of ``launches``, or ``None`` (with a warning) when capture fails."""
    try:
        return LaunchGraph(launches, capture_stream)
    except Exception as exc:  # noqa: BLE001 - any failure means: run the launches directly
        log.warning("%s: CUDA graph capture failed (%s); launching kernels directly", label, exc)
        return None


def _last_node(drv, stream: int):
    """The node the stream's capture added last (the one the next node will depend on)."""
    result = drv.cuStreamGetCaptureInfo(stream)
    if result[0] != drv.CUresult.CUDA_SUCCESS:
        return None
    dependencies = next((item for item in result[1:] if isinstance(item, list)), None)
    return dependencies[0] if dependencies and len(dependencies) == 1 else None


def _check(err, what: str) -> None:
    from cuda.bindings import driver as drv

    if err != drv.CUresult.CUDA_SUCCESS:
        raise PlugrtError(f"{what} failed: {err}")


class NonBlockingStream:
    """A stream that never joins the legacy default stream (what captures run on)."""

    def __init__(self):
        from cuda.bindings import driver as drv

        err, self._stream = drv.cuStreamCreate(drv.CUstream_flags.CU_STREAM_NON_BLOCKING)
        if err != drv.CUresult.CUDA_SUCCESS:
            raise PlugrtError(f"cuStreamCreate failed: {err}")
        self.handle = int(self._stream)

    def close(self) -> None:
        from cuda.bindings import driver as drv

        if self._stream is not None:
            drv.cuStreamDestroy(self._stream)
            self._stream = None
