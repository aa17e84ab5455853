"""The causal depthwise conv of a decode step over the conv-state slot pool: one Pallas Triton
launch that reads each row's conv state and token, writes the fp32 pre-activation conv and shifts
the token into the slot's state in place (`conv_update`), and the XLA path (`ring.conv_window` +
`ring.conv_commit`, what the models ran before).

Modules: `api` (the public op: validate, dispatch), `xla` and `pallas_triton` (implementations).
Verify windows (T > 1) and prefill stay on `pallas_kernels.ring`'s XLA functions.
"""

from pallas_kernels.conv.api import conv_update
from pallas_kernels.conv.pallas_triton import TILING, ConvTiling

__all__ = ["conv_update", "ConvTiling", "TILING"]
