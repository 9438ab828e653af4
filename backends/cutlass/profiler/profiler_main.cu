// The cutlass tuner's profiler: times the candidate kernels of the tuner's problems, all in
// one process. Static (compiled once into the object cache): the tuner links it with the
// table it generates per build (byoc_cutlass_profiler.h, templates/cutlass/profiler_table.cc.j2:
// plain C++, compiled in a second) and the candidates' kernels. `profiler [FIRST [END]]`
// times problems FIRST, FIRST+1, ... and prints one JSON line per problem as it finishes it:
//   {"problem": index, "times": {"kernel_name": microseconds or null, ...}}
// A candidate that faults leaves the CUDA context unusable for everything after it: the
// profiler then exits (status 3) without that problem's line, and the tuner starts it
// again after that problem. A problem's first candidate (the heuristic's choice) is its
// reference: a candidate whose output differs from it by more than 1% of the output's
// magnitude gets null, as one that fails does.
//
// Operands are timed cold: in a model run a GEMM's weights come from HBM (a model's weights
// are far larger than L2), so launches rotate through enough copies of the inputs that each
// finds its operands evicted. Timing one copy over and over measures them in L2 and rewards
// kernels that are fast only there (small tiles with a long K loop over a skinny M).
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <algorithm>
#include <string>
#include <vector>
#include <unistd.h>
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include "byoc_cutlass_profiler.h"

extern "C" int byoc_report_error(const char* symbol, const char* message) {
  std::fprintf(stderr, "%s: %s\n", symbol, message);
  return 1;
}

__global__ void fill(uint16_t* data, size_t count, uint32_t seed, uint16_t base, uint16_t mask) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < count; i += size_t(gridDim.x) * blockDim.x) {
    uint32_t x = uint32_t(i) * 2654435761u + seed;
    x ^= x >> 13;
    data[i] = uint16_t(base | (x & mask) | ((x >> 16) & 0x8000u));
  }
}

__device__ float decode(uint16_t bits, bool bfloat16) {
  return bfloat16 ? __uint_as_float(uint32_t(bits) << 16) : __half2float(__ushort_as_half(bits));
}

// stats[0] = max |got - want|, stats[1] = max |want| (as ordered bit patterns: both are
// non-negative floats, and a NaN's pattern is above every finite one, so it wins and fails)
__global__ void compare(const uint16_t* got, const uint16_t* want, size_t count, bool bfloat16, unsigned int* stats) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < count; i += size_t(gridDim.x) * blockDim.x) {
    float expected = decode(want[i], bfloat16);
    atomicMax(&stats[0], __float_as_uint(fabsf(decode(got[i], bfloat16) - expected)));
    atomicMax(&stats[1], __float_as_uint(fabsf(expected)));
  }
}

