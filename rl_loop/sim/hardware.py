"""Accelerator descriptions for the roofline: memory bandwidth, dense FLOP/s, interconnect, overheads.

The GPU presets take their peak numbers from the vendors' datasheets (dense, i.e. without 2:4 sparsity);
what fraction of a peak a real kernel reaches (``mem_efficiency``, ``flop_efficiency``) and the host-side
overheads are assumptions, stated on each field. ``cpu-here`` is built by :mod:`rl_loop.sim.calibrate`
from micro-measurements on the machine that runs it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

GB = 1e9
TB = 1e12
TFLOPS = 1e12
US = 1e-6
MS = 1e-3


@dataclass(frozen=True)
class Hardware:
    """One accelerator (per-device numbers) and the interconnects it sits on.

    Bandwidths are bytes/s in one direction; FLOP/s are dense peaks keyed by dtype name ("bf16", "fp8",
    "fp32"). ``scaleup_*`` is the NVLink domain (``scaleup_domain`` devices), ``scaleout_*`` the network
    between domains (one NIC per device).
    """

    name: str
    hbm_bandwidth: float
    dense_flops: dict[str, float]
    hbm_capacity: float
    scaleup_bandwidth: float
    scaleup_latency: float
    scaleup_domain: int
    scaleout_bandwidth: float
    scaleout_latency: float
    # Achieved fractions of the peaks (assumptions): streaming reads of weights/KV reach ~80% of HBM
    # bandwidth; large decode GEMMs ~70% of the dense peak; training and log-prob passes are judged by MFU.
    mem_efficiency: float = 0.8
    # GPUs overlap weight streaming with math (time = max of the two); a single CPU core running skinny
    # GEMMs mostly does not (time = sum), as its micro-measurements show.
    overlap: bool = True
    flop_efficiency: float = 0.7
    train_mfu: float = 0.40
    logprob_mfu: float = 0.45
    # Host-side cost of one forward call (launch or CUDA-graph replay, input preparation) and of one
    # engine step (scheduler, detokenisation, sampling bookkeeping). Assumptions for GPUs; measured on CPU.
    forward_overhead: float = 60 * US
    layer_overhead: float = 0.0
    step_overhead: float = 1.0 * MS
    # Speculation's extra host work per engine step (drafter input preparation, rejection-sampler launch,
    # slot bookkeeping for a variable number of accepted tokens) and per proposed token (one drafter
    # forward's launch and argmax/sampling). Assumptions for GPUs; measured on CPU.
    spec_step_overhead: float = 1.0 * MS
    draft_token_overhead: float = 150 * US
    # Whether the engine runs that host work while the device executes the previous step (vLLM V1's
    # async scheduling, SGLang's overlap scheduler: step n + 1 is scheduled and its inputs prepared while
    # step n runs; drafting and rejection sampling stay on the device, so the host only waits for the
    # accepted counts). Then a step costs max(device, host) instead of device + host. A single CPU thread
    # that both computes and schedules cannot overlap (False for ``cpu-here``).
    host_overlap: bool = False
    # CUDA graphs cover forwards of up to ``graph_max_tokens`` tokens (vLLM's default capture limit);
    # larger forwards launch every kernel from the host, costing ``eager_layer_overhead`` per layer of
    # host time that overlaps with the device work (time = max(device, host)).
    graph_max_tokens: int = 512
    eager_layer_overhead: float = 150 * US
    # A small kernel (sampler, rejection sampler) costs at least this much.
    kernel_overhead: float = 8 * US
    # Measured samplers (CPU) cost this per vocabulary element instead of a bandwidth-bound read.
    sampler_element_time: float | None = None
    notes: str = field(default="", compare=False)

    def flops(self, dtype: str) -> float:
        """Dense peak FLOP/s for ``dtype``; raises ``ValueError`` naming the dtype if unknown."""
        try:
            return self.dense_flops[dtype]
        except KeyError:
            raise ValueError(f"dtype {dtype!r} has no FLOP/s entry for {self.name} "
                             f"(known: {sorted(self.dense_flops)})") from None

    def with_(self, **changes) -> Hardware:
        """A copy with some fields changed (for sweeps and calibration)."""
        return replace(self, **changes)


# Datasheet numbers (dense). NVLink bandwidths are the per-GPU aggregate divided by two (one direction).
# H100 SXM5: 3.35 TB/s HBM3, 80 GB; 989 TFLOP/s BF16, 1979 FP8; NVLink 4 900 GB/s; ConnectX-7 400 Gb/s.
H100 = Hardware(
    name="H100",
    hbm_bandwidth=3.35 * TB,
    dense_flops={"bf16": 989 * TFLOPS, "fp16": 989 * TFLOPS, "fp8": 1979 * TFLOPS, "fp32": 67 * TFLOPS},
    hbm_capacity=80 * GB,
    scaleup_bandwidth=450 * GB, scaleup_latency=3 * US, scaleup_domain=8,
    scaleout_bandwidth=50 * GB, scaleout_latency=6 * US,
)
# H200 SXM: same compute as H100; 4.8 TB/s HBM3e, 141 GB.
H200 = H100.with_(name="H200", hbm_bandwidth=4.8 * TB, hbm_capacity=141 * GB)
# B200 (HGX B200): 8 TB/s HBM3e, 180 GB; 2.25 PFLOP/s BF16 dense, 4.5 FP8 dense; NVLink 5 1.8 TB/s.
B200 = Hardware(
    name="B200",
    hbm_bandwidth=8.0 * TB,
    dense_flops={"bf16": 2250 * TFLOPS, "fp16": 2250 * TFLOPS, "fp8": 4500 * TFLOPS, "fp32": 80 * TFLOPS},
    hbm_capacity=180 * GB,
    scaleup_bandwidth=900 * GB, scaleup_latency=3 * US, scaleup_domain=8,
    scaleout_bandwidth=50 * GB, scaleout_latency=6 * US,
)
# GB200 NVL72, per GPU: 8 TB/s HBM3e, 186 GB; 2.5 PFLOP/s BF16 dense, 5 FP8 dense (the rack's 360/720
# PFLOP/s are quoted with sparsity); NVLink 5 1.8 TB/s in a 72-GPU domain; ConnectX-7 400 Gb/s.
GB200 = Hardware(
    name="GB200",
    hbm_bandwidth=8.0 * TB,
    dense_flops={"bf16": 2500 * TFLOPS, "fp16": 2500 * TFLOPS, "fp8": 5000 * TFLOPS, "fp32": 80 * TFLOPS},
    hbm_capacity=186 * GB,
    scaleup_bandwidth=900 * GB, scaleup_latency=3 * US, scaleup_domain=72,
    scaleout_bandwidth=50 * GB, scaleout_latency=6 * US,
)

HARDWARE: dict[str, Hardware] = {h.name: h for h in (H100, H200, B200, GB200)}


def get_hardware(name: str) -> Hardware:
    """Look up a GPU preset by name (case-insensitive); ``ValueError`` lists the known names."""
    for key, hw in HARDWARE.items():
        if key.lower() == name.lower():
            return hw
    raise ValueError(f"unknown hardware {name!r}; known: {sorted(HARDWARE)} (cpu-here: rl_loop.sim.calibrate)")
