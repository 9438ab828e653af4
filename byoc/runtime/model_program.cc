// The program tables: each variant's calls, their operands, the CUDA graph regions and the
// caller copies, which the build writes as one binary table per variant
// (byoc/codegen/program_table.py) and embeds in the library (program.S), instead of generating C++ for
// them. Decoded and checked once per process, at the first create; run() walks the result.
//
// Layout (little-endian, each record 8-byte aligned):
//   header   "BYOCPRG2", then u32 num_calls, num_refs, num_regions, num_input_copies,
//            num_output_copies, max_args, labels_bytes, 0
//   refs     {u32 space, u32 0, u64 offset, u64 bytes}                    x num_refs
//   calls    {i32 function, i32 state, u32 flags (1 copy, 2 on host, 4 sync first),
//             u32 first_arg, u32 num_args, u32 result, u64 bytes, u32 label, u32 0}
//   regions  {u32 first_call, u32 num_calls, u32 capture, u32 0}
//   copies   {i32 tensor, u32 space, u64 offset, u64 bytes}  inputs, then outputs
//   labels   NUL-terminated strings; a call's label is the offset of its own
//
// The checksum finds a changed file; the decoder does not trust a table that matches it
// either (a table forged with its checksum): every operand must lie inside a memory the
// variant has (or be a caller tensor of its exact size), a call on the host must read and
// write host memory and a call on the device no pageable host memory, a copy must move no
// more than its operands hold.
#include <cstring>
#include <mutex>
#include <new>
#include <string>
#include <vector>

#include "model_runtime_internal.h"

extern "C" uint64_t byoc_blob_checksum(const void* data, size_t bytes);

