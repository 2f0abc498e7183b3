"""Test environments on a CPU machine only: let ``import torchvision`` succeed with CPU torch.

The only ``torchvision==0.28.0`` (the release paired with torch 2.13) on the package index is a CUDA build. Its
compiled ops cannot load against the CPU torch wheel, which torchvision tolerates (``_has_ops()`` is False) —
except that ``torchvision/_meta_registrations.py`` registers fake kernels for ``torchvision::nms`` and
``torchvision::qnms`` unconditionally, and ``torch.library.register_fake`` refuses an operator that was never
defined: ``RuntimeError: operator torchvision::nms does not exist``. SGLang imports torchvision through its
multimodal utilities (``sglang.srt.configs`` -> ``internvl_utils``) and transformers' image utilities, so nothing
in SGLang's MoE code needs it, yet nothing imports without it.

This defines the two operators' schemas (as torchvision's C++ would) before anything imports torchvision, so its
Python parts import; calling ``nms`` would still fail, with "no kernel", and no test calls it. Put on
``PYTHONPATH`` by ``tests/conftest.py`` (fresh interpreters the tests start inherit it); never installed.
"""

import torch

_lib = torch.library.Library("torchvision", "FRAGMENT")
_lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
_lib.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
