// The model runtime: the C ABI of byoc_model.h over the tables a model's host code
// generates (model_runtime.h): errors, the caller's tensors checked, the weights loaded,
// create / run / destroy, the call table walked. Static C++, compiled once per flavor into
// the object cache: BYOC_RUNTIME_CUDA=1 for cuda models, which also link
// model_runtime_cuda.cc (device memory, the status word, CUDA graphs), 0 for cpu models.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>

#include "model_runtime_internal.h"

#define BYOC_EXPORT extern "C" __attribute__((visibility("default")))

using byoc_runtime::Call;
using byoc_runtime::ModelSpec;
using byoc_runtime::Ref;
using byoc_runtime::TensorSpec;
using byoc_runtime::VariantSpec;

namespace {
// A fixed buffer, not a std::string: a thread_local with a destructor would pin the library
// in memory (glibc keeps such a library loaded until its threads exit), so a process that
// loads and closes many models would keep every one mapped.
thread_local char last_error[2048] = "";
}  // namespace

namespace byoc_runtime {
namespace internal {

const ModelSpec& spec = byoc_model_spec;

Variant variant_of(byoc_model* model, int32_t number) {
  return Variant{number, spec.variants[number], program_of(number), model->variants[number]};
}

int fail(const std::string& message) {
  std::snprintf(last_error, sizeof(last_error), "%s", message.c_str());
  return 1;
}

#if !BYOC_RUNTIME_CUDA
int device_alloc(unsigned char** out, uint64_t bytes, const char* what) {
  *out = nullptr;
  if (bytes == 0) return 0;
  // 256-byte alignment, the same as planned offsets, so vector loads stay aligned.
  void* p = std::aligned_alloc(256, (bytes + 255) / 256 * 256);
  if (p == nullptr) return fail(std::string(what) + ": out of host memory (" + std::to_string(bytes) + " bytes)");
  *out = static_cast<unsigned char*>(p);
  return 0;
}

void device_free(unsigned char* p) { std::free(p); }
#endif

}  // namespace internal
}  // namespace byoc_runtime

// the helpers the runtime's parts share (model_runtime_internal.h)
using namespace byoc_runtime::internal;  // NOLINT(build/namespaces)

extern "C" {

__attribute__((visibility("hidden"))) int byoc_report_error(const char* symbol, const char* message) {
  std::snprintf(last_error, sizeof(last_error), "%s: %s", symbol, message);
  return 1;
}

// A checksum of embedded bytes (the weights, JSON graphs), computed by the build the same
// way (byoc.codegen.host.blob_checksum): each 8-byte little-endian word (the last one
// zero-padded) mixed with its position by splitmix64's finalizer, summed, and the sum
// mixed with the length. Not a cryptographic hash: it finds a corrupted or edited file.
__attribute__((visibility("hidden"))) uint64_t byoc_blob_checksum(const void* data, size_t bytes) {
  auto mix = [](uint64_t x) {
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
  };
  const unsigned char* p = static_cast<const unsigned char*>(data);
  const size_t words = bytes / 8;
  uint64_t sum = 0;
  for (size_t i = 0; i < words; ++i) {
    uint64_t word;
    std::memcpy(&word, p + 8 * i, 8);
    sum += mix(word ^ (i * 0x9E3779B97F4A7C15ull));
  }
  if (bytes % 8) {
    uint64_t word = 0;
    std::memcpy(&word, p + 8 * words, bytes % 8);
    sum += mix(word ^ (words * 0x9E3779B97F4A7C15ull));
  }
  return mix(sum ^ (static_cast<uint64_t>(bytes) * 0x9E3779B97F4A7C15ull));
}

}  // extern "C"

