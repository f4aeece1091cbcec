"""A decode step of a model on the AHBM device, beside a host GPU (DESIGN.md §15).

>>> from kbwork import model
>>> s = model.step("llama-3-70b", [16384] * 16, variant="opt2")     # 80 GiB of KV: fits the device's 139 GiB
>>> s.seconds, s.tokens_per_s, s.bound
>>> s.breakdown
>>> model.compare("llama-3-8b", [8192] * 16)          # variants x placements
>>> model.sweep(model="llama-3-8b", batch=[1, 16], context=[4096, 32768])

The pieces: :mod:`.files` (model and host files), :mod:`.host` (the GEMM
roofline and the GPU-only attention), :mod:`.tasks` (the mapping of a layer's
decode tasks to PEs), :mod:`.device` (the device and one layer's attention on
it), :mod:`.schedule` (serial and ping-pong as a list schedule), :mod:`.steps`
and :mod:`.sweeps`, :mod:`.bounds` (the physical lower bound on a step) and :mod:`.contention` (one task
beside others on a shared channel), :mod:`.checks` (the argument checks every piece shares, and the
limits on a batch), :mod:`.capacity` (what fits: weights and KV cache against the HBM they are placed in); :mod:`.cli` is the ``kbwork step`` command.
"""

from . import capacity
from .bounds import BOUND_KINDS, PhysicalBound, physical_bound, with_bounds
from .contention import per_head_contention
from .device import DEVICE_V1, AttentionPlan, Device, attention_plan, load_device
from .capacity import kv_bytes, parameters, weight_bytes
from .files import Host, Model, load_host, load_model
from .host import Gemm, HostAttention, gemm, host_attention, layer_gemms, lm_head
from .schedule import Job, list_schedule
from .steps import DEFAULT_VARIANTS, PLACEMENTS, AttentionRun, Step, compare, step
from .sweeps import SWEEP_AXES, sweep
from .tasks import MAPPINGS, MERGES, Padding, Task, assign_tasks

__all__ = ["step", "compare", "sweep", "Step", "AttentionRun", "load_model", "load_host", "load_device", "Model",
           "Host", "Device", "Task", "Padding", "assign_tasks", "gemm", "Gemm", "layer_gemms", "lm_head",
           "host_attention", "HostAttention", "Job", "list_schedule", "DEVICE_V1", "DEFAULT_VARIANTS",
           "PLACEMENTS", "SWEEP_AXES", "physical_bound", "PhysicalBound", "with_bounds", "BOUND_KINDS",
           "per_head_contention", "capacity", "parameters", "weight_bytes", "kv_bytes", "attention_plan",
           "AttentionPlan", "MAPPINGS", "MERGES"]
