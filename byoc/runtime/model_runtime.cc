// The model runtime: the C ABI of byoc_model.h over the tables a model's host code
// generates (model_runtime.h): errors, the weights loaded and checked, create and destroy
// (model_run.cc: run, the caller's tensors checked, the program's calls walked). Static C++, compiled once per flavor into
// the object cache: BYOC_RUNTIME_CUDA=1 for cuda models, which also link
// model_runtime_cuda.cc (device memory, the status word, CUDA graphs), 0 for cpu models.
#include <fcntl.h>
#include <link.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>

#include "model_runtime_internal.h"

using byoc_runtime::ModelSpec;
using byoc_runtime::VariantSpec;

namespace {
// A fixed buffer, not a std::string: a thread_local with a destructor would pin the library
// in memory (glibc keeps such a library loaded until its threads exit), so a process that
// loads and closes many models would keep every one mapped.
thread_local char last_error[2048] = "";

// The embedded weights (ModelSpec::weights_appended) follow the library's ELF image in its
// file, ended by a trailer (magic, offset, size) and the seal (byoc/runtime/library_file.py:
// seal_library says why they are not linked in). They are mapped read-only when the library
// is loaded, not at create: by then the file may be gone (load() of a second copy of a
// library unlinks it once the loader has it). Plain data, no destructor (see last_error).
struct AppendedWeights {
  const unsigned char* data;
  uint64_t bytes;
  char error[640];
};
AppendedWeights appended_weights = {nullptr, 0, ""};
const unsigned char kNoWeights[1] = {0};  // a model without weights still gets a pointer
// Models not yet destroyed: the library's destructor unmaps the weights only when none is
// left (at process exit a thread may still be running one, as it could read .rodata).
std::atomic<int> live_models{0};

// The file this library was loaded from: the loaded object whose segments hold this code
// (dl_iterate_phdr is libc's on every glibc; dladdr needs libdl before 2.34).
struct LoadedFrom {
  uintptr_t address;
  const char* path;
};

int find_loaded_from(struct dl_phdr_info* info, size_t, void* data) {
  LoadedFrom* self = static_cast<LoadedFrom*>(data);
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& header = info->dlpi_phdr[i];
    const uintptr_t start = info->dlpi_addr + header.p_vaddr;
    if (header.p_type == PT_LOAD && self->address >= start && self->address < start + header.p_memsz) {
      self->path = info->dlpi_name;
      return 1;
    }
  }
  return 0;
}

constexpr uint64_t kSealBytes = 8 + 32;      // "BYOCSEAL", SHA-256
constexpr uint64_t kTrailerBytes = 8 + 16;   // "BYOCWTS1", offset, size (little-endian)

uint64_t little_endian_u64(const unsigned char* bytes) {
  uint64_t value = 0;
  for (int i = 7; i >= 0; --i) value = (value << 8) | bytes[i];
  return value;
}

void appended_weights_fail(const char* path, const std::string& why) {
  std::snprintf(appended_weights.error, sizeof(appended_weights.error),
                "cannot map the weights embedded in %s: %s", path, why.c_str());
}