namespace {

std::string shape_text(int32_t ndim, const int64_t* shape) {
  // a caller's ndim beyond any tensor's is not read through (its shape array is that long
  // only if the ndim is true)
  if (ndim < 0 || ndim > 64) return "(" + std::to_string(ndim) + " dims)";
  std::string text = "(";
  for (int32_t i = 0; i < ndim; ++i) {
    if (i) text += ", ";
    text += std::to_string(shape[i]);
  }
  return text + (ndim == 1 ? ",)" : ")");
}

std::string dtype_text(uint8_t code, uint8_t bits, uint16_t lanes) {
  const char* kind = code == BYOC_DL_FLOAT ? "float" : code == BYOC_DL_BFLOAT ? "bfloat"
                   : code == BYOC_DL_INT ? "int" : code == BYOC_DL_UINT ? "uint"
                   : code == BYOC_DL_BOOL ? "bool" : "code";
  std::string text = std::string(kind) + std::to_string(bits);
  if (code == BYOC_DL_BOOL && bits == 8) text = "bool";
  if (lanes != 1) text += "x" + std::to_string(lanes);
  return text;
}

// Checks one caller tensor against its spec; returns its data pointer or sets the error.
void* checked_data(const char* role, int32_t index, const TensorSpec& tensor_spec, const byoc_dl_tensor& t,
                   bool on_host) {
  // the tensor's name for a message, built only when one is needed (run() allocates nothing)
  auto who = [&] { return std::string(role) + " '" + tensor_spec.name + "' (#" + std::to_string(index) + ")"; };
  if (t.ndim != tensor_spec.ndim || (t.ndim > 0 && t.shape == nullptr) ||
      (t.ndim > 0 && std::memcmp(t.shape, tensor_spec.shape, sizeof(int64_t) * tensor_spec.ndim) != 0)) {
    fail(who() + ": expected shape " + shape_text(tensor_spec.ndim, tensor_spec.shape) + ", got " +
         (t.ndim > 0 && t.shape == nullptr ? std::string("no shape") : shape_text(t.ndim, t.shape)));
    return nullptr;
  }
  if (t.dtype.code != tensor_spec.code || t.dtype.bits != tensor_spec.bits || t.dtype.lanes != 1) {
    fail(who() + ": expected dtype " + tensor_spec.dtype + ", got " +
         dtype_text(t.dtype.code, t.dtype.bits, t.dtype.lanes));
    return nullptr;
  }
#if BYOC_RUNTIME_CUDA
  if (on_host) {
    if (t.device.device_type != BYOC_DL_CPU && t.device.device_type != BYOC_DL_CUDA_HOST) {
      fail(who() + ": expected a host tensor (cpu or pinned), got device type " + std::to_string(t.device.device_type));
      return nullptr;
    }
  } else if (t.device.device_type != BYOC_DL_CUDA) {
    fail(who() + ": expected a CUDA device tensor, got device type " + std::to_string(t.device.device_type) +
         (t.device.device_type == BYOC_DL_CPU ? " (cpu)" : ""));
    return nullptr;
  }
#else
  (void)on_host;
  if (t.device.device_type != BYOC_DL_CPU && t.device.device_type != BYOC_DL_CUDA_HOST) {
    fail(who() + ": expected a cpu tensor, got device type " + std::to_string(t.device.device_type) +
         (t.device.device_type == BYOC_DL_CUDA ? " (cuda)" : ""));
    return nullptr;
  }
#endif
  if (t.strides != nullptr) {
    int64_t expected = 1;
    for (int32_t d = tensor_spec.ndim - 1; d >= 0; --d) {
      if (tensor_spec.shape[d] != 1 && t.strides[d] != expected) {
        fail(who() + ": expected a contiguous (row-major) tensor, got strides " +
             shape_text(t.ndim, t.strides) + " (in elements)");
        return nullptr;
      }
      expected *= tensor_spec.shape[d];
    }
  }
  if (t.data == nullptr && tensor_spec.bytes != 0) {
    fail(who() + ": data pointer is NULL");
    return nullptr;
  }
  return static_cast<char*>(t.data) + t.byte_offset;
}

// Reads the .safetensors sidecar: one uint8 tensor "byoc_weights" whose __metadata__
// carries the build id this library expects.
int read_sidecar(const char* path, unsigned char** host_out) {
  // Opened without blocking and checked to be a regular file: a FIFO would block here.
  const int descriptor = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (descriptor < 0) return fail(std::string("cannot open weights file '") + path + "': " + std::strerror(errno));
  struct stat info;
  if (fstat(descriptor, &info) != 0 || !S_ISREG(info.st_mode)) {
    close(descriptor);
    return fail(std::string("weights file '") + path + "' is not a regular file; expected the .safetensors sidecar");
  }
  FILE* file = fdopen(descriptor, "rb");
  if (file == nullptr) {
    close(descriptor);
    return fail(std::string("cannot open weights file '") + path + "'");
  }
  uint64_t header_bytes = 0;
  std::string header;
  bool ok = std::fread(&header_bytes, 8, 1, file) == 1 && header_bytes < (1u << 26);
  if (ok) {
    header.resize(header_bytes);
    ok = std::fread(&header[0], 1, header_bytes, file) == header_bytes;
  }
  if (!ok || header.find("\"byoc_weights\"") == std::string::npos) {
    std::fclose(file);
    return fail(std::string("weights file '") + path + "' is not a byoc .safetensors sidecar");
  }
  if (header.find(std::string("\"build_id\":\"") + spec.build_id + "\"") == std::string::npos) {
    std::fclose(file);
    return fail(std::string("weights file '") + path + "' belongs to another build (expected build id " +
                spec.build_id + ")");
  }
  const uint64_t bytes = spec.weights_bytes;
  unsigned char* host = static_cast<unsigned char*>(std::malloc(bytes ? bytes : 1));
  if (host == nullptr) {
    std::fclose(file);
    return fail("out of host memory reading the weights");
  }
  if (std::fread(host, 1, bytes, file) != bytes) {
    std::free(host);
    std::fclose(file);
    return fail(std::string("weights file '") + path + "' is truncated");
  }
  std::fclose(file);
  *host_out = host;
  return 0;
}

}  // namespace

