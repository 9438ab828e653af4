// The CPU shim's error message, exported through the ABI. Reporting and the argument
// checks are shared with the CUDA shim: ../shim_checks.h.
#include "shim_cpu.h"

extern "C" const char* byoc_shim_last_error(void) { return byoc_shim_checks::last_error_message; }
