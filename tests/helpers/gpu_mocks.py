"""A stand-in for torch.cuda on this CPU-only machine: tests of CUDA logic say so and use this fixture."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import torch


@dataclass
class FakeCuda:
    """What the mocked torch.cuda reports, and what was asked of it."""

    name: str = "NVIDIA H100 80GB HBM3"
    capability: tuple[int, int] = (9, 0)
    count: int = 1
    set_device_calls: list = field(default_factory=list)


@pytest.fixture
def fake_cuda(monkeypatch):
    """Mock torch.cuda (is_available, device_count, set_device, name, capability); restores the TF32 flags after."""
    fake = FakeCuda()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: fake.count)
    monkeypatch.setattr(torch.cuda, "set_device", lambda index: fake.set_device_calls.append(index))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=None: fake.name)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: fake.capability)
    saved = (torch.backends.cuda.matmul.fp32_precision, torch.backends.cudnn.conv.fp32_precision)
    yield fake
    torch.backends.cuda.matmul.fp32_precision, torch.backends.cudnn.conv.fp32_precision = saved