BYOC_EXPORT const char* byoc_model_metadata(void) { return spec.metadata; }

BYOC_EXPORT const char* byoc_last_error(void) { return last_error; }

BYOC_EXPORT void byoc_model_destroy(byoc_model* model) {
  if (model == nullptr) return;
  for (int32_t v = 0; model->variants != nullptr && v < spec.num_variants; ++v) {
    const VariantSpec& variant = spec.variants[v];
    byoc_variant_instance& instance = model->variants[v];
    for (int32_t i = 0; i < variant.num_states && instance.states != nullptr; ++i) {
      if (instance.states[i] != nullptr) variant.states[i].destroy(instance.states[i]);
    }
    delete[] instance.states;
#if BYOC_RUNTIME_CUDA
    // (programs are decoded before any instance has graphs)
    for (int32_t r = 0; instance.graph_execs && r < program_of(v).num_regions; ++r) {
      if (instance.graph_execs[r]) cudaGraphExecDestroy(instance.graph_execs[r]);
    }
    delete[] instance.graph_execs;
    delete[] instance.graph_in;
    delete[] instance.graph_out;
#endif
  }
  delete[] model->variants;
  free_staging(model);
#if BYOC_RUNTIME_CUDA
  if (model->owns_weights) device_free(model->weights);
#else
  if (model->owns_weights) std::free(model->weights);
#endif
  device_free(model->arena);
  device_free(model->workspace);
#if BYOC_RUNTIME_CUDA
  if (model->status_word) cudaFreeHost(model->status_word);
  std::free(model->owned_host_weights);
  std::free(model->host_arena);
  std::free(model->host_workspace);
  if (model->pinned_arena) cudaFreeHost(model->pinned_arena);
  if (model->capture_stream) cudaStreamDestroy(model->capture_stream);
#endif
  delete model;
}

namespace {

// The weights in host memory (inside the library, or read from the sidecar into
// `*sidecar`, which the caller frees), checked against their checksum.
int host_weights_of(const char* weights_path, const unsigned char** host_weights, unsigned char** sidecar) {
  *sidecar = nullptr;
  if (spec.embedded_weights != nullptr) {
    *host_weights = spec.embedded_weights;
  } else {
    if (weights_path == nullptr) return fail("this model keeps its weights in a .safetensors sidecar; pass its path");
    if (read_sidecar(weights_path, sidecar)) return 1;
    *host_weights = *sidecar;
  }
  if (byoc_blob_checksum(*host_weights, spec.weights_bytes) != spec.weights_checksum) {
    std::free(*sidecar);
    *sidecar = nullptr;
    if (spec.embedded_weights != nullptr) {
      return fail("the weights embedded in the library do not match their checksum: the library file is corrupted "
                  "or was changed after the build; rebuild it");
    }
    return fail(std::string("the weights in '") + weights_path + "' do not match their checksum: the file is "
                "corrupted or was changed after the build; rebuild it");
  }
  return 0;
}

}  // namespace

