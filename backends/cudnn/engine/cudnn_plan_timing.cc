// The cudnn engine's timing of a conv's plans at build time (byoc_cudnn.h's
// byoc_cudnn_conv_prepare_plans, _time_prepared, _release_plans; backends/cudnn/plans.py
// calls them in a child process): plans built ahead, in threads, then checked and timed one
// conv at a time on scratch operands taken in turn through more memory than L2 holds.
//
// The check before a plan's timing: three runs on the same operands, the first into an
// output and workspace of zeros, the second into ones filled with NaNs and a byte pattern,
// the third into what the second left; then, as a model runs a conv at several call sites,
// one on other operands and one on the first again. A plan whose later runs differ from its
// first depends on what its output or workspace held or on the runs before (cuDNN promises
// none of that): a model would be right on its first run and wrong on later ones, so the
// plan is refused. So is a plan whose output differs from those of most plans that passed.
#include "cudnn_conv_internal.h"

#include <cudnn.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

using namespace byoc_cudnn_internal;  // NOLINT(build/namespaces)

namespace {

// A value of the dtype's bits as float (float16's subnormals included).
float to_float(const uint8_t* bytes, int32_t dtype) {
  if (dtype == BYOC_CUDNN_FLOAT32) {
    float value;
    std::memcpy(&value, bytes, 4);
    return value;
  }
  uint16_t half;
  std::memcpy(&half, bytes, 2);
  uint32_t bits;
  if (dtype == BYOC_CUDNN_BFLOAT16) {
    bits = static_cast<uint32_t>(half) << 16;
  } else {
    const uint32_t sign = static_cast<uint32_t>(half & 0x8000) << 16;
    const int exponent = (half >> 10) & 0x1f;
    const uint32_t mantissa = half & 0x3ff;
    if (exponent == 0x1f) {
      bits = sign | 0x7f800000u | (mantissa << 13);
    } else if (exponent != 0) {
      bits = sign | (static_cast<uint32_t>(exponent + 112) << 23) | (mantissa << 13);
    } else {  // zero or subnormal: mantissa * 2^-24
      float value = std::ldexp(static_cast<float>(mantissa), -24);
      return sign ? -value : value;
    }
  }
  float value;
  std::memcpy(&value, &bits, 4);
  return value;
}

// `count` values k / scale (k in [-64, 64], pseudo-random from `seed`) in the dtype's bits:
// exact in float16 and bfloat16 too, so the check compares engines, not roundings.
std::vector<uint8_t> check_values(size_t count, int32_t dtype, float scale, uint32_t seed) {
  const size_t element = element_bytes(dtype);
  std::vector<uint8_t> bytes(count * element);
  for (size_t i = 0; i < count; ++i) {
    seed = seed * 1664525u + 1013904223u;
    const float value = static_cast<float>(static_cast<int>((seed >> 9) % 129) - 64) / scale;
    uint32_t bits;
    std::memcpy(&bits, &value, 4);
    if (dtype == BYOC_CUDNN_FLOAT32) {
      std::memcpy(&bytes[i * 4], &bits, 4);
      continue;
    }
    uint16_t narrow;
    if (dtype == BYOC_CUDNN_BFLOAT16) {
      narrow = static_cast<uint16_t>(bits >> 16);  // exact: at most 7 significant bits
    } else if ((bits & 0x7fffffffu) == 0) {
      narrow = static_cast<uint16_t>((bits >> 16) & 0x8000);
    } else {  // a normal float16 (|value| >= 2^-10 here): rebias the exponent, keep 10 bits
      const int exponent = static_cast<int>((bits >> 23) & 0xff) - 112;
      narrow = static_cast<uint16_t>(((bits >> 16) & 0x8000) | (exponent << 10) | ((bits >> 13) & 0x3ff));
    }
    std::memcpy(&bytes[i * 2], &narrow, 2);
  }
  return bytes;
}

// The largest |a - b| over the outputs, or infinity where either holds a NaN or infinity.
double largest_difference(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b, int32_t dtype) {
  const size_t element = element_bytes(dtype);
  double largest = 0;
  for (size_t offset = 0; offset < a.size(); offset += element) {
    const float x = to_float(&a[offset], dtype), y = to_float(&b[offset], dtype);
    if (!std::isfinite(x) || !std::isfinite(y)) return INFINITY;
    largest = std::max(largest, static_cast<double>(std::fabs(x - y)));
  }
  return largest;
}

double largest_magnitude(const std::vector<uint8_t>& a, int32_t dtype) {
  const size_t element = element_bytes(dtype);
  double largest = 0;
  for (size_t offset = 0; offset < a.size(); offset += element) {
    largest = std::max(largest, static_cast<double>(std::fabs(to_float(&a[offset], dtype))));
  }
  return largest;
}

// Whether every sampled value is finite.
bool all_finite(const std::vector<uint8_t>& a, int32_t dtype) {
  const size_t element = element_bytes(dtype);
  for (size_t offset = 0; offset < a.size(); offset += element) {
    if (!std::isfinite(to_float(&a[offset], dtype))) return false;
  }
  return true;
}

// Outputs agree within what float16, bfloat16 or TF32 rounding leaves of their largest value.
bool agree(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b, int32_t dtype) {
  const double tolerance = (dtype == BYOC_CUDNN_BFLOAT16 ? 3e-2 : 1e-2) * std::max(largest_magnitude(a, dtype), 1e-3);
  return largest_difference(a, b, dtype) <= tolerance;
}

// The output of one run of the conv's current plan on `set` (its output and workspace
// filled with `fill` first unless `fill` is negative), as the host sees it: all of it up to
// 4 MiB, else 64 pieces of 64 KiB spread over it (what a wrong engine leaves behind spans
// its tiles; copying and comparing 100 MB per plan would cost seconds per conv).
std::vector<uint8_t> checked_run(Conv& conv, const std::array<void*, 6>& set, int fill, size_t output_bytes,
                                 size_t workspace_bytes, cudaStream_t stream) {
  if (fill >= 0) {
    check_cuda(cudaMemsetAsync(set[4], fill, output_bytes, stream), "cudaMemset of the output");
    check_cuda(cudaMemsetAsync(set[5], fill == 0 ? 0 : 0xa5, workspace_bytes, stream), "cudaMemset of the workspace");
  }
  execute(conv, set.data(), set[5], stream);
  constexpr size_t kPiece = 64 << 10, kPieces = 64;
  const bool whole = output_bytes <= kPiece * kPieces;
  std::vector<uint8_t> output(whole ? output_bytes : kPiece * kPieces);
  const char* source = static_cast<const char*>(set[4]);
  if (whole) {
    check_cuda(cudaMemcpyAsync(output.data(), source, output_bytes, cudaMemcpyDeviceToHost, stream),
               "cudaMemcpy of the output");
  } else {
    const size_t step = (output_bytes - kPiece) / (kPieces - 1) / 64 * 64;  // aligned to any element
    for (size_t i = 0; i < kPieces; ++i) {
      check_cuda(cudaMemcpyAsync(output.data() + i * kPiece, source + i * step, kPiece, cudaMemcpyDeviceToHost,
                                 stream), "cudaMemcpy of the output");
    }
  }
  check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  return output;
}

}  // namespace

