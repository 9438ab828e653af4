// The cudnn backend's engine (byoc_cudnn.h): a conv2d and its epilogue as one cuDNN
// operation graph, built with the backend API of cudnn_graph.h (no frontend library: the
// descriptors below are all a conv with pointwise ops needs).
//
//   x [N,C,H,W] (NHWC strides) --conv--> t0 (virtual, float32)
//        --add bias [1,K,1,1]--> t1 --add residual--> t2 --activation--> y (the dtype)
//
// The last op writes y; the ops before it write virtual float32 tensors, so cuDNN's fusion
// engines keep them in registers. A plan is chosen once, at create: the engine the build
// timed fastest on this GPU model when there is one, else the heuristic's first plan that
// builds within the workspace limit (mode A, then the fallback list).
#include "cudnn_conv_internal.h"

#include <cudnn.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstring>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

// hidden: the engine stays inside the library that links it (only byoc_cudnn.h's
// functions are its interface)
namespace __attribute__((visibility("hidden"))) byoc_cudnn_internal {

namespace {  // this source's alone, and kept out of the library's symbols
thread_local std::string g_last_error;
// why the last heuristics query proposed nothing (create's error says it)
thread_local std::string g_heuristics_note;
}  // namespace


std::string status_text(cudnnStatus_t status) {
  std::string text = cudnnGetErrorString(status);
  char detail[512] = {0};
  cudnnGetLastErrorString(detail, sizeof(detail));
  if (detail[0] != '\0') text += std::string(" (") + detail + ")";
  return text;
}

void check(cudnnStatus_t status, const char* what) {
  if (status != CUDNN_STATUS_SUCCESS) throw Failure(std::string(what) + ": " + status_text(status));
}

void check_cuda(cudaError_t status, const char* what) {
  if (status != cudaSuccess) throw Failure(std::string(what) + ": " + cudaGetErrorString(status));
}



cudnnDataType_t data_type(int32_t dtype) {
  switch (dtype) {
    case BYOC_CUDNN_FLOAT32: return CUDNN_DATA_FLOAT;
    case BYOC_CUDNN_FLOAT16: return CUDNN_DATA_HALF;
    case BYOC_CUDNN_BFLOAT16: return CUDNN_DATA_BFLOAT16;
  }
  throw Failure("unknown dtype code " + std::to_string(dtype));
}

size_t element_bytes(int32_t dtype) { return dtype == BYOC_CUDNN_FLOAT32 ? 4 : 2; }

// Tensor unique ids in the variant pack.
enum Uid : int64_t { kData = 1, kWeight = 2, kBias = 3, kResidual = 4, kOutput = 5, kVirtual = 100 };

// The byte alignment every tensor is declared with; run() checks the pointers have it.
constexpr int64_t kAlignment = 16;

Owned tensor(int64_t uid, cudnnDataType_t type, const std::array<int64_t, 4>& dims,
             const std::array<int64_t, 4>& strides, bool is_virtual) {
  Owned t(new Descriptor(CUDNN_BACKEND_TENSOR_DESCRIPTOR));
  int64_t alignment = kAlignment;
  t->set(CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type, "tensor dtype")
      .set(CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims.data(), "tensor dimensions")
      .set(CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides.data(), "tensor strides")
      .set(CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid, "tensor id")
      .set(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &alignment, "tensor alignment")
      .set(CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &is_virtual, "tensor virtual flag");
  t->finalize("a tensor descriptor");
  return t;
}

// dims in cuDNN's order [N, C, H, W], strides of the NHWC layout
Owned image(int64_t uid, cudnnDataType_t type, int64_t n, int64_t c, int64_t h, int64_t w, bool is_virtual) {
  return tensor(uid, type, {n, c, h, w}, {h * w * c, 1, w * c, c}, is_virtual);
}

Owned pointwise(cudnnPointwiseMode_t mode, const Descriptor& x, const Descriptor* b, const Descriptor& y) {
  Descriptor math(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
  cudnnDataType_t precision = CUDNN_DATA_FLOAT;
  math.set(CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode, "pointwise mode")
      .set(CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &precision, "pointwise precision");
  if (mode == CUDNN_POINTWISE_SWISH_FWD) {
    float beta = 1.0f;  // silu
    math.set(CUDNN_ATTR_POINTWISE_SWISH_BETA, CUDNN_TYPE_FLOAT, 1, &beta, "swish beta");
  }
  math.finalize("a pointwise descriptor");
  Owned op(new Descriptor(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR));
  op->set(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, math, "pointwise op")
      .set(CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x, "pointwise x");
  if (b != nullptr) op->set(CUDNN_ATTR_OPERATION_POINTWISE_BDESC, *b, "pointwise b");
  op->set(CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y, "pointwise y");
  op->finalize("a pointwise operation");
  return op;
}

cudnnPointwiseMode_t activation_mode(int32_t activation) {
  switch (activation) {
    case BYOC_CUDNN_RELU: return CUDNN_POINTWISE_RELU_FWD;
    case BYOC_CUDNN_GELU: return CUDNN_POINTWISE_GELU_FWD;
    case BYOC_CUDNN_GELU_TANH: return CUDNN_POINTWISE_GELU_APPROX_TANH_FWD;
    case BYOC_CUDNN_SILU: return CUDNN_POINTWISE_SWISH_FWD;
    case BYOC_CUDNN_SIGMOID: return CUDNN_POINTWISE_SIGMOID_FWD;
  }
  throw Failure("unknown activation code " + std::to_string(activation));
}

void check_shape(const ByocCudnnConv& c) {
  const int64_t values[] = {c.batch, c.height, c.width, c.channels, c.out_channels, c.kernel_h, c.kernel_w,
                            c.groups, c.out_h, c.out_w, c.strides[0], c.strides[1], c.dilations[0], c.dilations[1]};
  for (int64_t value : values) {
    if (value < 1) throw Failure("a conv dimension, stride or dilation below 1");
  }
  for (int64_t pad : c.pads) {
    if (pad < 0) throw Failure("a negative conv padding");
  }
  if (c.channels % c.groups != 0 || c.out_channels % c.groups != 0) {
    throw Failure("groups does not divide the conv's channels");
  }
  if (c.workspace_limit < 0) throw Failure("a negative workspace limit");
}


Graph build_graph(const ByocCudnnConv& c, cudnnHandle_t handle) {
  check_shape(c);
  const cudnnDataType_t type = data_type(c.dtype);
  const cudnnDataType_t accumulate = CUDNN_DATA_FLOAT;
  Graph g;
  auto keep = [&](Owned d) -> Descriptor& {
    g.parts.push_back(std::move(d));
    return *g.parts.back();
  };
  const int64_t group_channels = c.channels / c.groups;
  Descriptor& x = keep(image(kData, type, c.batch, c.channels, c.height, c.width, false));
  // the filter [K, C/G, R, S] in KRSC order: cuDNN reads the groups from C / (C/G)
  Descriptor& w = keep(tensor(kWeight, type, {c.out_channels, group_channels, c.kernel_h, c.kernel_w},
                              {c.kernel_h * c.kernel_w * group_channels, 1, c.kernel_w * group_channels,
                               group_channels}, false));
  std::vector<cudnnBackendDescriptor_t> ops;
  // Each step writes the output when it is the last one, else a virtual float32 tensor.
  const int steps = 1 + (c.has_bias ? 1 : 0) + (c.has_residual ? 1 : 0) +
                    (c.activation != BYOC_CUDNN_NO_ACTIVATION ? 1 : 0);
  int step = 0;
  int64_t next_virtual = kVirtual;
  auto result = [&]() -> Descriptor& {
    ++step;
    if (step == steps) return keep(image(kOutput, type, c.batch, c.out_channels, c.out_h, c.out_w, false));
    return keep(image(next_virtual++, accumulate, c.batch, c.out_channels, c.out_h, c.out_w, true));
  };

  Descriptor& conv = keep(Owned(new Descriptor(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR)));
  cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
  int64_t spatial = 2;
  int64_t pre[2] = {c.pads[0], c.pads[1]}, post[2] = {c.pads[2], c.pads[3]};
  conv.set(CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &accumulate, "conv compute type")
      .set(CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode, "conv mode")
      .set(CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, 1, &spatial, "conv spatial dims")
      .set(CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, 2, c.dilations, "conv dilations")
      .set(CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64, 2, c.strides, "conv strides")
      .set(CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, 2, pre, "conv pre-paddings")
      .set(CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, 2, post, "conv post-paddings");
  conv.finalize("the convolution descriptor");

  Descriptor* current = &result();
  Descriptor& conv_op = keep(Owned(new Descriptor(CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR)));
  float alpha = 1.0f, beta = 0.0f;
  conv_op.set(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, x, "conv x")
      .set(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W, w, "conv w")
      .set(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y, *current, "conv y")
      .set(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC, conv, "conv descriptor")
      .set(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA, CUDNN_TYPE_FLOAT, 1, &alpha, "conv alpha")
      .set(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA, CUDNN_TYPE_FLOAT, 1, &beta, "conv beta");
  conv_op.finalize("the convolution operation");
  ops.push_back(conv_op.get());

  if (c.has_bias) {
    Descriptor& bias = keep(tensor(kBias, type, {1, c.out_channels, 1, 1}, {c.out_channels, 1, c.out_channels,
                                                                            c.out_channels}, false));
    Descriptor* sum = &result();
    ops.push_back(keep(pointwise(CUDNN_POINTWISE_ADD, *current, &bias, *sum)).get());
    current = sum;
  }
  if (c.has_residual) {
    Descriptor& residual = keep(image(kResidual, type, c.batch, c.out_channels, c.out_h, c.out_w, false));
    Descriptor* sum = &result();
    ops.push_back(keep(pointwise(CUDNN_POINTWISE_ADD, *current, &residual, *sum)).get());
    current = sum;
  }
  if (c.activation != BYOC_CUDNN_NO_ACTIVATION) {
    Descriptor* activated = &result();
    ops.push_back(keep(pointwise(activation_mode(c.activation), *current, nullptr, *activated)).get());
  }

  g.graph.reset(new Descriptor(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR));
  g.graph->set(CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, static_cast<int64_t>(ops.size()),
               ops.data(), "graph ops")
      .set(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle, "graph handle");
  g.graph->finalize("the operation graph");
  return g;
}


std::vector<Config> heuristic_configs(const Graph& g, cudnnBackendHeurMode_t mode) {
  Descriptor heuristics(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
  heuristics.set(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, *g.graph, "heuristics graph")
      .set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode, "heuristics mode");
  const cudnnStatus_t finalized = cudnnBackendFinalize(heuristics.get());
  if (finalized != CUDNN_STATUS_SUCCESS) {  // no configuration: the reason goes into create's error
    g_heuristics_note = (mode == CUDNN_HEUR_MODE_A ? "heuristics mode A: " : "the fallback list: ") +
                        status_text(finalized);
    return {};
  }
  int64_t count = 0;
  check(cudnnBackendGetAttribute(heuristics.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0,
                                 &count, nullptr), "counting the heuristics' results");
  std::vector<Config> configs(static_cast<size_t>(std::max<int64_t>(count, 0)));
  std::vector<cudnnBackendDescriptor_t> raw;
  for (Config& config : configs) {
    config.config.reset(new Descriptor(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR));
    raw.push_back(config.config->get());
  }
  int64_t got = 0;
  if (count > 0) {
    check(cudnnBackendGetAttribute(heuristics.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                   count, &got, raw.data()), "reading the heuristics' results");
  }
  configs.resize(static_cast<size_t>(std::min(got, count)));
  for (Config& config : configs) {
    Descriptor engine(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
    cudnnBackendDescriptor_t engine_handle = engine.get();
    int64_t n = 0;
    if (cudnnBackendGetAttribute(config.config->get(), CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                                 &n, &engine_handle) == CUDNN_STATUS_SUCCESS) {
      cudnnBackendGetAttribute(engine_handle, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &n,
                               &config.engine);
      cudnnBackendNumericalNote_t notes[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
      int64_t noted = 0;
      if (cudnnBackendGetAttribute(engine_handle, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                                   CUDNN_NUMERICAL_NOTE_TYPE_COUNT, &noted, notes) == CUDNN_STATUS_SUCCESS) {
        for (int64_t i = 0; i < std::min<int64_t>(noted, CUDNN_NUMERICAL_NOTE_TYPE_COUNT); ++i) {
          config.tensor_core = config.tensor_core || notes[i] == CUDNN_NUMERICAL_NOTE_TENSOR_CORE;
          config.down_converts = config.down_converts || notes[i] == CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS;
        }
      }
    }
  }
  return configs;
}

bool allowed(const Config& config, const ByocCudnnConv& c) {
  return !(c.dtype == BYOC_CUDNN_FLOAT32 && c.tf32 == 0 && (config.tensor_core || config.down_converts));
}

// The fallback list's configurations whose engines `named` does not hold already.
std::vector<Config> fallback_configs(const Graph& g, const std::vector<Config>& named) {
  std::vector<Config> configs;
  for (Config& config : heuristic_configs(g, CUDNN_HEUR_MODE_FALLBACK)) {
    bool seen = std::any_of(named.begin(), named.end(),
                            [&](const Config& other) { return other.engine == config.engine; });
    if (!seen) configs.push_back(std::move(config));
  }
  return configs;
}

// Every configuration the heuristics propose, mode A's first, then the fallback list's
// engines mode A did not name.
std::vector<Config> all_configs(const Graph& g) {
  std::vector<Config> configs = heuristic_configs(g, CUDNN_HEUR_MODE_A);
  for (Config& config : fallback_configs(g, configs)) configs.push_back(std::move(config));
  return configs;
}


// The plan of `config`, or no plan where it does not build or needs more workspace.
Plan make_plan(const Config& config, cudnnHandle_t handle, int64_t workspace_limit) {
  Plan plan;
  Owned candidate(new Descriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR));
  cudnnBackendDescriptor_t config_handle = config.config->get();
  if (cudnnBackendSetAttribute(candidate->get(), CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle) !=
          CUDNN_STATUS_SUCCESS ||
      cudnnBackendSetAttribute(candidate->get(), CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG,
                               CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &config_handle) != CUDNN_STATUS_SUCCESS ||
      cudnnBackendFinalize(candidate->get()) != CUDNN_STATUS_SUCCESS) {
    return plan;
  }
  int64_t workspace = 0, n = 0;
  if (cudnnBackendGetAttribute(candidate->get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &n,
                               &workspace) != CUDNN_STATUS_SUCCESS ||
      workspace < 0 || workspace > workspace_limit) {
    return plan;
  }
  plan.plan = std::move(candidate);
  plan.engine = config.engine;
  plan.workspace = workspace;
  return plan;
}

std::string describe(const ByocCudnnConv& c) {
  char text[320];
  static const char* const kDtypes[] = {"float32", "float16", "bfloat16"};
  static const char* const kActivations[] = {"", " -> relu", " -> gelu", " -> gelu_tanh", " -> silu", " -> sigmoid"};
  std::snprintf(text, sizeof(text),
                "conv2d %s [%lld,%lld,%lld,%lld] * [%lld,%lld,%lld,%lld] groups %lld stride %lldx%lld%s%s%s",
                c.dtype >= 0 && c.dtype <= 2 ? kDtypes[c.dtype] : "?", (long long)c.batch, (long long)c.height,
                (long long)c.width, (long long)c.channels, (long long)c.out_channels, (long long)c.kernel_h,
                (long long)c.kernel_w, (long long)(c.channels / std::max<int64_t>(c.groups, 1)),
                (long long)c.groups, (long long)c.strides[0], (long long)c.strides[1], c.has_bias ? " + bias" : "",
                c.has_residual ? " + residual" : "",
                c.activation >= 0 && c.activation <= 5 ? kActivations[c.activation] : " -> ?");
  return text;
}



// The first of `configs` (of engine `engine` only, where that is not negative) whose plan
// builds within the workspace limit; no plan where none does.
Plan first_plan(const std::vector<Config>& configs, int64_t engine, const ByocCudnnConv& c, cudnnHandle_t handle) {
  for (const Config& config : configs) {
    if ((engine >= 0 && config.engine != engine) || !allowed(config, c)) continue;
    Plan plan = make_plan(config, handle, c.workspace_limit);
    if (plan.plan) return plan;
  }
  return Plan();
}

// The build's measured engine, else the heuristics' first plan that builds. The fallback
// list is asked only when mode A's proposals do not serve: each query costs create time,
// once per conv of the model.
Plan choose_plan(const ByocCudnnConv& c, const Graph& g, cudnnHandle_t handle) {
  g_heuristics_note.clear();
  const std::vector<Config> mode_a = heuristic_configs(g, CUDNN_HEUR_MODE_A);
  Plan plan = first_plan(mode_a, c.engine >= 0 ? c.engine : -1, c, handle);
  if (plan.plan) return plan;
  const std::vector<Config> fallback = fallback_configs(g, mode_a);
  if (c.engine >= 0) {
    plan = first_plan(fallback, c.engine, c, handle);
    if (!plan.plan) plan = first_plan(mode_a, -1, c, handle);
  }
  if (!plan.plan) plan = first_plan(fallback, -1, c, handle);
  if (plan.plan) return plan;
  throw Failure("cuDNN " + std::to_string(cudnnGetVersion()) + " has no engine for " + describe(c) +
                " on this GPU within a workspace of " + std::to_string(c.workspace_limit) + " bytes (" +
                std::to_string(mode_a.size() + fallback.size()) + " configurations proposed" +
                (c.dtype == BYOC_CUDNN_FLOAT32 && c.tf32 == 0 ? ", those on tensor cores or narrowing their inputs left out: tf32 is off" : "") +
                (g_heuristics_note.empty() ? std::string() : "; " + g_heuristics_note) + ")");
}

// Packs a conv keeps at most: more sets of pointers than its call sites come from the
// model's inputs and outputs, which a caller may place anywhere at every run.
constexpr size_t kMaxPacks = 32;

void open_conv(Conv& conv) {
  check(cudnnCreate(&conv.handle), "cudnnCreate");
  check_cuda(cudaMalloc(&conv.fence_word, sizeof(uint32_t)), "cudaMalloc of the fence word");
}

// cuDNN 9 launches some of its Hopper conv kernels as programmatic dependents of the kernel
// before them on the stream, and at least one reads an operand before that kernel has
// finished writing it. ResNet-50 b32 in float32 on an H200: the 1x1 conv with a residual
// after layer4's stride-2 convs (engine 4 after engine 51 there; grids smaller than the GPU,
// so the dependent finds free SMs while the other still writes) was 13-19% off on every run
// whose kernels were already loaded (bench/results/resnet50_default_later_runs_h200.md).
// A stream synchronize before each 7x7 conv made it right, and so did a memset before each
// conv; an event recorded, or recorded and waited on, did not. A memset is not a kernel, so
// no kernel after it starts before everything before it is done: the fence costs one small
// memset per conv (a memset node in a CUDA graph) and lets no engine start early but over it.
void fence(Conv& conv, cudaStream_t stream) {
  check_cuda(cudaMemsetAsync(conv.fence_word, 0, sizeof(uint32_t), stream), "the fence before the conv");
}

void execute(Conv& conv, void* const pointers[6], void* workspace, cudaStream_t stream) {
  std::array<void*, 6> key{};
  std::copy(pointers, pointers + 6, key.begin());
  key[5] = workspace;
  auto found = std::find_if(conv.packs.begin(), conv.packs.end(),
                            [&](const std::pair<std::array<void*, 6>, Owned>& entry) { return entry.first == key; });
  if (found == conv.packs.end()) {
    int64_t uids[5];
    void* data[5];
    int64_t n = 0;
    const int64_t ids[5] = {kData, kWeight, kBias, kResidual, kOutput};
    for (int i = 0; i < 5; ++i) {
      if (pointers[i] == nullptr) continue;
      uids[n] = ids[i];
      data[n] = pointers[i];
      ++n;
    }
    Owned pack(new Descriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR));
    pack->set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, n, uids, "variant pack ids")
        .set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, n, data, "variant pack pointers")
        .set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace, "variant pack workspace");
    pack->finalize("the variant pack");
    if (conv.packs.size() >= kMaxPacks) conv.packs.erase(conv.packs.begin());  // the oldest
    conv.packs.emplace_back(key, std::move(pack));
    found = conv.packs.end() - 1;
  }
  fence(conv, stream);
  check(cudnnSetStream(conv.handle, stream), "cudnnSetStream");
  check(cudnnBackendExecute(conv.handle, conv.plan.plan->get(), found->second->get()), "cudnnBackendExecute");
}