BYOC_EXPORT int byoc_model_create(byoc_model** out, const char* weights_path) {
  if (out == nullptr) return fail("byoc_model_create: the output pointer is NULL");
  *out = nullptr;
  if (load_programs()) return 1;
#if BYOC_RUNTIME_CUDA
  if (check_device()) return 1;
#endif
  byoc_model* model = new (std::nothrow) byoc_model();
  if (model == nullptr) return fail("out of host memory");
  model->variants = new (std::nothrow) byoc_variant_instance[spec.num_variants]();
  bool allocated_states = model->variants != nullptr;
  for (int32_t v = 0; allocated_states && v < spec.num_variants; ++v) {
    model->variants[v].states = new (std::nothrow) void*[spec.variants[v].num_states + 1]();
    allocated_states = model->variants[v].states != nullptr;
  }
  if (!allocated_states) {
    byoc_model_destroy(model);
    return fail("out of host memory");
  }
  const unsigned char* host_weights = nullptr;
  unsigned char* sidecar = nullptr;
  if (host_weights_of(weights_path, &host_weights, &sidecar)) {
    byoc_model_destroy(model);
    return 1;
  }
#if BYOC_RUNTIME_CUDA
  const int allocated = allocate_cuda(model, host_weights, &sidecar);
  std::free(sidecar);  // unless cpu functions keep reading it (allocate_cuda took it then)
  if (allocated) {
    byoc_model_destroy(model);
    return 1;
  }
#else
  model->weights = const_cast<unsigned char*>(host_weights);  // read-only use, no copy
  model->owns_weights = sidecar != nullptr;
  model->workspace_bytes = largest(&VariantSpec::workspace_bytes);
  if (device_alloc(&model->arena, largest(&VariantSpec::arena_bytes), "allocating the activation arena") ||
      device_alloc(&model->workspace, model->workspace_bytes, "allocating the workspace")) {
    byoc_model_destroy(model);
    return 1;
  }
#endif
  if (allocate_staging(model)) {
    byoc_model_destroy(model);
    return 1;
  }
  // Backends that set themselves up at load (JSON engines: parse, plan, choose algorithms).
  for (int32_t v = 0; v < spec.num_variants; ++v) {
    const VariantSpec& variant = spec.variants[v];
    for (int32_t i = 0; i < variant.num_states; ++i) {
      if (variant.states[i].init(model->weights, spec.weights_bytes, &model->variants[v].states[i]) != 0) {
        std::string message = last_error;
        byoc_model_destroy(model);
        return fail(message);
      }
    }
  }
  *out = model;
  return 0;
}

