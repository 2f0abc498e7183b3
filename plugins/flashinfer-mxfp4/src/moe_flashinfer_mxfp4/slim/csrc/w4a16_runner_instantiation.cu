// moe-flashinfer-mxfp4's replacement for FlashInfer's cutlass_fused_moe_instantiation.cu in the slim
// SM90 W4A16 module: instantiate the fused-MoE runner for bf16 activations x MXFP4 weights only.
// FlashInfer's file instantiates the runner for every dtype combination its CUTLASS MoE supports, and
// each instantiation pulls in that combination's grouped GEMMs; everything else the binding still
// names is answered by generated stubs that raise (see moe_flashinfer_mxfp4/slim/stubs.py).
#include "cutlass_fused_moe_kernels.cuh"
#include "moe_kernels.h"

namespace tensorrt_llm::kernels::cutlass_kernels {
template class CutlassMoeFCRunner<__nv_bfloat16, Fp4Type>;
INSTANTIATE_FINALIZE_MOE_ROUTING(__nv_bfloat16, __nv_bfloat16, __nv_bfloat16);
}  // namespace tensorrt_llm::kernels::cutlass_kernels
