// The activation of a runtime-epilogue kernel (the cutlass target's runtime_epilogue): one
// compiled sm90 GEMM or conv kernel serves every epilogue the patterns fuse, its activation
// chosen per call by ByocCutlassCall::activation (the codes below) and its bias and residual
// by whether the call has them. CUTLASS's Sm90Compute hands a functor that has an Arguments
// type those arguments at run time; the switch is uniform across a launch.
#ifndef BYOC_RUNTIME_ACTIVATION_H_
#define BYOC_RUNTIME_ACTIVATION_H_

#include <cutlass/array.h>
#include <cutlass/epilogue/thread/activation.h>

namespace byoc_cutlass {

// ByocCutlassCall::activation (backends/cutlass/gemm_kernels.py: ACTIVATION_CODES)
enum ByocActivation : int {
  kByocIdentity = 0, kByocRelu = 1, kByocGelu = 2, kByocGeluTanh = 3, kByocSilu = 4, kByocSigmoid = 5,
  kByocHardSwish = 6
};

// One type for every element type: Sm90Compute keeps RuntimeActivation<ElementCompute>'s
// Arguments and passes them to RuntimeActivation<Array<ElementCompute, N>>.
struct RuntimeActivationArguments {
  int kind = kByocIdentity;
};

// T: a scalar or a cutlass::Array fragment; CUTLASS's functors have both forms.
template <class T>
struct RuntimeActivation {
  using Arguments = RuntimeActivationArguments;
  CUTLASS_HOST_DEVICE T operator()(T const& value, Arguments const& args) const {
    using namespace cutlass::epilogue::thread;
    switch (args.kind) {
      case kByocRelu: return ReLu<T>{}(value);
      case kByocGelu: return GELU<T>{}(value);
      case kByocGeluTanh: return GELU_taylor<T>{}(value);
      case kByocSilu: return SiLu<T>{}(value);
      case kByocSigmoid: return Sigmoid<T>{}(value);
      case kByocHardSwish: return HardSwish<T>{}(value);
      default: return value;
    }
  }
};

}  // namespace byoc_cutlass

#endif  // BYOC_RUNTIME_ACTIVATION_H_