namespace byoc_runtime {
namespace internal {

// The address a Ref names in this run.
void* resolve(const byoc_model* model, const Ref& ref, void* const* in, void* const* out) {
  switch (ref.space) {
    case byoc_runtime::kArena: return model->arena + ref.offset;
    case byoc_runtime::kWeights: return model->weights + ref.offset;
    case byoc_runtime::kInput: return in[ref.offset];
    case byoc_runtime::kOutput: return out[ref.offset];
#if BYOC_RUNTIME_CUDA
    case byoc_runtime::kHostArena: return model->host_arena + ref.offset;
    case byoc_runtime::kPinnedArena: return model->pinned_arena + ref.offset;
    case byoc_runtime::kHostWeights: return const_cast<unsigned char*>(model->host_weights) + ref.offset;
#endif
    default: return nullptr;
  }
}

// Copies `bytes` in stream order (cuda) or at once (cpu). A failure is reported as `what`,
// followed by `number` when that is not negative; the message is built only then (run()
// allocates nothing).
int copy_bytes(void* destination, const void* source, uint64_t bytes, void* stream, const char* what,
               int32_t number) {
#if BYOC_RUNTIME_CUDA
  const cudaError_t status =
      cudaMemcpyAsync(destination, source, bytes, cudaMemcpyDefault, static_cast<cudaStream_t>(stream));
  if (status == cudaSuccess) return 0;
  return cuda_failed(status, number < 0 ? what : (std::string(what) + " " + std::to_string(number)).c_str());
#else
  (void)stream;
  (void)what;
  (void)number;
  std::memcpy(destination, source, bytes);
  return 0;
#endif
}

// Calls [first, end) in order; `in`/`out` are the caller's data pointers (unused by the
// calls when the model copies its inputs and outputs around its CUDA graphs).
int run_calls(byoc_model* model, const Variant& variant, void* const* in, void* const* out, void* stream,
              int32_t first, int32_t end) {
  const byoc_runtime::Program& program = variant.program;
  // on the stack: run() never allocates
  void** args = static_cast<void**>(__builtin_alloca(sizeof(void*) * (program.max_args + 1)));
  args[0] = nullptr;
  for (int32_t index = first; index < end; ++index) {
    const Call& call = program.calls[index];
    void* result = resolve(model, program.refs[call.result], in, out);
    if (call.is_copy) {
      if (copy_bytes(result, resolve(model, program.refs[call.first_arg], in, out), call.bytes, stream, call.label, -1)) {
        return 1;
      }
      continue;
    }
#if BYOC_RUNTIME_CUDA
    // a cpu function: wait for the GPU work (and copies) it reads
    if (call.sync_before &&
        cuda_failed(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)), "waiting for the GPU")) {
      return 1;
    }
    current_call = call_number(variant.number, index);
#endif
    for (uint32_t a = 0; a < call.num_args; ++a) args[a] = resolve(model, program.refs[call.first_arg + a], in, out);
    void* const results[] = {result};
    void* workspace = model->workspace;
    uint64_t workspace_bytes = model->workspace_bytes;
    void* call_stream = stream;
#if BYOC_RUNTIME_CUDA
    if (call.on_host) {
      workspace = model->host_workspace;
      workspace_bytes = model->host_workspace_bytes;
      call_stream = nullptr;
    }
#endif
    const int status = call.stateful != nullptr
        ? call.stateful(variant.instance.states[call.state], args, results, workspace, workspace_bytes, call_stream)
        : call.function(args, results, workspace, workspace_bytes, call_stream);
    if (status != 0) return 1;
  }
  return 0;
}

}  // namespace internal
}  // namespace byoc_runtime

namespace {

// Whether the bytes of two tensors overlap (an out= array that is also an input, or a
// view of one: the calls would overwrite what later calls still read).
bool overlaps(const void* a, uint64_t a_bytes, const void* b, uint64_t b_bytes) {
  const uintptr_t a0 = reinterpret_cast<uintptr_t>(a), b0 = reinterpret_cast<uintptr_t>(b);
  return a_bytes != 0 && b_bytes != 0 && a0 < b0 + b_bytes && b0 < a0 + a_bytes;
}

int check_no_overlap(const VariantSpec& variant, void* const* in, void* const* out) {
  for (int32_t o = 0; o < variant.num_outputs; ++o) {
    for (int32_t i = 0; i < variant.num_inputs; ++i) {
      if (overlaps(out[o], variant.outputs[o].bytes, in[i], variant.inputs[i].bytes)) {
        return fail(std::string("output '") + variant.outputs[o].name + "' (#" + std::to_string(o) +
                    ") overlaps input '" + variant.inputs[i].name + "' (#" + std::to_string(i) +
                    "); expected separate memory for outputs");
      }
    }
    for (int32_t other = 0; other < o; ++other) {
      if (overlaps(out[o], variant.outputs[o].bytes, out[other], variant.outputs[other].bytes)) {
        return fail(std::string("output '") + variant.outputs[o].name + "' (#" + std::to_string(o) +
                    ") overlaps output '" + variant.outputs[other].name + "' (#" + std::to_string(other) +
                    "); expected separate memory for outputs");
      }
    }
  }
  return 0;
}

// The caller's tensors checked against the spec, as data pointers in `in` and `out`.
int checked_tensors(const VariantSpec& variant, const byoc_dl_tensor* inputs, int32_t num_inputs,
                    const byoc_dl_tensor* outputs, int32_t num_outputs, void** in, void** out) {
  if (num_inputs != variant.num_inputs) {
    return fail("expected " + std::to_string(variant.num_inputs) + " inputs, got " + std::to_string(num_inputs));
  }
  if (num_outputs != variant.num_outputs) {
    return fail("expected " + std::to_string(variant.num_outputs) + " outputs, got " + std::to_string(num_outputs));
  }
  if ((variant.num_inputs && inputs == nullptr) || (variant.num_outputs && outputs == nullptr)) {
    return fail("byoc_model_run: the input or output array is NULL");
  }
  for (int32_t i = 0; i < variant.num_inputs; ++i) {
    in[i] = checked_data("input", i, variant.inputs[i], inputs[i], variant.input_on_host && variant.input_on_host[i]);
    if (in[i] == nullptr && variant.inputs[i].bytes != 0) return 1;
  }
  for (int32_t i = 0; i < variant.num_outputs; ++i) {
    out[i] = checked_data("output", i, variant.outputs[i], outputs[i], variant.output_on_host && variant.output_on_host[i]);
    if (out[i] == nullptr && variant.outputs[i].bytes != 0) return 1;
  }
  return check_no_overlap(variant, in, out);
}

}  // namespace