__attribute__((constructor)) void map_appended_weights() {
  const ModelSpec& model = byoc_model_spec;
  if (!model.weights_appended || model.weights_bytes == 0) return;
  LoadedFrom self = {reinterpret_cast<uintptr_t>(&map_appended_weights), nullptr};
  dl_iterate_phdr(find_loaded_from, &self);
  if (self.path == nullptr || self.path[0] == '\0') {
    appended_weights_fail("the library", "the dynamic loader does not say which file it was loaded from");
    return;
  }
  const char* path = self.path;
  const int descriptor = open(path, O_RDONLY | O_CLOEXEC);
  if (descriptor < 0) {
    appended_weights_fail(path, std::strerror(errno));
    return;
  }
  struct stat file_info;
  unsigned char tail[kTrailerBytes + kSealBytes];
  const bool readable = fstat(descriptor, &file_info) == 0 &&
                        static_cast<uint64_t>(file_info.st_size) >= sizeof(tail) &&
                        pread(descriptor, tail, sizeof(tail), file_info.st_size - sizeof(tail)) ==
                            static_cast<ssize_t>(sizeof(tail));
  if (!readable || std::memcmp(tail, "BYOCWTS1", 8) != 0 || std::memcmp(tail + kTrailerBytes, "BYOCSEAL", 8) != 0) {
    close(descriptor);
    appended_weights_fail(path, "the file does not end in byoc's weights trailer and seal: it was changed after the "
                          "build (strip, patchelf, a copy cut short); rebuild it");
    return;
  }
  const uint64_t offset = little_endian_u64(tail + 8), bytes = little_endian_u64(tail + 16);
  const long page = sysconf(_SC_PAGESIZE);
  if (bytes != model.weights_bytes || page <= 0 || offset % static_cast<uint64_t>(page) != 0 ||
      offset + bytes + sizeof(tail) != static_cast<uint64_t>(file_info.st_size)) {
    close(descriptor);
    appended_weights_fail(path, "its weights trailer (" + std::to_string(bytes) + " bytes at offset " +
                          std::to_string(offset) + ") does not match the library's " +
                          std::to_string(model.weights_bytes) + " bytes of weights; the file is corrupted: rebuild it");
    return;
  }
  void* mapped = mmap(nullptr, bytes, PROT_READ, MAP_PRIVATE, descriptor, static_cast<off_t>(offset));
  const int mapping_error = errno;
  close(descriptor);  // the mapping keeps the file's pages
  if (mapped == MAP_FAILED) {
    appended_weights_fail(path, std::string("mmap: ") + std::strerror(mapping_error));
    return;
  }
  appended_weights.data = static_cast<const unsigned char*>(mapped);
  appended_weights.bytes = bytes;
}

__attribute__((destructor)) void unmap_appended_weights() {
  if (appended_weights.data != nullptr && live_models.load() == 0) {
    munmap(const_cast<unsigned char*>(appended_weights.data), appended_weights.bytes);
    appended_weights.data = nullptr;
  }
}
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

