"""A decode step of a model on the AHBM device, beside a host GPU (DESIGN.md §15).

The pieces so far: :mod:`.files` (model and host files), :mod:`.host` (the
GEMM roofline and the GPU-only attention), :mod:`.tasks` (the mapping of a
layer's decode tasks to PEs).
"""

from .files import Host, Model, load_host, load_model
from .host import Gemm, HostAttention, gemm, host_attention, layer_gemms, lm_head
from .tasks import Padding, Task, assign_tasks

__all__ = ["load_model", "load_host", "Model", "Host", "Task", "Padding", "assign_tasks", "gemm", "Gemm",
           "layer_gemms", "lm_head", "host_attention", "HostAttention"]