#if !BYOC_RUNTIME_CUDA
// The cpu target reports every error from the run itself (model_runtime_cuda.cc: the
// kernels' reports).
BYOC_EXPORT int byoc_model_status(byoc_model* model) {
  return model == nullptr ? fail("byoc_model_status: the model is NULL") : 0;
}
#endif

namespace {

bool same_shape(const byoc_dl_tensor& t, const TensorSpec& tensor_spec) {
  return t.ndim == tensor_spec.ndim &&
         (t.ndim == 0 || (t.shape != nullptr && std::memcmp(t.shape, tensor_spec.shape, sizeof(int64_t) * t.ndim) == 0));
}

// The variant whose inputs have the shapes of the caller's, else (padded dims) the smallest
// one they fit padded, with `*padded` set and the dims' sizes in `sizes`; or -1 with the
// error set. A model of one variant takes it, and run()'s checks say what does not fit.
int32_t matching_variant(const byoc_dl_tensor* inputs, int32_t num_inputs, bool* padded, int64_t* sizes) {
  *padded = false;
  if (spec.num_variants == 1) return 0;
  for (int32_t v = 0; v < spec.num_variants; ++v) {
    const VariantSpec& variant = spec.variants[v];
    bool fits = num_inputs == variant.num_inputs && (num_inputs == 0 || inputs != nullptr);
    for (int32_t i = 0; fits && i < num_inputs; ++i) fits = same_shape(inputs[i], variant.inputs[i]);
    if (fits) return v;
  }
  const int32_t padded_number = padded_variant(inputs, num_inputs, sizes);
  if (padded_number >= 0) {
    *padded = true;
    return padded_number;
  }
  // the message is built only now (run() allocates nothing on its way)
  const VariantSpec& first = spec.variants[0];
  if (num_inputs != first.num_inputs) {
    fail("expected " + std::to_string(first.num_inputs) + " inputs, got " + std::to_string(num_inputs));
    return -1;
  }
  if (num_inputs && inputs == nullptr) {
    fail("byoc_model_run: the input or output array is NULL");
    return -1;
  }
  std::string given, buckets;
  for (int32_t i = 0; i < num_inputs; ++i) {
    given += std::string(i ? ", " : "") + first.inputs[i].name + " " +
             (inputs[i].ndim > 0 && inputs[i].shape == nullptr ? std::string("(no shape)")
                                                               : shape_text(inputs[i].ndim, inputs[i].shape));
  }
  for (int32_t v = 0; v < spec.num_variants; ++v) {
    buckets += v ? "; " : "";
    for (int32_t i = 0; i < num_inputs; ++i) {
      const TensorSpec& tensor = spec.variants[v].inputs[i];
      buckets += std::string(i ? ", " : "") + tensor.name + " " + shape_text(tensor.ndim, tensor.shape);
    }
  }
  if (spec.num_padded_dims == 0) {
    fail("the inputs' shapes (" + given + ") are none of the shapes this model was built for: " + buckets);
  } else {
    fail("the inputs' shapes (" + given + ") fit none of the shapes this model was built for: " + buckets +
         " (padded: " + padded_dims_text() + ")");
  }
  return -1;
}

}  // namespace

