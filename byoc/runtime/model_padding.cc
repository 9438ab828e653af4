// Shape buckets with padded dims (model_runtime.h: TensorSpec::padded): the variant a run
// takes when the caller's shapes are no variant's own, the staging buffers such a run reads
// and writes in place of the caller's tensors, and the copies between the two. A padded
// input is copied into its buffer with zeros after it (a zero is a valid value for every
// input: an index in range, a mask); each output's valid box is copied back. The padding
// analysis (analysis/padding.py) proved that no op mixes the padded rows into the others.
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>

#include "model_runtime_internal.h"

using byoc_runtime::Copy;
using byoc_runtime::TensorSpec;
using byoc_runtime::VariantSpec;

namespace byoc_runtime {
namespace internal {

namespace {

constexpr int32_t kMaxPaddedDims = 8;

uint64_t aligned(uint64_t bytes) { return (bytes + 255) / 256 * 256; }

// Whether any variant pads caller tensor `index` (inputs, then outputs), and its most bytes.
bool padded_anywhere(int32_t index, uint64_t* most_bytes) {
  bool padded = false;
  *most_bytes = 0;
  for (int32_t v = 0; v < spec.num_variants; ++v) {
    const VariantSpec& variant = spec.variants[v];
    const TensorSpec& tensor =
        index < variant.num_inputs ? variant.inputs[index] : variant.outputs[index - variant.num_inputs];
    for (int32_t a = 0; a < tensor.ndim && a < 8; ++a) padded = padded || tensor.padded[a] != 0;
    if (tensor.bytes > *most_bytes) *most_bytes = tensor.bytes;
  }
  return padded;
}

bool on_host(const VariantSpec& variant, int32_t index) {
  return index < variant.num_inputs ? variant.input_on_host && variant.input_on_host[index]
                                    : variant.output_on_host && variant.output_on_host[index - variant.num_inputs];
}

// The padded dims' sizes the caller's inputs imply for `variant` (into `sizes`), or false
// where they do not fit it: every fixed axis as declared, every padded axis a multiple of
// its factor and at most the variant's extent, every axis of one dim saying the same size.
bool fits(const VariantSpec& variant, const byoc_dl_tensor* inputs, int64_t* sizes) {
  bool seen[kMaxPaddedDims] = {};
  for (int32_t d = 0; d < spec.num_padded_dims; ++d) sizes[d] = variant.padded_dim_values[d];
  for (int32_t i = 0; i < variant.num_inputs; ++i) {
    const TensorSpec& tensor = variant.inputs[i];
    const byoc_dl_tensor& given = inputs[i];
    if (given.ndim != tensor.ndim || (tensor.ndim > 0 && given.shape == nullptr)) return false;
    for (int32_t a = 0; a < tensor.ndim; ++a) {
      const int64_t extent = given.shape[a];
      if (tensor.padded[a] == 0) {
        if (extent != tensor.shape[a]) return false;
        continue;
      }
      const int32_t d = tensor.padded[a] - 1;
      if (d >= spec.num_padded_dims || variant.padded_dim_values[d] < 1) return false;
      const int64_t factor = tensor.shape[a] / variant.padded_dim_values[d];
      if (factor < 1 || extent < 1 || extent % factor != 0 || extent > tensor.shape[a]) return false;
      if (seen[d] && sizes[d] != extent / factor) return false;
      sizes[d] = extent / factor;
      seen[d] = true;
    }
  }
  return true;
}

// One 2-D copy: `height` rows of `width` bytes, `source_pitch` and `destination_pitch`
// apart, in stream order on the device or at once in host memory.
int copy_rows(unsigned char* destination, uint64_t destination_pitch, const unsigned char* source,
              uint64_t source_pitch, uint64_t width, uint64_t height, bool host, void* stream, const char* what) {
#if BYOC_RUNTIME_CUDA
  if (!host && height == 1) {
    return cuda_failed(cudaMemcpyAsync(destination, source, width, cudaMemcpyDefault, static_cast<cudaStream_t>(stream)),
                       what);
  }
  if (!host) {
    return cuda_failed(cudaMemcpy2DAsync(destination, destination_pitch, source, source_pitch, width, height,
                                         cudaMemcpyDefault, static_cast<cudaStream_t>(stream)),
                       what);
  }
#endif
  (void)stream;
  (void)what;
  (void)host;
  for (uint64_t row = 0; row < height; ++row) {
    std::memcpy(destination + row * destination_pitch, source + row * source_pitch, width);
  }
  return 0;
}

// Copies the box two row-major shapes share (each axis the shorter extent) from `source`
// (shape `from`) to `destination` (shape `to`), from axis `axis` on: one 2-D copy over the
// axes up to the last one whose extents differ, or one per index of an outer axis where
// another axis differs before it.
int copy_box(unsigned char* destination, const int64_t* to, const unsigned char* source, const int64_t* from,
             int32_t ndim, int32_t axis, uint64_t element, bool host, void* stream, const char* what) {
  int32_t last = axis - 1;  // the innermost axis whose extents differ
  for (int32_t a = axis; a < ndim; ++a) last = to[a] != from[a] ? a : last;
  uint64_t inner = element;  // the bytes of one index of `last` (the axes after it agree)
  for (int32_t a = last + 1; a < ndim; ++a) inner *= static_cast<uint64_t>(to[a]);
  if (last < axis) return copy_rows(destination, inner, source, inner, inner, 1, host, stream, what);
  int32_t first = -1;  // an outer axis that differs too
  for (int32_t a = axis; a < last && first < 0; ++a) first = to[a] != from[a] ? a : -1;
  if (first < 0) {
    uint64_t height = 1;
    for (int32_t a = axis; a < last; ++a) height *= static_cast<uint64_t>(to[a]);
    const uint64_t width = static_cast<uint64_t>(to[last] < from[last] ? to[last] : from[last]) * inner;
    return copy_rows(destination, static_cast<uint64_t>(to[last]) * inner, source,
                     static_cast<uint64_t>(from[last]) * inner, width, height, host, stream, what);
  }
  // `first` and `last` differ, the axes between agree and nothing is outside `first` (a
  // [b, s] box of a [B, S] buffer): the rows are evenly spaced, one 2-D copy
  uint64_t outside = 1;
  bool between_agree = true;
  for (int32_t a = axis; a < first; ++a) outside *= static_cast<uint64_t>(to[a]);
  for (int32_t a = first + 1; a < last; ++a) between_agree = between_agree && to[a] == from[a];
  if (outside == 1 && between_agree) {
    uint64_t height = static_cast<uint64_t>(to[first] < from[first] ? to[first] : from[first]);
    for (int32_t a = first + 1; a < last; ++a) height *= static_cast<uint64_t>(to[a]);
    const uint64_t width = static_cast<uint64_t>(to[last] < from[last] ? to[last] : from[last]) * inner;
    return copy_rows(destination, static_cast<uint64_t>(to[last]) * inner, source,
                     static_cast<uint64_t>(from[last]) * inner, width, height, host, stream, what);
  }
  // every index of the axes before `first` (they agree), and of `first` the shared ones
  uint64_t to_step = element, from_step = element;
  for (int32_t a = first + 1; a < ndim; ++a) {
    to_step *= static_cast<uint64_t>(to[a]);
    from_step *= static_cast<uint64_t>(from[a]);
  }
  uint64_t outer = 1;
  for (int32_t a = axis; a < first; ++a) outer *= static_cast<uint64_t>(to[a]);
  const int64_t shared = to[first] < from[first] ? to[first] : from[first];
  for (uint64_t o = 0; o < outer; ++o) {
    for (int64_t index = 0; index < shared; ++index) {
      const uint64_t to_offset = (o * static_cast<uint64_t>(to[first]) + static_cast<uint64_t>(index)) * to_step;
      const uint64_t from_offset =
          (o * static_cast<uint64_t>(from[first]) + static_cast<uint64_t>(index)) * from_step;
      if (copy_box(destination + to_offset, to, source + from_offset, from, ndim, first + 1, element, host, stream,
                   what)) {
        return 1;
      }
    }
  }
  return 0;
}

// Zeros `bytes` of a staging buffer from `offset`, in stream order on the device.
int zero_bytes(unsigned char* buffer, uint64_t offset, uint64_t bytes, bool host, void* stream) {
  if (bytes == 0) return 0;
#if BYOC_RUNTIME_CUDA
  if (!host) {
    return cuda_failed(cudaMemsetAsync(buffer + offset, 0, bytes, static_cast<cudaStream_t>(stream)),
                       "zeroing a padded input");
  }
#endif
  (void)stream;
  (void)host;
  std::memset(buffer + offset, 0, bytes);
  return 0;
}

uint64_t shape_bytes(const int64_t* shape, int32_t ndim, uint64_t element) {
  uint64_t bytes = element;
  for (int32_t a = 0; a < ndim; ++a) bytes *= static_cast<uint64_t>(shape[a]);
  return bytes;
}

uint64_t element_bytes(const TensorSpec& tensor) { return (tensor.bits + 7u) / 8u; }

}  // namespace

int allocate_staging(byoc_model* model) {
  if (spec.num_padded_dims == 0) return 0;
  const VariantSpec& first = spec.variants[0];
  const int32_t count = first.num_inputs + first.num_outputs;
  model->staging = new (std::nothrow) unsigned char*[count + 1]();
  if (model->staging == nullptr) return fail("out of host memory");
  uint64_t device_bytes = 0, host_bytes = 0, most = 0;
  for (int32_t i = 0; i < count; ++i) {
    if (padded_anywhere(i, &most)) (on_host(first, i) ? host_bytes : device_bytes) += aligned(most);
  }
  if (device_alloc(&model->staging_memory, device_bytes, "allocating the buffers padded inputs and outputs run in")) {
    return 1;
  }
  if (host_bytes != 0) {
    model->host_staging_memory = static_cast<unsigned char*>(std::aligned_alloc(256, host_bytes));
    if (model->host_staging_memory == nullptr) return fail("out of host memory for the padded inputs and outputs");
  }
  uint64_t device_offset = 0, host_offset = 0;
  for (int32_t i = 0; i < count; ++i) {
    if (!padded_anywhere(i, &most)) continue;
    uint64_t& offset = on_host(first, i) ? host_offset : device_offset;
    model->staging[i] = (on_host(first, i) ? model->host_staging_memory : model->staging_memory) + offset;
    offset += aligned(most);
  }
  return 0;
}

void free_staging(byoc_model* model) {
  delete[] model->staging;
  device_free(model->staging_memory);
  std::free(model->host_staging_memory);
}

int32_t padded_variant(const byoc_model* model, const byoc_dl_tensor* inputs, int32_t num_inputs, int64_t* sizes) {
  if (spec.num_padded_dims == 0 || spec.num_padded_dims > kMaxPaddedDims || (num_inputs && inputs == nullptr)) {
    return -1;
  }
  int32_t best = -1;
  uint64_t best_bytes = 0;
  int64_t trial[kMaxPaddedDims];
  for (int32_t v = 0; v < spec.num_variants; ++v) {
    const VariantSpec& variant = spec.variants[v];
    if (!runs_variant(model, v) || variant.num_inputs != num_inputs || !fits(variant, inputs, trial)) continue;
    uint64_t bytes = 0;  // the smallest bucket that holds the inputs: least to pad
    for (int32_t i = 0; i < num_inputs; ++i) bytes += variant.inputs[i].bytes;
    if (best < 0 || bytes < best_bytes) {
      best = v;
      best_bytes = bytes;
      std::memcpy(sizes, trial, sizeof(int64_t) * spec.num_padded_dims);
    }
  }
  return best;
}

std::string padded_dims_text() {
  std::string text;
  for (int32_t d = 0; d < spec.num_padded_dims; ++d) {
    int64_t most = 0;
    for (int32_t v = 0; v < spec.num_variants; ++v) {
      if (spec.variants[v].padded_dim_values[d] > most) most = spec.variants[v].padded_dim_values[d];
    }
    text += std::string(d ? ", " : "") + spec.padded_dims[d] + " from 1 to " + std::to_string(most);
  }
  return text;
}

void caller_view(const TensorSpec& tensor, const int64_t* values, const int64_t* sizes, TensorSpec* view) {
  *view = tensor;
  for (int32_t a = 0; a < tensor.ndim; ++a) {
    if (tensor.padded[a] != 0) {
      const int32_t d = tensor.padded[a] - 1;
      view->shape[a] = tensor.shape[a] / values[d] * sizes[d];
    }
  }
  view->bytes = shape_bytes(view->shape, view->ndim, element_bytes(tensor));
}

int stage_inputs(byoc_model* model, const Variant& run, const VariantSpec& caller, void** in, void** out,
                 void** caller_out, void* stream) {
  const VariantSpec& variant = run.spec;
  // CUDA graphs in "copy" mode copy each input into planned storage before the graphs and
  // each output out of it after: a padded tensor is copied there (and from there) directly,
  // and that copy of run() finds nothing left to do.
  const bool copy_mode = variant.cuda_graph && !variant.graph_io_update;
  bool synchronized = false;
  for (int32_t i = 0; i < variant.num_inputs; ++i) {
    const TensorSpec& tensor = variant.inputs[i];
    if (caller.inputs[i].bytes == tensor.bytes) continue;  // not padded
    const bool host = on_host(variant, i);
#if BYOC_RUNTIME_CUDA
    // a host buffer is written at once: the runs queued before must be done reading it
    if (host && !synchronized &&
        cuda_failed(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)), "waiting for the earlier runs")) {
      return 1;
    }
#endif
    synchronized = synchronized || host;
    unsigned char* staging = model->staging[i];
    for (int32_t c = 0; copy_mode && !host && c < run.program.num_input_copies; ++c) {
      const Copy& copy = run.program.input_copies[c];
      if (copy.tensor == i && copy.bytes == tensor.bytes) {
        staging = static_cast<unsigned char*>(resolve(model, copy.ref, in, out));
      }
    }
    // zeros after the caller's rows: only the tail when the box is a prefix of the buffer
    // (every axis before the last padded one of extent 1, as a batch axis), else all first
    int32_t last = -1;
    uint64_t outer = 1;
    for (int32_t a = 0; a < tensor.ndim; ++a) last = tensor.shape[a] != caller.inputs[i].shape[a] ? a : last;
    for (int32_t a = 0; a < last; ++a) outer *= static_cast<uint64_t>(tensor.shape[a]);
    const uint64_t prefix = outer == 1 ? caller.inputs[i].bytes : 0;
    if (zero_bytes(staging, prefix, tensor.bytes - prefix, host, stream) ||
        copy_box(staging, tensor.shape, static_cast<const unsigned char*>(in[i]), caller.inputs[i].shape,
                 tensor.ndim, 0, element_bytes(tensor), host, stream, "padding an input")) {
      return 1;
    }
    in[i] = staging;
  }
  for (int32_t o = 0; o < variant.num_outputs; ++o) {
    caller_out[o] = out[o];
    if (caller.outputs[o].bytes == variant.outputs[o].bytes) continue;  // not padded
    void* staging = model->staging[variant.num_inputs + o];
    for (int32_t c = 0; copy_mode && !on_host(variant, variant.num_inputs + o) && c < run.program.num_output_copies;
         ++c) {
      const Copy& copy = run.program.output_copies[c];
      if (copy.tensor == o && copy.bytes == variant.outputs[o].bytes) staging = resolve(model, copy.ref, in, out);
    }
    out[o] = staging;
  }
  return 0;
}

int unstage_outputs(const VariantSpec& variant, const VariantSpec& caller, void* const* out,
                    void* const* caller_out, void* stream) {
  bool host_output = false;
  for (int32_t o = 0; o < variant.num_outputs; ++o) {
    if (out[o] == caller_out[o]) continue;
    const bool host = on_host(variant, variant.num_inputs + o);
#if BYOC_RUNTIME_CUDA
    // the run's work that writes a host output is done before it is read at once
    if (host && !host_output &&
        cuda_failed(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)), "waiting for the outputs")) {
      return 1;
    }
#endif
    host_output = host_output || host;
    const TensorSpec& tensor = variant.outputs[o];
    if (copy_box(static_cast<unsigned char*>(caller_out[o]), caller.outputs[o].shape,
                 static_cast<const unsigned char*>(out[o]), tensor.shape, tensor.ndim, 0, element_bytes(tensor), host,
                 stream, "cutting a padded output")) {
      return 1;
    }
  }
  return 0;
}

}  // namespace internal
}  // namespace byoc_runtime
