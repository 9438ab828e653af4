// The program table: a model's calls, their operands, the CUDA graph regions and the
// caller copies, which the build writes as one binary table (byoc.codegen.host:
// program_table) and embeds in the library (program.S), instead of generating C++ for
// them. Decoded and checked once per process, at the first create; run() walks the result.
//
// Layout (little-endian, each record 8-byte aligned):
//   header   "BYOCPRG1", then u32 num_calls, num_refs, num_regions, num_input_copies,
//            num_output_copies, max_args, labels_bytes, 0
//   refs     {u32 space, u32 0, u64 offset}                               x num_refs
//   calls    {i32 function, i32 state, u32 flags (1 copy, 2 on host, 4 sync first),
//             u32 first_arg, u32 num_args, u32 result, u64 bytes, u32 label, u32 0}
//   regions  {u32 first_call, u32 num_calls, u32 capture, u32 0}
//   copies   {i32 tensor, u32 space, u64 offset, u64 bytes}  inputs, then outputs
//   labels   NUL-terminated strings; a call's label is the offset of its own
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
  uint64_t offset;
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
static_assert(sizeof(Header) == 40 && sizeof(RefRecord) == 16 && sizeof(CallRecord) == 40 &&
              sizeof(RegionRecord) == 16 && sizeof(CopyRecord) == 24, "the program table's layout");

struct Decoded {
  std::vector<Ref> refs;
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

Decoded decoded;  // a static object: freed when the library is unloaded
Program program_storage = {};
std::once_flag decode_once;
std::string decode_error;  // empty: the table decoded

// The bytes of one of the model's memories (0 for one it does not have).
uint64_t memory_bytes(uint32_t space) {
  switch (space) {
    case kArena: return spec.arena_bytes;
    case kWeights: return spec.weights_bytes;
    case kHostArena: return spec.devices ? spec.host_arena_bytes : 0;
    case kPinnedArena: return spec.devices ? spec.pinned_arena_bytes : 0;
    case kHostWeights: return spec.devices ? spec.weights_bytes : 0;
    default: return 0;
  }
}

// A Ref from its record, or false when it names no memory the model has, an offset past
// the end of it, or a caller tensor that does not exist.
bool ref_of(uint32_t space, uint64_t offset, Ref* ref) {
  if (space > kHostWeights) return false;
  if (space == kInput && offset >= static_cast<uint64_t>(spec.num_inputs)) return false;
  if (space == kOutput && offset >= static_cast<uint64_t>(spec.num_outputs)) return false;
  if (space != kInput && space != kOutput && offset > memory_bytes(space)) return false;
  *ref = Ref{static_cast<Space>(space), offset};
  return true;
}

// Why the call record cannot run, or nullptr.
const char* call_problem(const CallRecord& c, const Header& h) {
  const bool copy = c.flags & 1u;
  if (c.flags > 7u) return "unknown flags";
  if (static_cast<uint64_t>(c.first_arg) + c.num_args > h.num_refs || c.result >= h.num_refs) return "operand out of range";
  if (c.num_args > h.max_args || c.label >= h.labels_bytes) return "operand count or label out of range";
  if (copy) return c.num_args == 1 && c.function < 0 && c.state < 0 ? nullptr : "a copy with a function";
  if (c.function >= 0) return c.function < spec.num_functions && c.state < 0 ? nullptr : "function out of range";
  return c.state >= 0 && c.state < spec.num_states ? nullptr : "state out of range";
}

std::string decode(const unsigned char* p, uint64_t bytes) {
  Header h;
  if (p == nullptr || bytes < sizeof(h)) return "it is shorter than its header";
  std::memcpy(&h, p, sizeof(h));
  if (std::memcmp(h.magic, "BYOCPRG1", 8) != 0) return "it does not start with BYOCPRG1";
  const uint64_t expected = sizeof(h) + uint64_t{h.num_refs} * sizeof(RefRecord) + uint64_t{h.num_calls} * sizeof(CallRecord) +
                            uint64_t{h.num_regions} * sizeof(RegionRecord) +
                            (uint64_t{h.num_input_copies} + h.num_output_copies) * sizeof(CopyRecord) + h.labels_bytes;
  if (expected != bytes || h.num_calls > (1u << 30)) return "its counts do not match its size";
  if (h.labels_bytes == 0 || p[bytes - 1] != 0) return "its labels do not end with NUL";
  Decoded* d = &decoded;
  const unsigned char* at = p + sizeof(h);
  d->refs.resize(h.num_refs);
  for (Ref& ref : d->refs) {
    const RefRecord r = take<RefRecord>(&at);
    if (!ref_of(r.space, r.offset, &ref)) return "an operand names no memory";
  }
  d->labels.assign(reinterpret_cast<const char*>(p + bytes - h.labels_bytes), h.labels_bytes);
  if (h.max_args > h.num_refs) return "its operand count is out of range";
  uint32_t most_args = 0;
  d->calls.resize(h.num_calls);
  for (Call& call : d->calls) {
    const CallRecord c = take<CallRecord>(&at);
    if (const char* problem = call_problem(c, h)) return std::string("a call: ") + problem;
    if (c.num_args > most_args) most_args = c.num_args;
    call = Call{c.function >= 0 ? spec.functions[c.function] : nullptr,
                c.state >= 0 ? spec.states[c.state].call : nullptr, c.state, (c.flags & 1u) != 0,
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
  if (spec.cuda_graph && h.num_calls && !h.num_regions) return "a CUDA graph model without regions";
  for (uint32_t i = 0; i < h.num_input_copies + h.num_output_copies; ++i) {
    const CopyRecord c = take<CopyRecord>(&at);
    const bool input = i < h.num_input_copies;
    Copy copy{c.tensor, Ref{}, c.bytes};
    if (c.tensor < 0 || c.tensor >= (input ? spec.num_inputs : spec.num_outputs) || !ref_of(c.space, c.offset, &copy.ref) ||
        c.bytes != (input ? spec.inputs : spec.outputs)[c.tensor].bytes) {
      return "a caller copy names no tensor or memory, or not its size";
    }
    (input ? d->input_copies : d->output_copies).push_back(copy);
  }
  program_storage = Program{static_cast<int32_t>(h.num_calls), h.max_args, d->calls.data(), d->refs.data(),
                            static_cast<int32_t>(h.num_regions), d->regions.data(),
                            static_cast<int32_t>(h.num_input_copies), d->input_copies.data(),
                            static_cast<int32_t>(h.num_output_copies), d->output_copies.data()};
  return "";
}

}  // namespace

const Program& program = program_storage;

int load_program() {
  std::call_once(decode_once, [] {
    if (byoc_blob_checksum(spec.program, spec.program_bytes) != spec.program_checksum) {
      decode_error = "it does not match its checksum";
    } else {
      try {
        decode_error = decode(spec.program, spec.program_bytes);
      } catch (const std::bad_alloc&) {
        decode_error = "out of host memory decoding it";
      }
    }
  });
  if (decode_error.empty()) return 0;
  return fail("the library's program table is corrupted (" + decode_error +
              "): the library file was changed after the build; rebuild it");
}

}  // namespace internal
}  // namespace byoc_runtime