BYOC_EXPORT int byoc_model_run(byoc_model* model, const byoc_dl_tensor* inputs, int32_t num_inputs,
                               const byoc_dl_tensor* outputs, int32_t num_outputs, void* stream) {
  if (model == nullptr) return fail("byoc_model_run: the model is NULL (create failed or was destroyed)");
#if BYOC_RUNTIME_CUDA
  if (take_reported_error(model)) return 1;
#endif
  // on the stack: run() never allocates
  int64_t* sizes = static_cast<int64_t*>(__builtin_alloca(sizeof(int64_t) * (spec.num_padded_dims + 1)));
  bool padded = false;
  const int32_t number = matching_variant(inputs, num_inputs, &padded, sizes);
  if (number < 0) return 1;
  const Variant variant = variant_of(model, number);
  const VariantSpec& v = variant.spec;
  const byoc_runtime::Program& program = variant.program;
  void** in = static_cast<void**>(__builtin_alloca(sizeof(void*) * (v.num_inputs + 1)));
  void** out = static_cast<void**>(__builtin_alloca(sizeof(void*) * (v.num_outputs + 1)));
  void** caller_out = static_cast<void**>(__builtin_alloca(sizeof(void*) * (v.num_outputs + 1)));
  // the tensors as the caller gives them: the variant's, or (padded) of the sizes the inputs imply
  VariantSpec caller = v;
  if (padded) {
    TensorSpec* views = static_cast<TensorSpec*>(__builtin_alloca(sizeof(TensorSpec) * (v.num_inputs + v.num_outputs)));
    for (int32_t i = 0; i < v.num_inputs; ++i) caller_view(v.inputs[i], v.padded_dim_values, sizes, &views[i]);
    for (int32_t o = 0; o < v.num_outputs; ++o) {
      caller_view(v.outputs[o], v.padded_dim_values, sizes, &views[v.num_inputs + o]);
    }
    caller.inputs = views;
    caller.outputs = views + v.num_inputs;
  }
  if (checked_tensors(caller, inputs, num_inputs, outputs, num_outputs, in, out)) return 1;
#if BYOC_RUNTIME_CUDA
  current_status_word = model->status_word;
  struct ClearStatusWord {  // on every return: no other code of this thread reports into it
    ~ClearStatusWord() {
      current_status_word = nullptr;
      current_call = 0;
    }
  } clear_status_word;
  cudaStream_t run_stream = static_cast<cudaStream_t>(stream);
  if (padded && stage_inputs(model, variant, caller, in, out, caller_out, stream)) return 1;
  if (v.cuda_graph ? run_graph(model, variant, in, out, run_stream)
                   : run_calls(model, variant, in, out, stream, 0, program.num_calls)) {
    return 1;
  }
  if (v.sync_at_end &&  // outputs are delivered in host memory: complete when run() returns
      cuda_failed(cudaStreamSynchronize(run_stream), "waiting for the outputs")) {
    return 1;
  }
#else
  if (padded && stage_inputs(model, variant, caller, in, out, caller_out, stream)) return 1;
  if (run_calls(model, variant, in, out, stream, 0, program.num_calls)) return 1;
#endif
  // Outputs that no call wrote into the caller's buffer (with a CUDA graph: every output,
  // since the graph only ever writes planned storage) are copied out last, in stream order.
  for (int32_t i = 0; i < program.num_output_copies; ++i) {
    const byoc_runtime::Copy& copy = program.output_copies[i];
    const void* source = resolve(model, copy.ref, in, out);
    if (source == out[copy.tensor]) continue;  // a padded output, cut from there (model_padding.cc)
    if (copy_bytes(out[copy.tensor], source, copy.bytes, stream, "copying output",
                   copy.tensor)) {
      return 1;
    }
  }
  if (padded && unstage_outputs(v, caller, out, caller_out, stream)) return 1;
#if BYOC_RUNTIME_CUDA
  if (v.devices && program.num_output_copies &&  // outputs delivered in host memory are complete on return
      cuda_failed(cudaStreamSynchronize(run_stream), "waiting for the outputs")) {
    return 1;
  }
  // Launch errors of the last kernels (without synchronizing the stream).
  if (cuda_failed(cudaGetLastError(), "running the model")) return 1;
#endif
  return 0;
}
