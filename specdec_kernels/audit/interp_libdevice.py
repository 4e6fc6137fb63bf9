"""Stand-ins for the libdevice functions vLLM's kernels call, for Triton's interpreter (which has no
libdevice). Imported only by :mod:`.interpret`, after ``TRITON_INTERPRET=1`` is set.

- ``log1p(x)`` = ``log(1 + x)``: used by V2's residual ``log(max(p - q, 0))`` in log space
  (``rejection_sampler_utils._resample_kernel``), with ``x = -q/p`` in (-1, 0]; the stand-in loses relative
  precision only where q/p is below float32 epsilon, far below what a law test resolves.
"""

import triton
import triton.language as tl


@triton.jit
def log1p(x):
    return tl.log(1.0 + x)
