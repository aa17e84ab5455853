"""replayjax: decode hybrid SSM/attention language models in JAX with ReplaySSM kernels."""

__version__ = "0.1.0"
