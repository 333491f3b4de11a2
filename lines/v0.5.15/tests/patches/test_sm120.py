"""Tests for the v0.5.15 line's 0001-sm120-support.patch (SM120 / RTX PRO 6000 Blackwell).

0.5.15 selects fusion with --flashinfer-allreduce-fusion-backend, auto-enables it in
arg_groups/overrides.py and survives a failed fusion workspace itself; the patch admits SM120 in
the gate, keeps the FlashInfer route's deferred all-reduce when the fused op declines, and gives
torch symmetric memory a capability-12 row.

Each test reports a device capability through the query SGLang itself uses
(`torch.cuda.is_available`, `torch.version.cuda`, `torch.cuda.get_device_capability`),
clears the `lru_cache` of SGLang's `is_sm*_supported` helpers, and re-imports
`layers/communicator.py`, whose gate flags are computed at import time. The
patched functions are then called for real; only FlashInfer (which cannot run
on CPU) and the collective itself are stood in for.
"""

from __future__ import annotations

import importlib
import logging
from types import SimpleNamespace

import pytest
import torch

CAPABILITIES = {"sm120": (12, 0), "sm100": (10, 0), "sm90": (9, 0), "sm80": (8, 0)}
KIMI = "KimiK25ForConditionalGeneration"


def _clear_capability_caches():
    from sglang.srt.utils import common

    for name in (
        "is_cuda",
        "is_sm90_supported",
        "is_sm100_supported",
        "is_sm120_supported",
        "is_blackwell_supported",
        "is_hopper_with_cuda_12_3",
        "is_ampere_with_cuda_12_3",
    ):
        getattr(common, name).cache_clear()


def _report_capability(monkeypatch, capability):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *args, **kwargs: capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *args, **kwargs: "GPU")
    _clear_capability_caches()


@pytest.fixture
def device(monkeypatch):
    """`device(cap)` reports `cap` and returns `communicator` re-imported under it."""
    import sglang.srt.configs.model_config  # noqa: F401  (import on the CPU first)
    import sglang.srt.layers.communicator as communicator

    def report(capability):
        _report_capability(monkeypatch, capability)
        return importlib.reload(communicator)

    yield report
    monkeypatch.undo()
    _clear_capability_caches()
    importlib.reload(communicator)


def _gate(communicator, monkeypatch, *, backend, batch_size=4):
    monkeypatch.setattr(communicator, "_is_flashinfer_available", True)
    monkeypatch.setattr(
        communicator,
        "get_global_server_args",
        lambda: SimpleNamespace(flashinfer_allreduce_fusion_backend=backend, attn_cp_size=1),
    )
    return communicator.apply_flashinfer_allreduce_fusion(batch_size)


@pytest.mark.parametrize("arch", ["sm120", "sm100", "sm90"])
def test_fusion_gate_follows_flag(device, monkeypatch, arch):
    communicator = device(CAPABILITIES[arch])
    assert _gate(communicator, monkeypatch, backend="trtllm") is True
    assert _gate(communicator, monkeypatch, backend=None) is False


def test_fusion_gate_off_on_sm80(device, monkeypatch):
    communicator = device(CAPABILITIES["sm80"])
    assert _gate(communicator, monkeypatch, backend="trtllm") is False
    assert _gate(communicator, monkeypatch, backend=None) is False


@pytest.mark.parametrize("arch", ["sm120", "sm100", "sm90", "sm80"])
def test_backend_resolution(device, arch):
    """What --flashinfer-allreduce-fusion-backend resolves to: without SM120 here, any backend on
    SM120 raised "requires SM90 or SM10X" at the first fused layer."""
    import sglang.srt.layers.flashinfer_comm_fusion as fusion

    device(CAPABILITIES[arch])
    if arch == "sm80":
        with pytest.raises(ValueError, match="requires"):
            fusion._resolve_backend("auto")
        return
    want_auto = {"sm120": "trtllm", "sm100": "mnnvl", "sm90": "trtllm"}[arch]
    assert fusion._resolve_backend("auto") == want_auto
    assert fusion._resolve_backend("trtllm") == "trtllm"
    if arch == "sm120":
        for backend, multi_node in (("mnnvl", False), ("auto", True), ("trtllm", True)):
            with pytest.raises(ValueError, match="SM120"):
                fusion._resolve_backend(backend, multi_node)


def _auto_enabled(backend=None):
    """0.5.15's own auto-enable pass, on a single-node TP 8 Kimi-K2.5 server."""
    from sglang.srt.arg_groups import overrides

    view = SimpleNamespace(
        flashinfer_allreduce_fusion_backend=backend,
        get_model_config=lambda: SimpleNamespace(hf_config=SimpleNamespace(architectures=[KIMI])),
        tp_size=8,
        enable_dp_attention=False,
        nnodes=1,
        moe_a2a_backend="none",
    )
    return overrides._flashinfer_allreduce_fusion_auto_enable(view).get("flashinfer_allreduce_fusion_backend")


# (auto-enabled without the flag, fusion applies with an explicit backend)
AUTO_ENABLE_RULE = {
    "sm120": (False, True),  # PCIe, no NVLink: opt-in via --flashinfer-allreduce-fusion-backend
    "sm100": (True, True),
    "sm90": (True, True),
    "sm80": (False, False),
}


@pytest.mark.parametrize("arch", list(AUTO_ENABLE_RULE))
def test_auto_enable_rule(device, monkeypatch, arch):
    communicator = device(CAPABILITIES[arch])
    auto_enabled, explicit_applies = AUTO_ENABLE_RULE[arch]
    assert (_auto_enabled() == "auto") is auto_enabled
    assert _gate(communicator, monkeypatch, backend="trtllm") is explicit_applies