namespace byoc_runtime {
namespace internal {
namespace {

struct Header {
  char magic[8];
  uint32_t num_calls, num_refs, num_regions, num_input_copies, num_output_copies, max_args, labels_bytes, reserved;
};
struct RefRecord {
  uint32_t space, reserved;
  uint64_t offset, bytes;
};
struct CallRecord {
  int32_t function, state;
  uint32_t flags, first_arg, num_args, result;
  uint64_t bytes;
  uint32_t label, reserved;
};
struct RegionRecord {
  uint32_t first_call, num_calls, capture, reserved;
};
struct CopyRecord {
  int32_t tensor;
  uint32_t space;
  uint64_t offset, bytes;
};
static_assert(sizeof(Header) == 40 && sizeof(RefRecord) == 24 && sizeof(CallRecord) == 40 &&
              sizeof(RegionRecord) == 16 && sizeof(CopyRecord) == 24, "the program table's layout");

struct Decoded {
  std::vector<Ref> refs;
  std::vector<uint64_t> ref_bytes;  // each operand's size (checked, then only the decoder reads it)
  std::vector<Call> calls;
  std::vector<Region> regions;
  std::vector<Copy> input_copies, output_copies;
  std::string labels;
};

// The next record of type T at `*at`, which moves past it (records are read by copy: the
// table's bytes need not be aligned for T).
template <class T>
T take(const unsigned char** at) {
  T record;
  std::memcpy(&record, *at, sizeof(record));
  *at += sizeof(record);
  return record;
}

// Static objects (freed when the library is unloaded), one entry per variant.
std::vector<Decoded> decoded;
std::vector<Program> programs;
std::vector<unsigned int> first_call_number;  // the status word's number of each variant's first call, less 1
std::once_flag decode_once;
std::string decode_error;  // empty: the tables decoded

// The bytes of one of the variant's memories (0 for one it does not have).
uint64_t memory_bytes(const VariantSpec& v, uint32_t space) {
  switch (space) {
    case kArena: return v.arena_bytes;
    case kWeights: return spec.weights_bytes;
    case kHostArena: return v.devices ? v.host_arena_bytes : 0;
    case kPinnedArena: return v.devices ? v.pinned_arena_bytes : 0;
    case kHostWeights: return v.devices ? spec.weights_bytes : 0;
    default: return 0;
  }
}

// Whether the memory is pageable host memory (no GPU kernel may read it).
bool pageable(uint32_t space) { return space == kHostArena || space == kHostWeights; }

// A Ref from its record, or false when it names a memory the variant does not have, bytes
// that run past the end of it, or a caller tensor that does not exist or is not that size.
bool ref_of(const VariantSpec& v, uint32_t space, uint64_t offset, uint64_t bytes, Ref* ref) {
  if (space > kHostWeights) return false;
  if (space == kInput || space == kOutput) {
    const bool input = space == kInput;
    if (offset >= static_cast<uint64_t>(input ? v.num_inputs : v.num_outputs)) return false;
    if (bytes != (input ? v.inputs : v.outputs)[offset].bytes) return false;
  } else {
    if (!v.devices && (space == kHostArena || space == kPinnedArena || space == kHostWeights)) return false;
    const uint64_t size = memory_bytes(v, space);
    if (offset > size || bytes > size - offset) return false;
  }
  *ref = Ref{static_cast<Space>(space), offset};
  return true;
}

// Whether a caller tensor lies in host memory (a cuda model with data on the host).
bool on_host(const VariantSpec& v, const Ref& ref) {
  if (ref.space == kInput) return v.input_on_host != nullptr && v.input_on_host[ref.offset];
  if (ref.space == kOutput) return v.output_on_host != nullptr && v.output_on_host[ref.offset];
  return ref.space == kHostArena || ref.space == kPinnedArena || ref.space == kHostWeights;
}

// Why the call's operands are not where it runs, or nullptr: with data on the host, a call
// on the host reads and writes only host memory, a call on the device no pageable host
// memory; without, no call runs on the host. A copy moves at most what both operands hold.
const char* placement_problem(const VariantSpec& v, const CallRecord& c, const Decoded& d) {
  const bool copy = c.flags & 1u, host_call = c.flags & 2u;
  if ((c.flags & 6u) && !v.devices) return "a host call in a program with no data on the host";
  if (copy) {
    return c.bytes <= d.ref_bytes[c.first_arg] && c.bytes <= d.ref_bytes[c.result] ? nullptr
                                                                                   : "a copy larger than its operands";
  }
  if (!v.devices) return nullptr;
  for (uint32_t i = 0; i <= c.num_args; ++i) {
    const uint32_t index = i < c.num_args ? c.first_arg + i : c.result;
    const Ref& ref = d.refs[index];
    if (host_call ? !on_host(v, ref) : pageable(ref.space)) return "an operand in memory where the call does not run";
  }
  return nullptr;
}

// Why the call record cannot run, or nullptr.
const char* call_problem(const VariantSpec& v, const CallRecord& c, const Header& h) {
  const bool copy = c.flags & 1u;
  if (c.flags > 7u) return "unknown flags";
  if (static_cast<uint64_t>(c.first_arg) + c.num_args > h.num_refs || c.result >= h.num_refs) return "operand out of range";
  if (c.num_args > h.max_args || c.label >= h.labels_bytes) return "operand count or label out of range";
  if (copy) return c.num_args == 1 && c.function < 0 && c.state < 0 ? nullptr : "a copy with a function";
  if (c.function >= 0) return c.function < v.num_functions && c.state < 0 ? nullptr : "function out of range";
  return c.state >= 0 && c.state < v.num_states ? nullptr : "state out of range";
}

std::string decode(const VariantSpec& v, Decoded* d, Program* out) {
  const unsigned char* p = v.program;
  const uint64_t bytes = v.program_bytes;
  Header h;
  if (p == nullptr || bytes < sizeof(h)) return "it is shorter than its header";
  std::memcpy(&h, p, sizeof(h));
  if (std::memcmp(h.magic, "BYOCPRG2", 8) != 0) return "it does not start with BYOCPRG2";
  const uint64_t expected = sizeof(h) + uint64_t{h.num_refs} * sizeof(RefRecord) + uint64_t{h.num_calls} * sizeof(CallRecord) +
                            uint64_t{h.num_regions} * sizeof(RegionRecord) +
                            (uint64_t{h.num_input_copies} + h.num_output_copies) * sizeof(CopyRecord) + h.labels_bytes;
  if (expected != bytes || h.num_calls > (1u << 30)) return "its counts do not match its size";
  if (h.labels_bytes == 0 || p[bytes - 1] != 0) return "its labels do not end with NUL";
  const unsigned char* at = p + sizeof(h);
  d->refs.resize(h.num_refs);
  d->ref_bytes.resize(h.num_refs);
  for (uint32_t i = 0; i < h.num_refs; ++i) {
    const RefRecord r = take<RefRecord>(&at);
    if (!ref_of(v, r.space, r.offset, r.bytes, &d->refs[i])) return "an operand lies outside the memory it names";
    d->ref_bytes[i] = r.bytes;
  }
  d->labels.assign(reinterpret_cast<const char*>(p + bytes - h.labels_bytes), h.labels_bytes);
  if (h.max_args > h.num_refs) return "its operand count is out of range";
  uint32_t most_args = 0;
  d->calls.resize(h.num_calls);
  for (Call& call : d->calls) {
    const CallRecord c = take<CallRecord>(&at);
    if (const char* problem = call_problem(v, c, h)) return std::string("a call: ") + problem;
    if (const char* problem = placement_problem(v, c, *d)) return std::string("a call: ") + problem;
    if (c.num_args > most_args) most_args = c.num_args;
    call = Call{c.function >= 0 ? v.functions[c.function] : nullptr,
                c.state >= 0 ? v.states[c.state].call : nullptr, c.state, (c.flags & 1u) != 0,
                (c.flags & 2u) != 0, (c.flags & 4u) != 0, c.first_arg, c.num_args, c.result, c.bytes,
                d->labels.c_str() + c.label};
  }
  if (most_args != h.max_args) return "its operand count does not match its calls";
  uint64_t covered = 0;
  d->regions.resize(h.num_regions);
  for (Region& region : d->regions) {
    const RegionRecord r = take<RegionRecord>(&at);
    if (r.first_call != covered || r.num_calls == 0) return "the regions do not cover the calls in order";
    covered += r.num_calls;
    region = Region{r.first_call, r.num_calls, r.capture != 0};
  }
  if (h.num_regions && covered != h.num_calls) return "the regions do not cover every call";
  if (v.cuda_graph && h.num_calls && !h.num_regions) return "a CUDA graph model without regions";
  for (uint32_t i = 0; i < h.num_input_copies + h.num_output_copies; ++i) {
    const CopyRecord c = take<CopyRecord>(&at);
    const bool input = i < h.num_input_copies;
    Copy copy{c.tensor, Ref{}, c.bytes};
    if (c.tensor < 0 || c.tensor >= (input ? v.num_inputs : v.num_outputs) ||
        !ref_of(v, c.space, c.offset, c.bytes, &copy.ref) ||
        c.bytes != (input ? v.inputs : v.outputs)[c.tensor].bytes) {
      return "a caller copy names no tensor or memory, or not its size";
    }
    (input ? d->input_copies : d->output_copies).push_back(copy);
  }
  *out = Program{static_cast<int32_t>(h.num_calls), h.max_args, d->calls.data(), d->refs.data(),
                            static_cast<int32_t>(h.num_regions), d->regions.data(),
                            static_cast<int32_t>(h.num_input_copies), d->input_copies.data(),
                            static_cast<int32_t>(h.num_output_copies), d->output_copies.data()};
  return "";
}

}  // namespace

const Program& program_of(int32_t number) { return programs[number]; }

uint64_t largest(uint64_t VariantSpec::*field) {
  uint64_t most = 0;
  for (int32_t v = 0; v < spec.num_variants; ++v) {
    if (spec.variants[v].*field > most) most = spec.variants[v].*field;
  }
  return most;
}

unsigned int call_number(int32_t number, int32_t index) {
  return first_call_number[number] + static_cast<unsigned int>(index) + 1;
}

const char* call_label(unsigned int call) {
  for (int32_t v = spec.num_variants - 1; v >= 0; --v) {
    if (call > first_call_number[v]) {
      const unsigned int index = call - first_call_number[v] - 1;
      return index < static_cast<unsigned int>(programs[v].num_calls) ? programs[v].calls[index].label : "?";
    }
  }
  return "?";
}

int load_programs() {
  std::call_once(decode_once, [] {
    try {
      if (spec.num_variants < 1 || spec.variants == nullptr) {
        decode_error = "it lists no program";
        return;
      }
      decoded.resize(spec.num_variants);
      programs.resize(spec.num_variants);
      first_call_number.assign(spec.num_variants, 0);
      for (int32_t v = 0; v < spec.num_variants && decode_error.empty(); ++v) {
        const VariantSpec& variant = spec.variants[v];
        if (byoc_blob_checksum(variant.program, variant.program_bytes) != variant.program_checksum) {
          decode_error = "it does not match its checksum";
        } else {
          decode_error = decode(variant, &decoded[v], &programs[v]);
        }
        if (v + 1 < spec.num_variants) {
          first_call_number[v + 1] = first_call_number[v] + static_cast<unsigned int>(programs[v].num_calls);
        }
      }
    } catch (const std::bad_alloc&) {
      decode_error = "out of host memory decoding it";
    }
  });
  if (decode_error.empty()) return 0;
  return fail("the library's program table is corrupted (" + decode_error +
              "): the library file was changed after the build; rebuild it");
}

}  // namespace internal
}  // namespace byoc_runtime
