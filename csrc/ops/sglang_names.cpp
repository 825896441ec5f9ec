// SGLang's operator names: the attention operators registered a second time
// in the ``sgl_kernel`` namespace, with SGLang main's schemas (argument
// names, types and order, its ``v_cahce`` spelling included), so that
// SGLang's CPU backend calls these kernels unchanged. Registered on request
// only (``import rvv_attn.sglang`` calls rvv_attn::register_sglang_names), so
// that loading rvv_attn next to a real sgl-kernel build changes nothing;
// register_absent_sglang_names serves only the names such a build lacks.
//
// The entry points are rvv_attn's own (ops/entry_points.h), under these names:
// a call through torch.ops.sgl_kernel reaches the same validation and
// kernels as torch.ops.rvv_attn, with no Python in between.
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "ops/attention_options.h"
#include "ops/entry_points.h"

namespace rvv_attn {
namespace {

constexpr char kDecode[] = "sgl_kernel.decode_attention_cpu";
constexpr char kDecodeScales[] = "sgl_kernel.decode_attention_cpu.kv_scales";
constexpr char kExtendScales[] = "sgl_kernel.extend_attention_cpu.kv_scales";
constexpr char kExtend[] = "sgl_kernel.extend_attention_cpu";
constexpr char kDecodeInt8[] = "sgl_kernel.decode_attention_int8_cpu";
constexpr char kExtendInt8[] = "sgl_kernel.extend_attention_int8_cpu";
constexpr char kVarlen[] = "sgl_kernel.flash_attn_varlen_func";
constexpr char kStoreCache[] = "sgl_kernel.store_cache_cpu";

// SGLang main's schemas, and SGLang 0.5.23's as the overloads ``kv_scales``
// of the same names; the alias annotations also mark the caches and
// attn_logits, which SGLang's kernels write without declaring it. ``impl``
// adds the CPU kernel of the name to an IMPL library of sgl_kernel.
//
// Both forms of decode and extend coexist: a call through
// torch.ops.sgl_kernel.decode_attention_cpu(...) picks the overload whose
// schema its arguments fit, and the two differ in the fourth argument (a
// float key_scale in 0.5.23, the output Tensor before). The overloads
// belong with their name: where another library owns a name, rvv_attn adds
// no overload to it.
struct Entry {
  const char* name;
  const char* overload;  // "" for the default
  const char* schema;
  void (*impl)(torch::Library& m);
  std::string qualified() const { return overload[0] == '\0' ? name : std::string(name) + "." + overload; }
};
const Entry kEntries[] = {
    {"decode_attention_cpu", "",
     "decode_attention_cpu(Tensor query, Tensor(a!) k_cache, Tensor(b!) v_cahce, Tensor(c!) output, Tensor? key, "
     "Tensor? value, Tensor loc, Tensor(d!) attn_logits, Tensor req_to_token, Tensor req_pool_indices, "
     "Tensor seq_lens, float sm_scale, float logit_cap, " RVV_ATTN_OPTION_ARGS ") -> ()",
     [](torch::Library& m) { m.impl("decode_attention_cpu", &entry::decode_attention_cpu<kDecode>); }},
    {"decode_attention_cpu", "kv_scales",
     "decode_attention_cpu.kv_scales(Tensor query, Tensor(a!) k_cache, Tensor(b!) v_cache, float key_scale, "
     "float value_scale, Tensor(c!) output, Tensor? key, Tensor? value, Tensor loc, Tensor(d!) attn_logits, "
     "Tensor req_to_token, Tensor req_pool_indices, Tensor seq_lens, float sm_scale, float "
     "logit_cap, " RVV_ATTN_OPTION_ARGS ") -> ()",
     [](torch::Library& m) {
       m.impl("decode_attention_cpu.kv_scales", &entry::decode_attention_cpu_kv_scales<kDecodeScales>);
     }},
    {"extend_attention_cpu", "",
     "extend_attention_cpu(Tensor q_extend, Tensor? k_extend, Tensor? v_extend, Tensor(a!) o_extend, "
     "Tensor k_buffer, Tensor v_buffer, Tensor req_to_token, Tensor req_pool_indices, Tensor seq_lens, "
     "Tensor extend_seq_lens, Tensor extend_start_loc, int max_len_extend, float sm_scale, float "
     "logit_cap, " RVV_ATTN_EXTEND_OPTION_ARGS ") -> ()",
     [](torch::Library& m) { m.impl("extend_attention_cpu", &entry::extend_attention_cpu<kExtend>); }},
    {"extend_attention_cpu", "kv_scales",
     "extend_attention_cpu.kv_scales(Tensor q_extend, Tensor? k_extend, Tensor? v_extend, Tensor(a!) o_extend, "
     "Tensor k_buffer, Tensor v_buffer, float key_scale, float value_scale, Tensor req_to_token, "
     "Tensor req_pool_indices, Tensor seq_lens, Tensor extend_seq_lens, Tensor extend_start_loc, "
     "int max_len_extend, float sm_scale, float logit_cap, " RVV_ATTN_EXTEND_OPTION_ARGS ") -> ()",
     [](torch::Library& m) {
       m.impl("extend_attention_cpu.kv_scales", &entry::extend_attention_cpu_kv_scales<kExtendScales>);
     }},
    {"flash_attn_varlen_func", "",
     "flash_attn_varlen_func(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_k, "
     "int max_seqlen_q, int max_seqlen_k, bool causal) -> Tensor",
     [](torch::Library& m) { m.impl("flash_attn_varlen_func", &entry::flash_attn_varlen_func<kVarlen>); }},
    {"store_cache_cpu", "",
     "store_cache_cpu(Tensor k, Tensor v, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor indices, int? row_dim) "
     "-> ()",
     [](torch::Library& m) { m.impl("store_cache_cpu", &entry::store_cache_cpu<kStoreCache>); }},
    // The RVV int8 port's names: the float schemas plus the cache's scales.
    {"decode_attention_int8_cpu", "",
     "decode_attention_int8_cpu(Tensor query, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor(c!) output, "
     "Tensor? key, Tensor? value, Tensor loc, Tensor(d!) attn_logits, Tensor req_to_token, "
     "Tensor req_pool_indices, Tensor seq_lens, float sm_scale, float logit_cap, Tensor(e!) k_scale_buf, "
     "Tensor(f!) v_scale_buf, float k_scale, float v_scale, " RVV_ATTN_OPTION_ARGS ") -> ()",
     [](torch::Library& m) { m.impl("decode_attention_int8_cpu", &entry::decode_attention_int8_cpu<kDecodeInt8>); }},
    {"extend_attention_int8_cpu", "",
     "extend_attention_int8_cpu(Tensor q_extend, Tensor? k_extend, Tensor? v_extend, Tensor(a!) o_extend, "
     "Tensor(b!) k_buffer, Tensor(c!) v_buffer, Tensor req_to_token, Tensor req_pool_indices, Tensor seq_lens, "
     "Tensor extend_seq_lens, Tensor extend_start_loc, int max_len_extend, float sm_scale, float logit_cap, "
     "Tensor(e!) k_scale_buf, Tensor(f!) v_scale_buf, float k_scale, float v_scale, " RVV_ATTN_EXTEND_OPTION_ARGS
     ") -> ()",
     [](torch::Library& m) { m.impl("extend_attention_int8_cpu", &entry::extend_attention_int8_cpu<kExtendInt8>); }},
};

// What this process has registered in sgl_kernel. The libraries live for the
// process: destroying one would unregister its names under SGLang's feet.
struct Registry {
  std::mutex mutex;
  std::vector<std::unique_ptr<torch::Library>> libraries;
  std::set<std::string> ours;  // names of kEntries registered by rvv_attn
};

Registry& registry() {
  static Registry r;
  return r;
}

// The schema of sgl_kernel::<name> (the default overload: whoever defines it
// owns the name and its overloads) if any library defines it, else nullopt.
std::optional<std::string> defined_elsewhere(const Entry& e) {
  const auto existing = c10::Dispatcher::singleton().findSchema({std::string("sgl_kernel::") + e.name, ""});
  if (!existing.has_value()) return std::nullopt;
  return existing->schema().name();
}

// Defines and implements ``entries`` in sgl_kernel (the caller holds the lock
// and has checked that none is defined yet).
void register_entries(Registry& r, const std::vector<const Entry*>& entries) {
  if (entries.empty()) return;
  auto defs =
      std::make_unique<torch::Library>(torch::Library::FRAGMENT, "sgl_kernel", std::nullopt, __FILE__, __LINE__);
  for (const Entry* e : entries) defs->def(e->schema);
  auto impls =
      std::make_unique<torch::Library>(torch::Library::IMPL, "sgl_kernel", c10::DispatchKey::CPU, __FILE__, __LINE__);
  for (const Entry* e : entries) e->impl(*impls);
  r.libraries.push_back(std::move(defs));
  r.libraries.push_back(std::move(impls));
  for (const Entry* e : entries) r.ours.insert(e->qualified());
}

}  // namespace

// Registers every name of kEntries in sgl_kernel, once; returns the names.
// If sgl_kernel defines any of them already (another library registered it),
// raises naming it and registers nothing.
std::vector<std::string> register_sglang_names() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  std::vector<std::string> names;
  std::vector<const Entry*> missing;
  for (const Entry& e : kEntries) {
    names.emplace_back(e.qualified());
    if (r.ours.count(e.qualified()) != 0) continue;
    const std::optional<std::string> existing = defined_elsewhere(e);
    TORCH_CHECK(!existing.has_value(), "rvv_attn.sglang: torch.ops.sgl_kernel.", e.name, " is already defined (",
                existing.value_or(""),
                ", by another library, e.g. a real sgl-kernel build); rvv_attn registered none of its SGLang names. "
                "Use one kernel library per process, or register_absent_sglang_names() to serve only the names "
                "the other library lacks");
    missing.push_back(&e);
  }
  register_entries(r, missing);
  return names;
}

