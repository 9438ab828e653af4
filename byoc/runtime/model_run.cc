// The model runtime's run: byoc_model_run of byoc_model.h over the tables a model's host
// code generates (model_runtime.h): the caller's tensors matched to a variant (a shape
// bucket, padded where run() may pad) and checked, then the program table's calls walked,
// each operand resolved to its memory. model_runtime.cc has the rest of the C ABI
// (errors, create, destroy, the weights).
#include <cstring>
#include <string>

#include "model_runtime_internal.h"

using byoc_runtime::Call;
using byoc_runtime::Ref;
using byoc_runtime::TensorSpec;
using byoc_runtime::VariantSpec;
// the helpers the runtime's parts share (model_runtime_internal.h)
using namespace byoc_runtime::internal;  // NOLINT(build/namespaces)

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
                   bool on_host, int device) {
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
  } else if (t.device.device_id != device) {
    fail(who() + ": is on CUDA device " + std::to_string(t.device.device_id) + "; this model runs on device " +
         std::to_string(device));
    return nullptr;
  }
#else
  (void)on_host;
  (void)device;
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
  char* data = static_cast<char*>(t.data) + t.byte_offset;
  // every kernel reads its elements as their type: an address between elements is undefined
  // behaviour in C++ and a misaligned-address fault on the GPU
  const uint64_t element_bytes = tensor_spec.bits >= 8 ? tensor_spec.bits / 8 : 1;
  if (reinterpret_cast<uintptr_t>(data) % element_bytes != 0) {
    fail(who() + ": its data starts at an address that is not a multiple of its element size (" +
         std::to_string(element_bytes) + " bytes); expected an aligned tensor (a copy of it is one)");
    return nullptr;
  }
  return data;
}

#if BYOC_RUNTIME_CUDA
// The alignment the kernels that read and write a caller's device tensor in place may
// assume: the vector loads of the built-in, CUTLASS and cuDNN kernels take floating-point
// tensors 16 bytes at a time (the generated code declares them so), and a misaligned one
// would fault and leave the process's CUDA context unusable. Allocators give far more; a
// view that starts inside another tensor (x[1:]) may not.
constexpr uint64_t kInPlaceAlignment = 16;

int check_in_place_alignment(const char* role, int32_t count, const TensorSpec* tensors, void* const* data,
                             const bool* on_host) {
  for (int32_t i = 0; i < count; ++i) {
    const TensorSpec& tensor = tensors[i];
    if ((on_host && on_host[i]) || tensor.bytes == 0) continue;  // host tensors are copied
    if (tensor.code != BYOC_DL_FLOAT && tensor.code != BYOC_DL_BFLOAT) continue;
    const uint64_t misaligned = reinterpret_cast<uintptr_t>(data[i]) % kInPlaceAlignment;
    if (misaligned != 0) {
      return fail(std::string(role) + " '" + tensor.name + "' (#" + std::to_string(i) + "): its data starts " +
                  std::to_string(misaligned) + " bytes past a " + std::to_string(kInPlaceAlignment) +
                  "-byte boundary; expected a " + std::to_string(kInPlaceAlignment) +
                  "-byte aligned device tensor (the model's kernels read and write it in place; "
                  "a view that starts inside another tensor may not be one, a copy of it is)");
    }
  }
  return 0;
}
#endif

}  // namespace

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
                    const byoc_dl_tensor* outputs, int32_t num_outputs, void** in, void** out, int device) {
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
    in[i] = checked_data("input", i, variant.inputs[i], inputs[i], variant.input_on_host && variant.input_on_host[i],
                         device);
    if (in[i] == nullptr && variant.inputs[i].bytes != 0) return 1;
  }
  for (int32_t i = 0; i < variant.num_outputs; ++i) {
    out[i] = checked_data("output", i, variant.outputs[i], outputs[i],
                          variant.output_on_host && variant.output_on_host[i], device);
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
int32_t matching_variant(const byoc_model* model, const byoc_dl_tensor* inputs, int32_t num_inputs, bool* padded,
                         int64_t* sizes) {
  *padded = false;
  if (spec.num_variants == 1) return 0;
  int32_t first_run = -1, runs = 0;  // the instance's variants (those of its arch)
  for (int32_t v = 0; v < spec.num_variants; ++v) {
    if (!runs_variant(model, v)) continue;
    runs += 1;
    if (first_run < 0) first_run = v;
  }
  if (runs == 1) return first_run;
  for (int32_t v = 0; v < spec.num_variants; ++v) {
    if (!runs_variant(model, v)) continue;
    const VariantSpec& variant = spec.variants[v];
    bool fits = num_inputs == variant.num_inputs && (num_inputs == 0 || inputs != nullptr);
    for (int32_t i = 0; fits && i < num_inputs; ++i) fits = same_shape(inputs[i], variant.inputs[i]);
    if (fits) return v;
  }
  const int32_t padded_number = padded_variant(model, inputs, num_inputs, sizes);
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
    if (!runs_variant(model, v)) continue;
    buckets += buckets.empty() ? "" : "; ";
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
  const int device = model->device;
  DeviceScope on_device(device);  // the kernels launch on the model's device, whatever the thread's current one
#if CUDART_VERSION >= 12080
  if (stream != nullptr) {  // a stream belongs to one device: launching on another's fails late and obscurely
    int stream_device = device;
    if (cudaStreamGetDevice(static_cast<cudaStream_t>(stream), &stream_device) == cudaSuccess &&
        stream_device != device) {
      return fail("the stream given is on CUDA device " + std::to_string(stream_device) +
                  "; this model runs on device " + std::to_string(device) + ": pass a stream of that device");
    }
  }
#endif
#else
  const int device = 0;
#endif
  // on the stack: run() never allocates
  int64_t* sizes = static_cast<int64_t*>(__builtin_alloca(sizeof(int64_t) * (spec.num_padded_dims + 1)));
  bool padded = false;
  const int32_t number = matching_variant(model, inputs, num_inputs, &padded, sizes);
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
  if (checked_tensors(caller, inputs, num_inputs, outputs, num_outputs, in, out, device)) return 1;
#if BYOC_RUNTIME_CUDA
  current_status_word = model->status_word;
  struct ClearStatusWord {  // on every return: no other code of this thread reports into it
    ~ClearStatusWord() {
      current_status_word = nullptr;
      current_call = 0;
    }
  } clear_status_word;
  cudaStream_t run_stream = static_cast<cudaStream_t>(stream);
  // a padded run, or CUDA graphs of planned pointers ("copy"), copy the caller's tensors;
  // otherwise the kernels use them in place
  if (!padded && (!v.cuda_graph || v.graph_io_update) &&
      (check_in_place_alignment("input", v.num_inputs, caller.inputs, in, v.input_on_host) ||
       check_in_place_alignment("output", v.num_outputs, caller.outputs, out, v.output_on_host))) {
    return 1;
  }
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
