// The cudnn backend's engine: a convolution with its epilogue, act(conv(x, w) + bias +
// residual), as one cuDNN operation graph (the graph API, cudnn_graph.h). The generated
// entry points (templates/cudnn/entries.cc.j2) describe each partition's conv as plain data;
// create builds its graph and execution plan once per model instance, run only executes.
#ifndef BYOC_CUDNN_H_
#define BYOC_CUDNN_H_

#include <cstddef>
#include <cstdint>

// Visible from the engine's object: a model library's export map hides them again; the
// build's plan timing (plans.py) calls them in a library of the engine alone.
#define BYOC_CUDNN_API __attribute__((visibility("default")))

extern "C" {

enum ByocCudnnDtype { BYOC_CUDNN_FLOAT32 = 0, BYOC_CUDNN_FLOAT16 = 1, BYOC_CUDNN_BFLOAT16 = 2 };

enum ByocCudnnActivation {
  BYOC_CUDNN_NO_ACTIVATION = 0,
  BYOC_CUDNN_RELU = 1,
  BYOC_CUDNN_GELU = 2,       // 0.5 x (1 + erf(x / sqrt 2))
  BYOC_CUDNN_GELU_TANH = 3,  // the tanh approximation
  BYOC_CUDNN_SILU = 4,       // x * sigmoid(x) (cuDNN's swish, beta 1)
  BYOC_CUDNN_SIGMOID = 5,
};

// One NHWC conv2d: data [batch, height, width, channels], weight [out_channels, kernel_h,
// kernel_w, channels / groups], output [batch, out_h, out_w, out_channels]; bias
// [out_channels] and residual (the output's shape) when present, all of one dtype.
struct ByocCudnnConv {
  int32_t dtype;  // ByocCudnnDtype
  int64_t batch, height, width, channels;
  int64_t out_channels, kernel_h, kernel_w, groups;
  int64_t out_h, out_w;
  int64_t strides[2];    // height, width
  int64_t pads[4];       // top, left, bottom, right
  int64_t dilations[2];  // height, width
  int32_t has_bias, has_residual;
  int32_t activation;  // ByocCudnnActivation
  // the cuDNN engine (its global index) the build chose by timing on this GPU model; -1:
  // the heuristic's first plan that builds within workspace_limit
  int64_t engine;
  int64_t workspace_limit;  // bytes
  // float32 only: 1 lets cuDNN's engines on tensor cores (TF32) run the conv, 0 leaves them
  // out (exact float32; the config's tf32 key)
  int32_t tf32;
};

// Builds the graph and its plan on the current device. 0 on success; otherwise *state is
// null and byoc_cudnn_last_error() says why.
BYOC_CUDNN_API int byoc_cudnn_conv_create(const ByocCudnnConv* conv, void** state);
BYOC_CUDNN_API void byoc_cudnn_conv_destroy(void* state);
// The workspace run() needs (at most the conv's workspace_limit).
BYOC_CUDNN_API size_t byoc_cudnn_conv_workspace(const void* state);
// The global index of the engine create() chose.
BYOC_CUDNN_API int64_t byoc_cudnn_conv_engine(const void* state);
// One conv on `stream`; bias and residual are null where the conv has none.
BYOC_CUDNN_API int byoc_cudnn_conv_run(void* state, const void* data, const void* weight, const void* bias,
                                       const void* residual, void* output, void* workspace, size_t workspace_bytes,
                                       void* stream);
// What the check before a plan's timing found (cudnn_plan_timing.cc says how it checks).
enum ByocCudnnPlanVerdict {
  BYOC_CUDNN_PLAN_AGREES = 0,          // a candidate
  BYOC_CUDNN_PLAN_READS_LEFTOVERS = 1,  // its output depends on what output or workspace held
  BYOC_CUDNN_PLAN_DISAGREES = 2,        // its output differs from the other plans'
  BYOC_CUDNN_PLAN_NOT_FINITE = 3,       // NaN or infinity from finite operands
};

// The build's measurement of plans (backends/cudnn/plans.py), in two steps so that the
// slow one runs side by side: prepare builds the conv's graph and the heuristics' first
// plans that build within workspace_limit (at most max_plans), with a cuDNN handle of its
// own (safe in several threads at once); time_prepared checks and times them on scratch
// operands of the conv's shapes, taken in turn through more memory than L2 holds:
// engines[i] got verdicts[i] and, where it is a candidate, ran in microseconds[i] (a
// launch's share of at least `runs` back to back, the median of three rounds), *count of
// them; run it with nothing else on the GPU. release frees what prepare made.
BYOC_CUDNN_API int byoc_cudnn_conv_prepare_plans(const ByocCudnnConv* conv, int max_plans, void** prepared);
BYOC_CUDNN_API int byoc_cudnn_conv_time_prepared(void* prepared, int runs, int64_t* engines, double* microseconds,
                                                 int32_t* verdicts, int* count);
BYOC_CUDNN_API void byoc_cudnn_conv_release_plans(void* prepared);
// The last error of this thread.
BYOC_CUDNN_API const char* byoc_cudnn_last_error(void);
// cudnnGetVersion() of the library loaded.
BYOC_CUDNN_API size_t byoc_cudnn_version(void);

}  // extern "C"

#endif  // BYOC_CUDNN_H_