extern "C" {

int byoc_cudnn_conv_prepare_plans(const ByocCudnnConv* shape, int max_plans, void** prepared) {
  *prepared = nullptr;
  try {
    std::unique_ptr<PreparedPlans> plans(new PreparedPlans);
    Conv& conv = plans->conv;
    conv.shape = *shape;
    open_conv(conv);
    conv.graph = build_graph(conv.shape, conv.handle);
    for (const Config& config : all_configs(conv.graph)) {
      if (static_cast<int>(plans->plans.size()) >= max_plans) break;
      if (!allowed(config, conv.shape)) continue;
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

int byoc_cudnn_conv_time_prepared(void* prepared, int runs, int64_t* engines, double* microseconds,
                                  int32_t* verdicts, int* count) {
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
    const size_t workspace_bytes = static_cast<size_t>(std::max<int64_t>(c.workspace_limit, 256));
    check_cuda(cudaMalloc(&workspace, workspace_bytes), "cudaMalloc of the workspace");
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
    // the check's operands in the first set: values of every sign, not one repeated
    // (data and residual k/64, weights k/1024, bias k/64)
    const float scales[4] = {64.0f, 1024.0f, 64.0f, 64.0f};
    for (int i = 0; i < 4; ++i) {
      if (operand_sets[0][i] == nullptr) continue;
      const std::vector<uint8_t> values = check_values(sizes[i] / element, c.dtype, scales[i], 17u + i);
      check_cuda(cudaMemcpyAsync(operand_sets[0][i], values.data(), sizes[i], cudaMemcpyHostToDevice, stream),
                 "cudaMemcpy of a check operand");
    }
    check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    const int launches = std::max(runs, sets);
    // Plans that passed their own check, in groups whose first runs agree: each group's
    // first member's output, its size, and each reported plan's group (-1: refused).
    std::vector<std::vector<uint8_t>> representatives;
    std::vector<int> group_sizes;
    std::vector<int> group_of(plans.plans.size(), -1);
    for (Plan& plan : plans.plans) {
      conv.plan = std::move(plan);
      std::vector<Owned> packs;  // one variant pack per operand set, made before the timing
      std::vector<double> times;
      int32_t verdict = BYOC_CUDNN_PLAN_AGREES;
      int group = -1;
      bool new_group = false;
      try {
        conv.packs.clear();
        const std::vector<uint8_t> first = checked_run(conv, operand_sets[0], 0, output_bytes, workspace_bytes, stream);
        const std::vector<uint8_t> poisoned =
            checked_run(conv, operand_sets[0], 0xff, output_bytes, workspace_bytes, stream);
        const std::vector<uint8_t> again = checked_run(conv, operand_sets[0], -1, output_bytes, workspace_bytes, stream);
        bool same = agree(first, poisoned, c.dtype) && agree(first, again, c.dtype);
        if (sets > 1) {  // as a model runs it: another call site's buffers in between
          checked_run(conv, operand_sets[1], -1, output_bytes, workspace_bytes, stream);
          same = same && agree(first, checked_run(conv, operand_sets[0], -1, output_bytes, workspace_bytes, stream),
                               c.dtype);
        }
        if (!all_finite(first, c.dtype)) {
          verdict = BYOC_CUDNN_PLAN_NOT_FINITE;
        } else if (!same) {
          verdict = BYOC_CUDNN_PLAN_READS_LEFTOVERS;
        } else {
          for (size_t g = 0; g < representatives.size() && group < 0; ++g) {
            if (agree(representatives[g], first, c.dtype)) group = static_cast<int>(g);
          }
          if (group < 0) {
            representatives.push_back(first);
            group_sizes.push_back(0);
            group = static_cast<int>(representatives.size()) - 1;
            new_group = true;
          }
        }
        if (verdict == BYOC_CUDNN_PLAN_READS_LEFTOVERS || verdict == BYOC_CUDNN_PLAN_NOT_FINITE) {
          engines[*count] = conv.plan.engine;  // refused: not timed
          microseconds[*count] = 0;
          verdicts[*count] = verdict;
          ++*count;
          continue;
        }
        conv.packs.clear();
        for (auto& set : operand_sets) {
          execute(conv, set.data(), workspace, stream);  // also the warm-up
          packs.push_back(std::move(conv.packs.back().second));
          conv.packs.pop_back();
        }
        check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
        check(cudnnSetStream(conv.handle, stream), "cudnnSetStream");
        for (int round = 0; round < 3; ++round) {
          check_cuda(cudaEventRecord(start, stream), "cudaEventRecord");
          for (int i = 0; i < launches; ++i) {  // fenced as at run time
            fence(conv, stream);
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
        if (new_group) {  // the group it began has no reported member
          representatives.pop_back();
          group_sizes.pop_back();
        }
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
      ++group_sizes[group];
      group_of[*count] = group;
      engines[*count] = conv.plan.engine;
      microseconds[*count] = times[1];
      verdicts[*count] = verdict;
      ++*count;
    }
    // The candidates are the largest group (the earliest on a tie: the heuristic ranks its
    // plans); a plan of any other group computes something else.
    if (!group_sizes.empty()) {
      const int largest = static_cast<int>(std::max_element(group_sizes.begin(), group_sizes.end()) -
                                           group_sizes.begin());
      for (int i = 0; i < *count; ++i) {
        if (group_of[i] >= 0 && group_of[i] != largest) verdicts[i] = BYOC_CUDNN_PLAN_DISAGREES;
      }
    }
  } catch (const std::exception& error) {
    status = fail(describe(c) + ": " + error.what());
  }
  conv.packs.clear();
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
