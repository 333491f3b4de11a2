"""Tests for the v0.5.23 line's 0001-sm120-support.patch (SM120 / RTX PRO 6000 Blackwell).

0.5.23 keeps the FlashInfer fusion gate in layers/layer_boundary/residual/add_norm.py, reads the
GPU through runtime_context's platform facts, auto-enables fusion in arg_groups/overrides.py and
re-reduces by itself when the fused kernel declines. The patch admits SM120 in the gate and gives
torch symmetric memory a capability-12 row. Capabilities are reported through SGLang's own
`override_platform` (the gate) and the device query torch answers (symmetric memory); the patched
functions run for real.
"""

from __future__ import annotations

import importlib
import logging
from types import SimpleNamespace

import pytest
import torch

PLATFORMS = {
    "sm120": {"is_sm90": False, "is_sm100": False, "is_sm120": True},
    "sm100": {"is_sm90": False, "is_sm100": True, "is_sm120": False},
    "sm90": {"is_sm90": True, "is_sm100": False, "is_sm120": False},
    "sm80": {"is_sm90": False, "is_sm100": False, "is_sm120": False},
}
KIMI = "KimiK25ForConditionalGeneration"


@pytest.fixture
def platform(monkeypatch):
    """`platform(arch)` makes SGLang see that GPU and returns add_norm re-imported under it."""
    from sglang.srt.layers.layer_boundary.residual import add_norm
    from sglang.srt.runtime_context import override_platform
    from sglang.srt.utils import common

    overrides = []

    def enter(arch):
        _report_capability(monkeypatch, (12, 0))  # add_norm asks is_cuda() itself
        o = override_platform(is_cuda=True, is_blackwell=arch in ("sm100", "sm120"), **PLATFORMS[arch])
        o.__enter__()
        overrides.append(o)
        return importlib.reload(add_norm)

    yield enter
    for o in reversed(overrides):
        o.__exit__(None, None, None)
    monkeypatch.undo()
    common.is_cuda.cache_clear()
    importlib.reload(add_norm)


def _gate(add_norm, monkeypatch, *, backend, batch_size=4):
    monkeypatch.setattr(add_norm, "_is_flashinfer_available", True)
    monkeypatch.setattr(add_norm, "is_dp_attention_enabled", lambda: False)
    monkeypatch.setattr(add_norm, "uses_cutedsl_ar_fusion", lambda: False)
    monkeypatch.setattr(add_norm, "is_flashinfer_allreduce_unavailable", lambda: False)
    monkeypatch.setattr(
        add_norm, "get_exec", lambda: SimpleNamespace(comm=SimpleNamespace(flashinfer_allreduce_fusion_backend=backend))
    )
    return add_norm.flashinfer_ar_fusion_applies(batch_size)


@pytest.mark.parametrize("arch", ["sm120", "sm100", "sm90"])
def test_fusion_gate_follows_flag(platform, monkeypatch, arch):
    add_norm = platform(arch)
    assert _gate(add_norm, monkeypatch, backend="trtllm") is True
    assert _gate(add_norm, monkeypatch, backend=None) is False


def test_fusion_gate_off_on_sm80(platform, monkeypatch):
    add_norm = platform("sm80")
    assert _gate(add_norm, monkeypatch, backend="trtllm") is False
    assert _gate(add_norm, monkeypatch, backend=None) is False


@pytest.mark.parametrize("arch", ["sm120", "sm100", "sm90", "sm80"])
def test_backend_resolution(platform, arch):
    """What --flashinfer-allreduce-fusion-backend resolves to: without SM120 here, any backend on
    SM120 raised "requires SM90 or SM10X" at the first fused layer."""
    import sglang.srt.layers.flashinfer_comm_fusion as fusion

    platform(arch)
    if arch == "sm80":
        with pytest.raises(ValueError, match="requires"):
            fusion._resolve_backend("auto")
        return
    want_auto = {"sm120": "trtllm", "sm100": "mnnvl", "sm90": "trtllm"}[arch]
    assert fusion._resolve_backend("auto") == want_auto
    assert fusion._resolve_backend("trtllm") == "trtllm"
    if arch == "sm120":
        for backend, multi_node in (("mnnvl", False), ("auto", True), ("trtllm", True), ("cutedsl", False)):
            with pytest.raises(ValueError, match="SM120"):
                fusion._resolve_backend(backend, multi_node)


def _auto_enabled(monkeypatch):
    """0.5.23's own auto-enable pass, on a single-node TP 8 Kimi-K2.5 server."""
    from sglang.srt.arg_groups import overrides

    hf_config = SimpleNamespace(architectures=[KIMI], model_type="kimi_k25", hidden_size=7168)
    monkeypatch.setattr(overrides, "model_config_of", lambda view: SimpleNamespace(hf_config=hf_config))
    monkeypatch.setattr(overrides, "attn_dp_enabled_of", lambda view: False)
    view = SimpleNamespace(
        flashinfer_allreduce_fusion_backend=None,
        tp_size=8,
        nnodes=1,
        moe_a2a_backend="none",
        disable_custom_all_reduce=False,
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
def test_auto_enable_rule(platform, monkeypatch, arch):
    add_norm = platform(arch)
    auto_enabled, explicit_applies = AUTO_ENABLE_RULE[arch]
    assert (_auto_enabled(monkeypatch) == "auto") is auto_enabled
    assert _gate(add_norm, monkeypatch, backend="trtllm") is explicit_applies


def _report_capability(monkeypatch, capability):
    from sglang.srt.utils import common

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *args, **kwargs: capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *args, **kwargs: "GPU")
    common.is_cuda.cache_clear()


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
    # 0.5.23 raises every buffer to 256 MiB for its own fused kernels by default; the table the
    # patch extends is what is read without them.
    monkeypatch.setenv("SGLANG_OPT_USE_INKLING_CUSTOM_AR", "0")
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
