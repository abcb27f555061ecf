"""Quantized linear layers: which scheme a model runs (`config`, torch-free) and the fp8
matmul (`fp8`)."""