@pytest.fixture
def fusion_module(monkeypatch):
    """`layers/flashinfer_comm_fusion.py` with its functions callable on the CPU.

    SGLang registers `flashinfer_allreduce_residual_rmsnorm` as a torch custom op for the
    CUDA dispatch key only; re-import the module with `register_custom_op` as the identity
    so the same Python function runs on CPU tensors.
    """
    import sglang.srt.layers.flashinfer_comm_fusion as fusion
    import sglang.srt.utils.custom_op as custom_op

    def identity(fn=None, **kwargs):
        return fn if fn is not None else (lambda f: f)

    monkeypatch.setattr(custom_op, "register_custom_op", identity)
    yield importlib.reload(fusion)
    monkeypatch.undo()
    importlib.reload(fusion)


@pytest.mark.parametrize("arch", ["sm120", "sm90"])
def test_workspace_init_failure_disables_fusion(device, fusion_module, monkeypatch, arch):
    """After a failed workspace (0.5.15 marks fusion unavailable itself), the real fused op
    declines; the norm must then do the all-reduce its caller skipped."""
    import sglang.srt.distributed as distributed
    import sglang.srt.layers.layernorm as layernorm

    fusion = fusion_module
    communicator = device(CAPABILITIES[arch])
    world_size = 2
    parallel = SimpleNamespace(attn_tp_size=world_size, attn_tp_rank=0, moe_ep_size=1, moe_tp_size=world_size)
    monkeypatch.setattr(fusion, "_flashinfer_comm", SimpleNamespace())
    monkeypatch.setattr(fusion, "is_flashinfer_available", lambda: True)
    monkeypatch.setattr(fusion, "get_parallel", lambda: parallel)
    monkeypatch.setattr(layernorm, "get_parallel", lambda: parallel)
    monkeypatch.setattr(fusion, "_flashinfer_allreduce_unavailable", True)
    # Every rank holds the same partial sum, so the all-reduce multiplies by world_size.
    monkeypatch.setattr(distributed, "tensor_model_parallel_all_reduce", lambda t: t * world_size)

    assert fusion.flashinfer_allreduce_residual_rmsnorm(torch.randn(3, 16), torch.randn(3, 16), torch.ones(16)) == (
        None,
        None,
    ), "the fused op declines once the workspace has failed"
    assert _gate(communicator, monkeypatch, backend="trtllm") is False

    torch.manual_seed(0)
    norm = layernorm.RMSNorm(16, eps=1e-6)
    with torch.no_grad():
        norm.weight.copy_(torch.rand(16) + 0.5)
    x, residual = torch.randn(3, 16), torch.randn(3, 16)
    want_out, want_residual = norm.forward_native(x * world_size, residual.clone())
    out, new_residual = norm.forward_with_allreduce_fusion(x.clone(), residual.clone())
    torch.testing.assert_close(out, want_out)
    torch.testing.assert_close(new_residual, want_residual)


# Capability major -> expected (max_size for 8 ranks, multimem?) or None if unsupported.
SYMM_MEM = {
    "sm120": (12, 128 * 1024 * 1024, False),
    "sm100": (10, 128 * 1024 * 1024, True),
    "sm90": (9, 128 * 1024 * 1024, True),
    "sm80": (8, None, None),
    "sm130-unknown": (13, None, None),
}


@pytest.mark.parametrize("arch", list(SYMM_MEM))
def test_torch_symm_mem_capability(monkeypatch, arch, caplog):
    import sglang.srt.distributed.device_communicators.torch_symm_mem as tsm

    major, want_max_size, want_multimem = SYMM_MEM[arch]
    _report_capability(monkeypatch, (major, 0))
    rendezvous = SimpleNamespace(multicast_ptr=0)
    monkeypatch.setattr(tsm, "torch_symm_mem_available", True)
    monkeypatch.setattr(
        tsm,
        "torch_symm_mem",
        SimpleNamespace(
            empty=lambda n, device, dtype: torch.empty(n, dtype=dtype),
            rendezvous=lambda buffer, name: rendezvous,
        ),
        raising=False,
    )
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: None)
    monkeypatch.setattr(tsm.dist, "get_world_size", lambda group=None: 8)
    group = SimpleNamespace(group_name="tp")

    with caplog.at_level(logging.WARNING, logger=tsm.__name__):
        comm = tsm.TorchSymmMemCommunicator(group, 0)
    assert comm.device_capability == major
    assert comm.disabled  # no multicast on the fake (as on PCIe): disabled, no crash
    if want_max_size is None:
        assert comm.max_size == 0  # 0.5.15 starts every communicator at 0 and disabled
        assert "not available" in caplog.text
        return
    assert comm.max_size == want_max_size

    # The kernel choice for this capability: multimem or the two-shot fallback.
    calls = []
    monkeypatch.setattr(
        torch.ops,
        "symm_mem",
        SimpleNamespace(
            multimem_all_reduce_=lambda buf, op, name: calls.append("multimem"),
            two_shot_all_reduce_=lambda buf, op, name: calls.append("two_shot"),
        ),
    )
    comm.buffer = torch.zeros(64, dtype=torch.bfloat16)
    inp = torch.ones(8, dtype=torch.bfloat16)
    # As with multicast available: 0.5.15 refuses a disabled communicator or another device.
    comm.disabled, comm.device = False, inp.device
    out = comm.all_reduce(inp)
    assert calls == (["multimem"] if want_multimem else ["two_shot"])
    torch.testing.assert_close(out, inp)
