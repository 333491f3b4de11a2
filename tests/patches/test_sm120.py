"""Tests for patches/0001-sm120-support.patch (SM120 / RTX PRO 6000 Blackwell).

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

from sglang_cpu import server_args_with_defaults

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


def _server_args(**overrides):
    return server_args_with_defaults(**{"model_path": "moonshotai/Kimi-K2.5", "tp_size": 8, **overrides})


def _gate(communicator, monkeypatch, *, flag, batch_size=4):
    monkeypatch.setattr(communicator, "_is_flashinfer_available", True)
    monkeypatch.setattr(
        communicator,
        "get_global_server_args",
        # attn_cp_size: v0.5.10's gate also reads it.
        lambda: SimpleNamespace(enable_flashinfer_allreduce_fusion=flag, attn_cp_size=1),
    )
    return communicator.apply_flashinfer_allreduce_fusion(batch_size)


@pytest.mark.parametrize("arch", ["sm120", "sm100", "sm90"])
def test_fusion_gate_follows_flag(device, monkeypatch, arch):
    communicator = device(CAPABILITIES[arch])
    assert _gate(communicator, monkeypatch, flag=True) is True
    assert _gate(communicator, monkeypatch, flag=False) is False


def test_fusion_gate_off_on_sm80(device, monkeypatch):
    communicator = device(CAPABILITIES["sm80"])
    assert _gate(communicator, monkeypatch, flag=True) is False
    assert _gate(communicator, monkeypatch, flag=False) is False


def _adjusted_server_args(monkeypatch, **overrides):
    """Run the real model-specific adjustments (which hold the auto-enable rule)."""
    args = _server_args(**overrides)
    hf_config = SimpleNamespace(architectures=[KIMI], quantization_config=None)
    monkeypatch.setattr(
        type(args),
        "get_model_config",
        lambda self: SimpleNamespace(hf_config=hf_config),
    )
    args._handle_model_specific_adjustments()
    return args


# (auto-enabled without the flag, fusion applies with the explicit flag)
AUTO_ENABLE_RULE = {
    "sm120": (False, True),  # PCIe, no NVLink: opt-in via --enable-flashinfer-allreduce-fusion
    "sm100": (True, True),
    "sm90": (True, True),
    "sm80": (False, False),
}


@pytest.mark.parametrize("arch", list(AUTO_ENABLE_RULE))
def test_auto_enable_rule(device, monkeypatch, arch):
    communicator = device(CAPABILITIES[arch])
    auto_enabled, explicit_applies = AUTO_ENABLE_RULE[arch]

    args = _adjusted_server_args(monkeypatch)
    assert args.enable_flashinfer_allreduce_fusion is auto_enabled

    args = _adjusted_server_args(monkeypatch, enable_flashinfer_allreduce_fusion=True)
    assert args.enable_flashinfer_allreduce_fusion is True
    monkeypatch.setattr(communicator, "_is_flashinfer_available", True)
    monkeypatch.setattr(communicator, "get_global_server_args", lambda: args)
    assert communicator.apply_flashinfer_allreduce_fusion(4) is explicit_applies


class _UnsupportedArchFlashInferComm:
    """Stands in for `flashinfer.comm` on a GPU its trtllm_comm module was not built for."""

    def __init__(self):
        self.create_calls = 0

    def trtllm_create_ipc_workspace_for_all_reduce_fusion(self, *args, **kwargs):
        self.create_calls += 1
        raise RuntimeError("No supported CUDA architectures found for major versions [9, 10].")

    def trtllm_allreduce_fusion(self, *args, **kwargs):  # pragma: no cover
        raise AssertionError("fused kernel called without a workspace")

    def trtllm_destroy_ipc_workspace_for_all_reduce(self, *args, **kwargs):
        pass


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
def test_workspace_init_failure_disables_fusion(device, fusion_module, monkeypatch, caplog, arch):
    import sglang.srt.distributed as distributed
    from sglang.srt.layers.layernorm import RMSNorm

    fusion = fusion_module
    communicator = device(CAPABILITIES[arch])
    world_size = 2
    fake_comm = _UnsupportedArchFlashInferComm()
    monkeypatch.setattr(fusion, "_flashinfer_comm", fake_comm)
    # 0.5.9 calls the bare import name `comm`; set it too, so that an unpatched tree
    # fails on the FlashInfer error itself rather than on a NameError.
    monkeypatch.setattr(fusion, "comm", fake_comm, raising=False)
    monkeypatch.setattr(fusion, "_workspace_manager", fusion.FlashInferWorkspaceManager())
    monkeypatch.setattr(fusion, "_flashinfer_allreduce_unavailable", False, raising=False)
    monkeypatch.setattr(fusion, "is_flashinfer_available", lambda: True)
    monkeypatch.setattr(fusion, "get_tensor_model_parallel_world_size", lambda: world_size)
    monkeypatch.setattr(fusion.dist, "get_rank", lambda *args, **kwargs: 0)
    monkeypatch.setattr(distributed, "get_tensor_model_parallel_world_size", lambda: world_size)
    # Every rank holds the same partial sum, so the all-reduce multiplies by world_size.
    monkeypatch.setattr(distributed, "tensor_model_parallel_all_reduce", lambda t: t * world_size)

    assert _gate(communicator, monkeypatch, flag=True) is True

    torch.manual_seed(0)
    norm = RMSNorm(16, eps=1e-6)
    with torch.no_grad():
        norm.weight.copy_(torch.rand(16) + 0.5)
    x, residual = torch.randn(3, 16), torch.randn(3, 16)
    want_out, want_residual = norm.forward_native(x * world_size, residual.clone())

    with caplog.at_level(logging.WARNING, logger=fusion.__name__):
        out, new_residual = norm.forward_with_allreduce_fusion(x.clone(), residual.clone())
    assert "Disabling flashinfer allreduce fusion" in caplog.text
    torch.testing.assert_close(out, want_out)
    torch.testing.assert_close(new_residual, want_residual)

    # Fusion is off from now on, and the workspace is not retried on every layer.
    assert fusion.is_flashinfer_allreduce_unavailable() is True
    assert _gate(communicator, monkeypatch, flag=True) is False
    out, _ = norm.forward_with_allreduce_fusion(x.clone(), residual.clone())
    torch.testing.assert_close(out, want_out)
    assert fake_comm.create_calls == 1


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
        assert not hasattr(comm, "max_size")
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
    out = comm.all_reduce(inp)
    assert calls == (["multimem"] if want_multimem else ["two_shot"])
    torch.testing.assert_close(out, inp)
