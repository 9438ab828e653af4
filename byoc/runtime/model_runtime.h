// What a model's generated host code (templates/host/model.cc.j2) gives the static model
// runtime (model_runtime.cc): one ModelSpec, with a VariantSpec per program, data only.
// The runtime implements the C ABI (byoc_model.h) over it: create loads the weights and allocates, run checks the caller's
// tensors and walks the call table (capturing it into CUDA graphs where the build says
// so), destroy frees. The runtime is compiled once per target flavor (cpu, cuda) into the
// object cache; only the tables are generated per model: the caller's tensors, the
// functions to call, and the program (the calls, their operands, the graph regions and
// the caller copies) as an embedded binary table that model_program.cc decodes.
#ifndef BYOC_MODEL_RUNTIME_H_
#define BYOC_MODEL_RUNTIME_H_

#include <stddef.h>
#include <stdint.h>

namespace byoc_runtime {

// A caller tensor as the model declares it.
struct TensorSpec {
  const char* name;
  int32_t ndim;
  int64_t shape[8];
  uint8_t code;
  uint8_t bits;
  const char* dtype;
  uint64_t bytes;
  // Per axis, with shape buckets: 0 a fixed axis; n an axis that carries padded dim n - 1
  // (ModelSpec::padded_dims), whose extent is the variant's size of the dim times a factor.
  // run() takes an input of any size up to the variant's on such axes (padding it with
  // zeros), and gives outputs of the sizes the inputs imply.
  uint8_t padded[8];
};

// Where a call's operand or result lives: a byte offset into one of the model's memories,
// or the caller's input / output number `offset`.
enum Space : uint8_t {
  kArena,        // the device (or, on the cpu, host) activation arena
  kWeights,      // the weights the calls read (a device copy on cuda)
  kInput,        // the caller's input #offset
  kOutput,       // the caller's output #offset
  kHostArena,    // PlanDevices' pageable host arena (cuda builds with data on the host)
  kPinnedArena,  // its page-locked staging arena
  kHostWeights,  // the weights in host memory, for cpu functions of a cuda build
};

struct Ref {
  Space space;
  uint64_t offset;
};

using ExternFunction = int (*)(void* const* args, void* const* results, void* workspace, size_t workspace_bytes,
                               void* stream);
using StatefulFunction = int (*)(void* state, void* const* args, void* const* results, void* workspace,
                                 size_t workspace_bytes, void* stream);

// One step of run(), in order: an extern call (`function`, or `stateful` with its state
// number) on refs[first_arg .. first_arg + num_args) writing refs[result], or a copy of
// `bytes` from refs[first_arg] to refs[result] (a device_copy between memories). Decoded
// from the program table.
struct Call {
  ExternFunction function;
  StatefulFunction stateful;
  int32_t state;
  bool is_copy;
  bool on_host;      // a cpu function of a cuda build: host arenas, host workspace, no stream
  bool sync_before;  // wait for the stream first (the cpu function reads what the GPU wrote)
  uint32_t first_arg;
  uint32_t num_args;
  uint32_t result;
  uint64_t bytes;
  const char* label;  // "#position value = symbol"
};

// With CUDA graphs: calls [first_call, first_call + num_calls), captured into one graph
// (`capture`) or run directly (a cpu function, a copy between memories).
struct Region {
  uint32_t first_call;
  uint32_t num_calls;
  bool capture;
};

// A caller tensor copied to (inputs, before a CUDA graph) or from (outputs) `ref`.
struct Copy {
  int32_t tensor;
  Ref ref;
  uint64_t bytes;
};

// Functions with state per model instance (JSON engines): init makes it at create,
// destroy frees it, call runs the function with it.
struct State {
  int (*init)(const void* weights, size_t weights_bytes, void** state);
  void (*destroy)(void* state);
  StatefulFunction call;
};

// The calls, operands, regions and caller copies of a model, decoded from its program
// table (model_program.cc): what run() walks.
struct Program {
  int32_t num_calls;
  uint32_t max_args;  // the most operands of one call
  const Call* calls;
  const Ref* refs;
  int32_t num_regions;  // with cuda_graph: the regions cover every call, in order
  const Region* regions;
  int32_t num_input_copies;
  const Copy* input_copies;
  int32_t num_output_copies;  // outputs no call writes into the caller's buffer
  const Copy* output_copies;
};

// One program of the model, for one set of input shapes: the tensors it takes and gives,
// its memory, its functions and its program table. A static build has one; a build with
// shape buckets one per bucket, all reading the one set of weights. run() runs the variant
// whose input shapes the caller's tensors have, else the smallest one they fit padded.
struct VariantSpec {
  int32_t num_inputs;
  int32_t num_outputs;
  const TensorSpec* inputs;
  const TensorSpec* outputs;
  uint64_t arena_bytes;
  uint64_t workspace_bytes;
  // PlanDevices put data on the host too (cuda): which caller tensors are in host memory
  // and the host-side buffers; run() ends by synchronizing when an output is on the host.
  bool devices;
  const bool* input_on_host;
  const bool* output_on_host;
  uint64_t host_arena_bytes;
  uint64_t pinned_arena_bytes;
  uint64_t host_workspace_bytes;
  bool sync_at_end;
  // CUDA graphs: each capturing region is captured on the second run and replayed later;
  // "update" mode captures the caller's pointers (new pointers update the graphs), else
  // the inputs are copied into planned storage first (input_copies) and every output out
  // last.
  bool cuda_graph;
  bool graph_io_update;
  int32_t num_functions;  // the extern functions the program calls by number
  const ExternFunction* functions;
  int32_t num_states;
  const State* states;
  const unsigned char* program;  // the program table (model_program.cc), from program.S
  uint64_t program_bytes;
  uint64_t program_checksum;  // byoc_blob_checksum of the program table
  const int64_t* padded_dim_values;  // the variant's size of each padded dim
  // cuda: the sm its kernels were compiled for (0: the model's arch_number), and whether
  // they carry PTX too, which a GPU of a later arch compiles when it loads them. A build
  // for several archs (config `arch`) has a variant per arch and bucket; an instance runs
  // those of one arch, chosen at create for its device.
  int32_t arch_number;
  bool arch_ptx;
};

struct ModelSpec {
  const char* metadata;  // the metadata JSON
  const char* build_id;
  // The build's identity without its weights (byoc.package.program_identity): a weights
  // file of this program, written by this build or by `byoc refit`, carries it.
  const char* program_id;
  int32_t arch_number;   // cuda: the sm the kernels were compiled for (several: the highest)
  // true: the weights follow the ELF image in the library's file (model_runtime.cc maps
  // them at load); false: a .safetensors sidecar holds them
  bool weights_appended;
  uint64_t weights_bytes;
  uint64_t weights_checksum;  // byoc_blob_checksum of the weights
  int32_t num_variants;  // at least 1
  const VariantSpec* variants;
  // Shape buckets: the dims whose sizes between the buckets run padded into a larger one
  // (analysis/padding.py found every op keeps their rows apart), by name.
  int32_t num_padded_dims;
  const char* const* padded_dims;
};

}  // namespace byoc_runtime

// Defined by the model's host code.
extern "C" const byoc_runtime::ModelSpec byoc_model_spec;

// The declaration of one of a model's extern functions (the partition entry points).
#define BYOC_EXTERN_FUNCTION(name) \
  extern "C" int name(void* const* args, void* const* results, void* workspace, size_t workspace_bytes, void* stream)
// ... and of one with state per model instance (SYMBOL_init makes it, SYMBOL_destroy frees it).
#define BYOC_STATEFUL_FUNCTION(name)                                                                      \
  extern "C" int name(void* state, void* const* args, void* const* results, void* workspace,             \
                      size_t workspace_bytes, void* stream);                                             \
  extern "C" int name##_init(const void* weights, size_t weights_bytes, void** state);                   \
  extern "C" void name##_destroy(void* state)

#endif  // BYOC_MODEL_RUNTIME_H_
