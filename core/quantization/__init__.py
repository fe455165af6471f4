"""INT8 quantization: calibration statistics, the calibration cache, and the builder's INT8 step."""