int fail(const std::string& message) {
  g_last_error = message;
  return 1;
}

}  // namespace byoc_cudnn_internal

using namespace byoc_cudnn_internal;  // NOLINT(build/namespaces)

extern "C" {

const char* byoc_cudnn_last_error(void) { return g_last_error.c_str(); }

size_t byoc_cudnn_version(void) { return cudnnGetVersion(); }

int byoc_cudnn_conv_create(const ByocCudnnConv* shape, void** state) {
  *state = nullptr;
  try {
    std::unique_ptr<Conv> conv(new Conv);
    conv->shape = *shape;
    open_conv(*conv);
    conv->graph = build_graph(conv->shape, conv->handle);
    conv->plan = choose_plan(conv->shape, conv->graph, conv->handle);
    *state = conv.release();
    return 0;
  } catch (const std::exception& error) {
    return fail(describe(*shape) + ": " + error.what());
  }
}

void byoc_cudnn_conv_destroy(void* state) { delete static_cast<Conv*>(state); }

size_t byoc_cudnn_conv_workspace(const void* state) {
  return static_cast<size_t>(static_cast<const Conv*>(state)->plan.workspace);
}

int64_t byoc_cudnn_conv_engine(const void* state) { return static_cast<const Conv*>(state)->plan.engine; }

int byoc_cudnn_conv_run(void* state, const void* data, const void* weight, const void* bias, const void* residual,
                        void* output, void* workspace, size_t workspace_bytes, void* stream) {
  Conv& conv = *static_cast<Conv*>(state);
  const ByocCudnnConv& c = conv.shape;
  if (workspace_bytes < static_cast<size_t>(conv.plan.workspace)) {
    return fail(describe(c) + ": the workspace of " + std::to_string(workspace_bytes) + " bytes is smaller than the " +
                std::to_string(conv.plan.workspace) + " its plan needs");
  }
  void* const pointers[6] = {const_cast<void*>(data), const_cast<void*>(weight),
                             c.has_bias ? const_cast<void*>(bias) : nullptr,
                             c.has_residual ? const_cast<void*>(residual) : nullptr, output, workspace};
  static const char* const kNames[5] = {"data", "weight", "bias", "residual", "output"};
  const bool needed[5] = {true, true, c.has_bias != 0, c.has_residual != 0, true};
  for (int i = 0; i < 5; ++i) {
    if (!needed[i]) continue;
    if (pointers[i] == nullptr) return fail(describe(c) + ": the " + kNames[i] + " pointer is null");
    if (reinterpret_cast<uintptr_t>(pointers[i]) % kAlignment != 0) {
      return fail(describe(c) + ": the " + kNames[i] + " pointer is not aligned to " + std::to_string(kAlignment) +
                  " bytes, as the plan was built for");
    }
  }
  try {
    execute(conv, pointers, conv.plan.workspace > 0 ? workspace : nullptr, static_cast<cudaStream_t>(stream));
    return 0;
  } catch (const std::exception& error) {
    return fail(describe(c) + ": " + error.what());
  }
}

}  // extern "C"
