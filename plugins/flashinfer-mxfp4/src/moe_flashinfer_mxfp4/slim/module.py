"""Load the slim module and call FlashInfer's binding in it — by parameter name, read from the binding's source.

The slim library contains FlashInfer's own binding
(``flashinfer_cutlass_fused_moe_binding.cu``), whose ``run_moe`` takes ~28
positional arguments and gains some between releases (0.7 added
``clamped_relu2_limit``, ``situ_*`` and ``nvfp4_4over6_code``). FlashInfer's
Python wrapper, which knows that order, is hard-wired to its full module, so
this one reads the parameter list of the installed binding source (the one the
library was compiled from) and fills it by name. A parameter it has no value
for makes the slim path unavailable with that name in the reason, instead of
a call with misplaced arguments.
"""

from __future__ import annotations

import re
import threading
from pathlib import Path

import torch

from moe_flashinfer_mxfp4.slim.sources import SlimUnsupported

BINDING = "fused_moe/cutlass_backend/flashinfer_cutlass_fused_moe_binding.cu"
#: quant_type of FlashInfer's interleave kernel for MXFP4 consumed by the W4A16 GEMM
INTERLEAVE_FP4 = 1
#: run_moe parameters that are constant for this backend (single GPU, no all-to-all, not min-latency)
CONSTANT_ARGS = {
    "input_sf": None,
    "clamped_relu2_limit": None,
    "situ_beta": None,
    "situ_linear_beta": None,
    "swizzled_input_sf": True,
    "tp_size": 1,
    "tp_rank": 0,
    "ep_size": 1,
    "ep_rank": 0,
    "cluster_size": 1,
    "cluster_rank": 0,
    "enable_alltoall": False,
    "min_latency_mode": False,
    "profile_ids": [-1, -1],  # FlashInfer's own choice when its autotuner has not run: the default tactic
    "workspace_buffer": None,
    "nvfp4_4over6_code": 0,  # 0 = off (NVFP4 only)
}
#: run_moe parameters taken from the caller's keyword arguments (FlashInfer's cutlass_fused_moe names)
CALL_ARGS = (
    "output",
    "input",
    "token_selected_experts",
    "token_final_scales",
    "fc1_expert_weights",
    "fc1_expert_biases",
    "fc2_expert_weights",
    "fc2_expert_biases",
    "quant_scales",
    "swiglu_alpha",
    "swiglu_beta",
    "swiglu_limit",
)


def _param_names(params: str) -> list[str]:
    names = []
    depth, current = 0, ""
    for ch in params:  # split on top-level commas (types like Optional<Array<int64_t>> hold none, but be safe)
        if ch in "<(":
            depth += 1
        elif ch in ">)":
            depth -= 1
        if ch == "," and depth == 0:
            names.append(current)
            current = ""
        else:
            current += ch
    names.append(current)
    out = []
    for decl in names:
        decl = decl.split("=")[0].strip()
        if decl:
            out.append(re.findall(r"[A-Za-z_]\w*", decl)[-1])
    return out


def binding_parameters(binding_source: str, function: str = "run_moe") -> list[str]:
    """Parameter names of the ``GetFunction("run_moe")`` lambda (or a free function) in the binding source."""
    pattern = r'name == "' + re.escape(function) + r'"\)\s*\{\s*return Function::FromTyped\(\s*\[[^\]]*\]\(([^)]*)\)'
    lam = re.search(pattern, binding_source)
    if lam:
        return _param_names(lam.group(1))
    free = re.search(r"\n[\w:<>]+\s+" + re.escape(function) + r"\(([^)]*)\)\s*\{", binding_source)
    if free:
        return _param_names(free.group(1))
    raise SlimUnsupported(f"FlashInfer's binding source has no `{function}` entry point this backend can read")


def read_binding_source() -> str:
    from flashinfer.jit import env as jit_env

    return (Path(jit_env.FLASHINFER_CSRC_DIR) / BINDING).read_text()