// Reads a weights file (the .safetensors sidecar, or one `byoc refit` wrote): one uint8
// tensor "byoc_weights" whose __metadata__ carries the program id this library expects
// (its code without the weights: another build of the same program, or a refit, has it
// too) and the checksum of the bytes that follow, which the caller checks.
int read_sidecar(const char* path, unsigned char** host_out, uint64_t* checksum_out) {
  // Opened without blocking and checked to be a regular file: a FIFO would block here.
  const int descriptor = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (descriptor < 0) return fail(std::string("cannot open weights file '") + path + "': " + std::strerror(errno));
  struct stat info;
  if (fstat(descriptor, &info) != 0 || !S_ISREG(info.st_mode)) {
    close(descriptor);
    return fail(std::string("weights file '") + path + "' is not a regular file; expected a byoc .safetensors "
                "weights file");
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
    return fail(std::string("weights file '") + path + "' is not a byoc .safetensors weights file");
  }
  if (header.find(std::string("\"program_id\":\"") + spec.program_id + "\"") == std::string::npos) {
    std::fclose(file);
    return fail(std::string("weights file '") + path + "' belongs to another program (expected program id " +
                spec.program_id + ": weights written by this library's build or by `byoc refit` of it)");
  }
  // "checksum":"<decimal digits>", as byoc.codegen.host.write_safetensors writes it
  const std::string key = "\"checksum\":\"";
  const size_t at = header.find(key);
  uint64_t checksum = 0;
  size_t digits = 0;
  bool overflow = false;
  for (size_t i = at == std::string::npos ? header.size() : at + key.size();
       i < header.size() && header[i] >= '0' && header[i] <= '9' && digits < 21; ++i, ++digits) {
    const uint64_t digit = static_cast<uint64_t>(header[i] - '0');
    overflow = overflow || checksum > (UINT64_MAX - digit) / 10;
    checksum = checksum * 10 + digit;
  }
  if (digits == 0 || overflow || at + key.size() + digits >= header.size() || header[at + key.size() + digits] != '"') {
    std::fclose(file);
    return fail(std::string("weights file '") + path + "' has no checksum in its header; expected a byoc "
                ".safetensors weights file");
  }
  *checksum_out = checksum;
  // exactly the header and the weights: a file cut short or with more after them is not one
  // this library's build or refit wrote
  if (static_cast<uint64_t>(info.st_size) != 8 + header_bytes + spec.weights_bytes) {
    std::fclose(file);
    return fail(std::string("weights file '") + path + "' holds " + std::to_string(info.st_size - 8 - header_bytes) +
                " bytes of weights; this library's are " + std::to_string(spec.weights_bytes) + " (the file is " +
                (static_cast<uint64_t>(info.st_size) < 8 + header_bytes + spec.weights_bytes ? "truncated)" :
                 "longer than a weights file of this program)"));
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

BYOC_EXPORT int byoc_model_arch(const byoc_model* model) {
#if BYOC_RUNTIME_CUDA
  if (model == nullptr) return 0;
  return model->arch != 0 ? model->arch : spec.arch_number;
#else
  (void)model;
  return 0;
#endif
}

BYOC_EXPORT void byoc_model_destroy(byoc_model* model) {
  if (model == nullptr) return;
#if BYOC_RUNTIME_CUDA
  DeviceScope on_device(model->device);  // its memory, graphs and engines are that device's
  // Work still queued may read the memory and engines freed below (a module replaced by
  // load_weights right after a run): let it finish.
  cudaDeviceSynchronize();
#endif
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
  live_models.fetch_sub(1);
}

namespace {

// The weights in host memory (inside the library, or read from a weights file into
// `*sidecar`, which the caller frees), checked against their checksum. A weights file
// given for a library that embeds its weights replaces them (new weights of the same
// program, from `byoc refit`).
int host_weights_of(const char* weights_path, const unsigned char** host_weights, unsigned char** sidecar) {
  *sidecar = nullptr;
  uint64_t expected = spec.weights_checksum;
  if (weights_path != nullptr) {
    if (read_sidecar(weights_path, sidecar, &expected)) return 1;
    *host_weights = *sidecar;
  } else if (spec.weights_appended) {
    if (spec.weights_bytes == 0) {
      *host_weights = kNoWeights;
    } else if (appended_weights.data == nullptr) {
      return fail(appended_weights.error[0] ? appended_weights.error : "the library's embedded weights are not mapped");
    } else {
      *host_weights = appended_weights.data;
    }
  } else {
    return fail("this model keeps its weights in a .safetensors sidecar; pass its path");
  }
  if (byoc_blob_checksum(*host_weights, spec.weights_bytes) != expected) {
    std::free(*sidecar);
    *sidecar = nullptr;
    if (weights_path == nullptr) {
      return fail("the weights embedded in the library do not match their checksum: the library file is corrupted "
                  "or was changed after the build; rebuild it");
    }
    return fail(std::string("the weights in '") + weights_path + "' do not match their checksum: the file is "
                "corrupted or was changed after it was written; write it again (rebuild, or `byoc refit`)");
  }
  return 0;
}

}  // namespace

BYOC_EXPORT int byoc_model_create_on_device(byoc_model** out, const char* weights_path, int32_t device) {
  if (out == nullptr) return fail("byoc_model_create: the output pointer is NULL");
  *out = nullptr;
  if (load_programs()) return 1;
#if BYOC_RUNTIME_CUDA
  int model_device = 0;
  int32_t model_arch = 0;
  if (check_device(device, &model_device, &model_arch)) return 1;
  DeviceScope on_device(model_device);  // memory, streams and the engines' state on that device
#else
  if (device != -1 && device != 0) {
    return fail("device " + std::to_string(device) + ": this model runs on the cpu; expected -1 or 0");
  }
#endif
  byoc_model* model = new (std::nothrow) byoc_model();
  if (model == nullptr) return fail("out of host memory");
  live_models.fetch_add(1);
#if BYOC_RUNTIME_CUDA
  model->device = model_device;
  model->arch = model_arch;
#endif
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
    if (!runs_variant(model, v)) continue;  // another arch's: its engines never set up
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

BYOC_EXPORT int byoc_model_create(byoc_model** out, const char* weights_path) {
  return byoc_model_create_on_device(out, weights_path, -1);
}
