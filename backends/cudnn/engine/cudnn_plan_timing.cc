// The cudnn engine's timing of a conv's plans at build time (byoc_cudnn.h's
// byoc_cudnn_conv_prepare_plans, _time_prepared, _release_plans; backends/cudnn/plans.py
// calls them in a child process): plans built ahead, in threads, then timed one conv at a
// time on scratch operands taken in turn through more memory than L2 holds.
#include "cudnn_conv_internal.h"

#include <cudnn.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <memory>
#include <string>
#include <vector>

using namespace byoc_cudnn_internal;  // NOLINT(build/namespaces)

extern "C" {

int byoc_cudnn_conv_prepare_plans(const ByocCudnnConv* shape, int max_plans, void** prepared) {
  *prepared = nullptr;
  try {
    std::unique_ptr<PreparedPlans> plans(new PreparedPlans);
    Conv& conv = plans->conv;
    conv.shape = *shape;
    check(cudnnCreate(&conv.handle), "cudnnCreate");
    conv.graph = build_graph(conv.shape, conv.handle);
    for (const Config& config : all_configs(conv.graph)) {
      if (static_cast<int>(plans->plans.size()) >= max_plans) break;
      Plan plan = make_plan(config, conv.handle, conv.shape.workspace_limit);
      if (plan.plan) plans->plans.push_back(std::move(plan));
    }
    *prepared = plans.release();
    return 0;
  } catch (const std::exception& error) {
    return fail(describe(*shape) + ": " + error.what());
  }
}

void byoc_cudnn_conv_release_plans(void* prepared) { delete static_cast<PreparedPlans*>(prepared); }

int byoc_cudnn_conv_time_prepared(void* prepared, int runs, int64_t* engines, double* microseconds, int* count) {
  *count = 0;
  PreparedPlans& plans = *static_cast<PreparedPlans*>(prepared);
  Conv& conv = plans.conv;
  const ByocCudnnConv& c = conv.shape;
  std::vector<void*> buffers;
  cudaStream_t stream = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;
  int status = 0;
  try {
    check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
    check_cuda(cudaEventCreate(&start), "cudaEventCreate");
    check_cuda(cudaEventCreate(&stop), "cudaEventCreate");
    const size_t element = element_bytes(c.dtype);
    const size_t output_bytes = static_cast<size_t>(c.batch * c.out_h * c.out_w * c.out_channels) * element;
    const size_t sizes[5] = {
        static_cast<size_t>(c.batch * c.height * c.width * c.channels) * element,
        static_cast<size_t>(c.out_channels * c.kernel_h * c.kernel_w * (c.channels / c.groups)) * element,
        static_cast<size_t>(c.out_channels) * element, output_bytes, output_bytes};
    // Operand sets taken in turn through more memory than L2 holds (64 MiB): each launch
    // reads its operands from DRAM, as a conv in a model does and as the other backends'
    // candidates are timed (byoc/costs.py).
    size_t set_bytes = 0;
    for (size_t bytes : sizes) set_bytes += bytes;
    const int sets = static_cast<int>(std::min<size_t>(64, std::max<size_t>(1, ((64u << 20) + set_bytes - 1) /
                                                                                    set_bytes)));
    std::vector<std::array<void*, 6>> operand_sets(sets);
    void* workspace = nullptr;
    check_cuda(cudaMalloc(&workspace, static_cast<size_t>(std::max<int64_t>(c.workspace_limit, 256))),
               "cudaMalloc of the workspace");
    buffers.push_back(workspace);
    for (auto& set : operand_sets) {
      for (int i = 0; i < 5; ++i) {
        void* buffer = nullptr;
        check_cuda(cudaMalloc(&buffer, sizes[i]), "cudaMalloc of a scratch operand");
        buffers.push_back(buffer);
        // small values (0x3c3c is 1.06 in float16): a conv of zeros may take another path
        check_cuda(cudaMemsetAsync(buffer, 0x3c, sizes[i], stream), "cudaMemset");
        set[i] = buffer;
      }
      if (!c.has_bias) set[2] = nullptr;
      if (!c.has_residual) set[3] = nullptr;
      set[5] = workspace;
    }
    const int launches = std::max(runs, sets);
    for (Plan& plan : plans.plans) {
      conv.plan = std::move(plan);
      std::vector<Owned> packs;  // one variant pack per operand set, made before the timing
      std::vector<double> times;
      try {
        for (auto& set : operand_sets) {
          conv.pack.reset();
          execute(conv, set.data(), workspace, stream);  // also the warm-up
          packs.push_back(std::move(conv.pack));
        }
        check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
        check(cudnnSetStream(conv.handle, stream), "cudnnSetStream");
        for (int round = 0; round < 3; ++round) {
          check_cuda(cudaEventRecord(start, stream), "cudaEventRecord");
          for (int i = 0; i < launches; ++i) {
            check(cudnnBackendExecute(conv.handle, conv.plan.plan->get(), packs[i % sets]->get()),
                  "cudnnBackendExecute");
          }
          check_cuda(cudaEventRecord(stop, stream), "cudaEventRecord");
          check_cuda(cudaEventSynchronize(stop), "cudaEventSynchronize");
          float ms = 0;
          check_cuda(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
          times.push_back(1000.0 * ms / launches);
        }
      } catch (const Failure&) {
        // A plan that builds and does not run is not a candidate, unless it broke the
        // context (a sticky error: every later call would fail too): then the timing
        // fails, and the build stores nothing of it.
        const cudaError_t sticky = cudaStreamSynchronize(stream);
        if (sticky != cudaSuccess && cudaGetLastError() != cudaSuccess && cudaDeviceSynchronize() != cudaSuccess) {
          throw Failure(std::string("a plan left the CUDA context broken: ") + cudaGetErrorString(sticky));
        }
        continue;
      }
      std::sort(times.begin(), times.end());
      engines[*count] = conv.plan.engine;
      microseconds[*count] = times[1];
      ++*count;
    }
  } catch (const std::exception& error) {
    status = fail(describe(c) + ": " + error.what());
  }
  conv.pack.reset();
  conv.plan = Plan();
  plans.plans.clear();  // timed once: the plans' memory goes back now
  if (stream != nullptr) cudaStreamSynchronize(stream);
  for (void* buffer : buffers) cudaFree(buffer);
  if (start != nullptr) cudaEventDestroy(start);
  if (stop != nullptr) cudaEventDestroy(stop);
  if (stream != nullptr) cudaStreamDestroy(stream);
  return status;
}

}  // extern "C"