def check_binding(binding_source: str) -> list[str]:
    """The run_moe parameter order, after checking every parameter has a value here and the other entry points."""
    run_moe = binding_parameters(binding_source, "run_moe")
    known = set(CONSTANT_ARGS) | set(CALL_ARGS) | {"profile_ids", "enable_pdl", "base_activation_type"}
    unknown = [p for p in run_moe if p not in known]
    if unknown:
        raise SlimUnsupported(
            f"FlashInfer's run_moe takes parameter(s) this backend has no value for: {', '.join(unknown)}"
        )
    init = binding_parameters(binding_source, "init")
    expected_init = [
        "activation_dtype",
        "weight_dtype",
        "output_dtype",
        "use_deepseek_fp8_block_scale",
        "use_w4_group_scaling",
        "use_mxfp8_act_scaling",
        "use_packed_weights",
        "use_fused_finalize",
        "use_wfp4afp8_humming",
    ]
    if init != expected_init:
        raise SlimUnsupported(f"FlashInfer's binding init takes ({', '.join(init)}), not the expected 9 flags")
    interleave = binding_parameters(binding_source, "interleave_moe_weights_for_sm90_mixed_gemm")
    if interleave != ["weight", "weight_interleaved", "quant_type"]:
        raise SlimUnsupported(f"FlashInfer's weight interleave entry point takes ({', '.join(interleave)})")
    return run_moe


class SlimW4A16Module:
    """The loaded slim library: FlashInfer's W4A16 weight interleave and fused MoE, nothing else."""

    def __init__(self, library: Path, binding_source: str | None = None) -> None:
        self.run_moe_params = check_binding(binding_source if binding_source is not None else read_binding_source())
        import tvm_ffi

        self.library = Path(library)
        self._module = tvm_ffi.load_module(str(self.library))
        self._runners: dict[bool, object] = {}
        self._lock = threading.Lock()

    # ---- weights --------------------------------------------------------------------------------
    def interleave_moe_weights_for_sm90_mixed_gemm(self, weight: torch.Tensor, quant_type: str = "fp4") -> torch.Tensor:
        """Same contract as FlashInfer's helper of that name (fp4 only): uint8 [E, n, k/2] on CUDA -> new tensor."""
        if quant_type != "fp4":
            raise ValueError(f"the slim W4A16 module interleaves MXFP4 ('fp4') weights only, not {quant_type!r}")
        if weight.dim() != 3 or weight.dtype != torch.uint8 or not weight.is_cuda:
            raise ValueError(f"weight must be a 3-D uint8 CUDA tensor; got {weight.dtype} {tuple(weight.shape)}")
        weight = weight.contiguous()
        out = torch.empty_like(weight)
        self._module.interleave_moe_weights_for_sm90_mixed_gemm(weight, out, INTERLEAVE_FP4)
        return out

    # ---- forward --------------------------------------------------------------------------------
    def _runner(self, use_fused_finalize: bool):
        with self._lock:
            runner = self._runners.get(use_fused_finalize)
            if runner is None:
                runner = self._module.init(
                    torch.bfloat16, torch.uint8, torch.bfloat16, False, True, False, False, use_fused_finalize, False
                )
                self._runners[use_fused_finalize] = runner
            return runner

    def cutlass_fused_moe(self, *, activation_type, use_fused_finalize: bool = False, **kwargs) -> torch.Tensor:
        """FlashInfer's ``cutlass_fused_moe(use_w4_group_scaling=True)`` keywords, run on the slim module."""
        if not kwargs.pop("use_w4_group_scaling", True):
            raise ValueError("the slim module runs the W4A16 path only (use_w4_group_scaling=True)")
        if kwargs.pop("output_dtype", torch.bfloat16) != torch.bfloat16:
            raise ValueError("the slim W4A16 module writes bf16 output only")
        unknown = sorted(set(kwargs) - set(CALL_ARGS))
        if unknown:  # a keyword this module would silently drop: refuse instead
            raise TypeError(f"the slim W4A16 module does not take {', '.join(unknown)}")
        x = kwargs["input"]
        if kwargs.get("output") is None:
            kwargs["output"] = torch.empty(
                x.shape[0], kwargs["fc2_expert_weights"].shape[1], dtype=torch.bfloat16, device=x.device
            )
        values = dict(CONSTANT_ARGS)
        values.update({name: kwargs.get(name) for name in CALL_ARGS})
        values["enable_pdl"] = _pdl(x.device)
        values["base_activation_type"] = int(activation_type)
        self._runner(use_fused_finalize).run_moe(*(values[p] for p in self.run_moe_params))
        return kwargs["output"]


def _pdl(device: torch.device) -> bool:
    """Programmatic dependent launch, as FlashInfer decides it (SM90+)."""
    try:
        from flashinfer.utils import device_support_pdl

        return bool(device_support_pdl(device))
    except ImportError:
        return torch.cuda.get_device_capability(device)[0] >= 9
