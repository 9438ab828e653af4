// The cutlass tuning profiler's table of problems and candidates: what the tuner generates
// per build (templates/cutlass/profiler_table.cc.j2, plain C++ compiled in a second) for the
// static driver (backends/cutlass/profiler/profiler_main.cu, compiled once into the object
// cache) to time.
#ifndef BYOC_CUTLASS_PROFILER_H_
#define BYOC_CUTLASS_PROFILER_H_

#include <stddef.h>
#include <stdint.h>

// A candidate's entry point: the problem's sizes, called as a partition calls its kernel.
typedef int (*ByocProfilerEntry)(void* const*, void* const*, void*, size_t, void*);

struct ByocProfilerCandidate {
  const char* name;
  ByocProfilerEntry run;
};

struct ByocProfilerProblem {
  const char* key;
  size_t sizes[4];  // elements of a, b, bias, residual (0: none)
  size_t out_size;
  int slots[4];     // the partition's parameters: which of the four operands each one is
  int slot_count;
  bool bfloat16;
  uint16_t fill_base, fill_mask;  // small values around zero: exponent bits of ~2^-3, random mantissa
  size_t workspace_bytes;
  const ByocProfilerCandidate* candidates;
  int candidate_count;
};

struct ByocProfilerTable {
  const ByocProfilerProblem* problems;
  int problem_count;
  int min_iterations;   // launches timed per trial, at least
  int problem_seconds;  // a problem's alarm: a hung candidate ends the profiler after this long
};

extern "C" const ByocProfilerTable byoc_profiler_table;

#endif  // BYOC_CUTLASS_PROFILER_H_