// Times every candidate of `problem` and prints its JSON line; false when the GPU could not
// be set up for it (no memory).
static bool time_problem(int index, const ByocProfilerProblem& problem, int min_iterations) {
  size_t input_bytes = 0;
  for (int i = 0; i < 4; ++i) input_bytes += problem.sizes[i] * 2;
  int device = 0, l2_bytes = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&l2_bytes, cudaDevAttrL2CacheSize, device);
  // copies spanning three L2s: by the time a copy comes round again, it has been evicted
  const size_t wanted = (3 * size_t(l2_bytes) + input_bytes - 1) / std::max<size_t>(input_bytes, 1);
  const size_t copies = std::min<size_t>(std::max<size_t>(wanted, 1), 256);
  const int iterations = std::max<int>(min_iterations, int(copies));
  std::vector<void*> buffers;  // everything allocated, freed at the end
  std::vector<void*> args(copies * 4, nullptr);  // copy c's operands, in the kernel's order, at args[4c...]
  bool ok = true;
  for (size_t copy = 0; ok && copy < copies; ++copy) {
    void* operands[4] = {nullptr, nullptr, nullptr, nullptr};
    for (int i = 0; ok && i < 4; ++i) {
      if (problem.sizes[i] == 0) continue;
      ok = cudaMalloc(&operands[i], problem.sizes[i] * 2) == cudaSuccess;
      if (!ok) break;
      buffers.push_back(operands[i]);
      fill<<<256, 256>>>(static_cast<uint16_t*>(operands[i]), problem.sizes[i], 17u * (i + 1),  // every copy alike
                         problem.fill_base, problem.fill_mask);
    }
    for (int slot = 0; slot < problem.slot_count; ++slot) args[copy * 4 + slot] = operands[problem.slots[slot]];
  }
  void* out = nullptr;
  void* workspace = nullptr;
  uint16_t* reference = nullptr;
  unsigned int* stats = nullptr;
  ok = ok && cudaMalloc(&out, problem.out_size * 2) == cudaSuccess;
  ok = ok && cudaMalloc(&workspace, problem.workspace_bytes) == cudaSuccess;
  ok = ok && cudaMalloc(&reference, problem.out_size * 2) == cudaSuccess;
  ok = ok && cudaMalloc(&stats, 2 * sizeof(unsigned int)) == cudaSuccess;
  for (void* p : {out, workspace, static_cast<void*>(reference), static_cast<void*>(stats)}) {
    if (p != nullptr) buffers.push_back(p);
  }
  cudaStream_t stream = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;
  ok = ok && cudaStreamCreate(&stream) == cudaSuccess && cudaEventCreate(&start) == cudaSuccess &&
       cudaEventCreate(&stop) == cudaSuccess;
  if (!ok) {
    for (void* p : buffers) cudaFree(p);
    cudaGetLastError();
    return false;
  }
  void* results[1] = {out};
  bool have_reference = false;
  std::string line = "{\"problem\": " + std::to_string(index) + ", \"times\": {";
  char entry[512];
  for (int c = 0; c < problem.candidate_count; ++c) {
    const ByocProfilerCandidate& candidate = problem.candidates[c];
    float best = -1.0f;
    cudaMemsetAsync(out, 0xFF, problem.out_size * 2, stream);  // NaN everywhere: a kernel that writes nothing fails
    bool good = candidate.run(args.data(), results, workspace, problem.workspace_bytes, stream) == 0 &&
                cudaStreamSynchronize(stream) == cudaSuccess;
    if (good && !have_reference) {
      good = cudaMemcpy(reference, out, problem.out_size * 2, cudaMemcpyDeviceToDevice) == cudaSuccess;
      have_reference = good;
    } else if (good) {
      unsigned int host_stats[2] = {0u, 0u};
      good = cudaMemset(stats, 0, sizeof(host_stats)) == cudaSuccess;
      compare<<<256, 256>>>(static_cast<const uint16_t*>(out), reference, problem.out_size, problem.bfloat16, stats);
      good = good && cudaMemcpy(host_stats, stats, sizeof(host_stats), cudaMemcpyDeviceToHost) == cudaSuccess;
      float difference, magnitude;
      std::memcpy(&difference, &host_stats[0], sizeof(float));
      std::memcpy(&magnitude, &host_stats[1], sizeof(float));
      if (good && !(difference <= 1e-2f * magnitude + 1e-3f)) {
        std::fprintf(stderr, "%s disagrees with the reference kernel on %s: max difference %g, max |output| %g\n",
                     candidate.name, problem.key, difference, magnitude);
        good = false;
      }
    }
    // Time GPU work, not launch overhead: the iterations are captured into one CUDA graph
    // (as a model built with cuda_graph replays them); where capture fails, launch directly.
    cudaGraphExec_t replay = nullptr;
    if (good && cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed) == cudaSuccess) {
      for (int i = 0; i < iterations; ++i) {
        candidate.run(&args[(i % copies) * 4], results, workspace, problem.workspace_bytes, stream);
      }
      cudaGraph_t graph = nullptr;
      if (cudaStreamEndCapture(stream, &graph) == cudaSuccess && graph != nullptr) {
        if (cudaGraphInstantiate(&replay, graph, 0) != cudaSuccess) replay = nullptr;
        cudaGraphDestroy(graph);
      }
      cudaGetLastError();
    }
    for (int trial = 0; good && trial < 5; ++trial) {
      cudaEventRecord(start, stream);
      if (replay != nullptr) {
        cudaGraphLaunch(replay, stream);
      } else {
        for (int i = 0; i < iterations; ++i) {
          candidate.run(&args[(i % copies) * 4], results, workspace, problem.workspace_bytes, stream);
        }
      }
      cudaEventRecord(stop, stream);
      good = cudaEventSynchronize(stop) == cudaSuccess;
      float ms = 0;
      cudaEventElapsedTime(&ms, start, stop);
      float us = ms * 1000.0f / iterations;
      if (best < 0 || us < best) best = us;
    }
    if (replay != nullptr) cudaGraphExecDestroy(replay);
    cudaGetLastError();
    if (good) std::snprintf(entry, sizeof(entry), "%s\"%s\": %.3f", c == 0 ? "" : ", ", candidate.name, best);
    else std::snprintf(entry, sizeof(entry), "%s\"%s\": null", c == 0 ? "" : ", ", candidate.name);
    line += entry;
  }
  if (cudaDeviceSynchronize() != cudaSuccess) {
    // a fault (illegal address, a trap): the context is lost, and with it every time after
    std::fprintf(stderr, "%s: a candidate left the GPU context unusable (%s)\n", problem.key,
                 cudaGetErrorString(cudaGetLastError()));
    std::exit(3);
  }
  std::printf("%s}}\n", line.c_str());
  std::fflush(stdout);
  cudaStreamSynchronize(stream);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaStreamDestroy(stream);
  for (void* p : buffers) cudaFree(p);
  return true;
}

int main(int argc, char** argv) {
  const ByocProfilerTable& table = byoc_profiler_table;
  // problems FIRST..END-1 (argv; all by default): the tuner splits them among GPUs
  const int first = argc > 1 ? std::atoi(argv[1]) : 0;
  const int end = argc > 2 ? std::min(std::atoi(argv[2]), table.problem_count) : table.problem_count;
  for (int index = std::max(first, 0); index < end; ++index) {
    // A candidate that hangs (a spinning kernel) ends the process after this long, without
    // the problem's line: the tuner goes on from the next problem, as after a fault.
    alarm(static_cast<unsigned>(table.problem_seconds));
    if (!time_problem(index, table.problems[index], table.min_iterations)) {
      std::printf("{\"problem\": %d, \"times\": {}}\n", index);
      std::fflush(stdout);
    }
    alarm(0);
  }
  return 0;
}