// Beside another library that owns some sgl_kernel names (a real sgl-kernel
// build without, e.g., the int8 operators): registers the names of kEntries
// that no library defines and leaves the others alone. Returns the names
// rvv_attn serves (this call's and earlier ones') and those it left to the
// other library, both in kEntries' order. Never raises for a defined name.
std::tuple<std::vector<std::string>, std::vector<std::string>> register_absent_sglang_names() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  std::vector<const Entry*> missing;
  std::vector<std::string> skipped;
  for (const Entry& e : kEntries) {
    if (r.ours.count(e.qualified()) != 0) continue;
    if (defined_elsewhere(e).has_value()) {
      skipped.emplace_back(e.qualified());
    } else {
      missing.push_back(&e);
    }
  }
  register_entries(r, missing);
  std::vector<std::string> served;
  for (const Entry& e : kEntries) {
    if (r.ours.count(e.qualified()) != 0) served.emplace_back(e.qualified());
  }
  return {served, skipped};
}

}  // namespace rvv_attn

TORCH_LIBRARY_FRAGMENT(rvv_attn, m) {
  m.def("register_sglang_names() -> str[]", &rvv_attn::register_sglang_names);
  m.def("register_absent_sglang_names() -> (str[] served, str[] skipped)", &rvv_attn::register_absent_sglang_names);
}
