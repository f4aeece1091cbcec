"""Kernels written in the ``tl`` language: GEMM benches and the GQA decode variants."""
