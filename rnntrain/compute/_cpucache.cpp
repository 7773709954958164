// A cache of large CPU blocks in front of torch's CPU allocator (compute.allocator = "capped").
//
// A training step allocates and frees the same few large workspaces in every task, sized by
// the task's T x N. glibc maps blocks over 32 MiB from the kernel and unmaps them on free, so
// every task has the kernel zero them again; kept in glibc's heap instead, blocks of ever
// different sizes fragment it (rnntrain/compute/allocator.py). This cache keeps freed large
// blocks as separate mappings and hands them out again by size:
//
// - a request >= threshold bytes is rounded up to whole pages; a cached block last asked
//   for the same size is reused as it is (a hit: the same shape touches the same pages);
//   else the smallest cached block at least that large and at most 1/fit_div larger, kept
//   whole (a fit), else the smallest larger one shrunk with mremap (its tail unmapped), else
//   the largest smaller one grown (only the difference is new, faulted in when touched): a
//   remap; else a fresh mapping (a miss). Each path counts the bytes its users fault in. On a remap the pages the last user touched and the next will likely
//   not are dropped first (drop_stale: oneDNN's LSTM workspace is touched only in part);
// - a free puts the block on the cache with its page map (mincore);
// - the bound is on the process's resident size (VmRSS, /proc/self/statm). Without the
//   cache the process would hold its resident size less the cache's resident free blocks:
//   `base`. At every large allocation and free base's peak so far is updated; before a
//   block is handed out, the least recently freed cached blocks are unmapped until the
//   resident size, plus the share ahead_pct of what the new block may still fault in, is
//   within base's peak + slack: the process holds about what it would without the cache
//   at its own peak, plus the slack (sampled at large allocations and frees);
// - smaller requests go to the allocator installed before (torch's default: posix_memalign,
//   its profiling reports), under glibc's "capped" settings.
//
// One mutex guards the large blocks' books; mmap, mremap, munmap and mincore run outside it.
// A free takes it only when the pointer is page-aligned (every large block is; a small one
// rarely): that pointer is looked up, any other goes straight to the base allocator.
// Built on first use by rnntrain/compute/cpucache.py; extern "C" functions for ctypes below.
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <unordered_map>
#include <utility>
#include <vector>

namespace {

constexpr size_t kPage = 4096;

struct Cached {
  void* ptr;
  size_t bytes;
  size_t resident;                 // bytes of it in memory when freed
  size_t asked;                    // the size its last user asked for
  uint64_t freed_at;               // sequence number of the free: the smallest goes first
  std::vector<unsigned char> map;  // per page: in memory when freed (mincore)
};

enum Stat {
  kLive, kCached, kCachedResident, kPeakLive, kBasePeak, kRssPeak, kHits, kRemaps, kMisses,
  kDroppedBytes, kEvictions, kEvictedBytes, kReleasedBytes, kThreshold, kSlack,
  kFits, kFaultedHits, kFaultedFits, kFaultedRemaps, kFaultedMisses, kNStats
};

// How a block was handed out: the same asked size; another size, the block kept whole (up
// to 1/fit_div larger); resized (mremap); mapped fresh. Each has its count and the bytes
// its users faulted in (kFaultedHits + path).
enum Path { kPathHit, kPathFit, kPathRemap, kPathMiss };

struct Live {
  size_t bytes;     // mapped
  size_t asked;     // by its user
  size_t resident;  // in memory when handed out (after drop_stale)
  Path path;
};

void delete_block(void* ptr);

std::vector<unsigned char> resident_map(void* p, size_t bytes, size_t* resident) {
  std::vector<unsigned char> v(bytes / kPage);
  if (mincore(p, bytes, v.data()) != 0) std::fill(v.begin(), v.end(), 1);
  size_t r = 0;
  for (unsigned char& c : v) r += (c &= 1);
  *resident = r * kPage;
  return v;
}

// A block reused for another size: the pages its last user left in memory that the next
// one will likely not touch. Workspaces scale with T x N and keep their layout (oneDNN's
// LSTM workspace leaves the same ~45 % untouched, at the same relative places, whatever
// its size), so the touch pattern of the next use is predicted from the last freed block
// asked for the nearest size (`like`: the same workspace of the previous task), page q of
// the new use as page q * like.asked / n of that one. The resident pages of the reused
// block outside that pattern are dropped (MADV_DONTNEED): kept, they would stay resident
// where a fresh block's untouched pages cost nothing. Returns the bytes dropped.
size_t drop_stale(const Cached& c, const Cached& like, size_t n, size_t want) {
  // pages past the asked size (a block kept whole, up to 1/fit_div larger) are kept: the
  // next larger request of the size class finds them in memory
  size_t pages = std::min({c.bytes, want, (n + kPage - 1) / kPage * kPage}) / kPage;
  size_t dropped = 0, run = 0;
  double scale = static_cast<double>(like.asked) / static_cast<double>(n);
  for (size_t q = 0; q <= pages; ++q) {
    bool stale = false;
    if (q < pages && c.map[q]) {
      size_t src = static_cast<size_t>(static_cast<double>(q) * scale);
      stale = src >= like.map.size() || !like.map[src];
    }
    if (stale) {
      ++run;
    } else if (run > 0) {
      madvise(static_cast<char*>(c.ptr) + (q - run) * kPage, run * kPage, MADV_DONTNEED);
      dropped += run * kPage;
      run = 0;
    }
  }
  return dropped;
}

class LargeCache final : public c10::Allocator {
 public:
  LargeCache(c10::Allocator* base, c10::DeleterFnPtr base_delete)
      : base_(base), base_delete_(base_delete), statm_(open("/proc/self/statm", O_RDONLY)) {}

  c10::DataPtr allocate(size_t n) override {
    if (n < threshold_) {
      c10::DataPtr d = base_->allocate(n);
      // the same memory under this allocator's one raw deleter (raw_allocate's contract)
      if (d.get() != nullptr && d.get() == d.get_context() &&
          d.get_deleter() == base_delete_) {
        void* p = d.release_context();
        return {p, p, &delete_block, c10::Device(c10::DeviceType::CPU)};
      }
      return d;
    }
    size_t want = (n + kPage - 1) / kPage * kPage;
    Cached src{nullptr, 0, 0, 0, 0, {}};
    std::shared_ptr<const Cached> like;  // the pattern to keep, for another size
    std::vector<Cached> evict;
    Path path = kPathMiss;
    {
      std::lock_guard<std::mutex> g(mu_);
      // a hit: a block last used for the same size (the same shape touches the same pages);
      // else the smallest cached block that holds `want` without wasting over 1/fit_div,
      // else the smallest larger one (shrunk), else the largest smaller one (grown)
      int fit = -1, larger = -1, smaller = -1, same = -1;
      for (int i = 0; i < static_cast<int>(cached_.size()); ++i) {
        size_t b = cached_[i].bytes;
        if (cached_[i].asked == n && (same < 0 || cached_[i].freed_at > cached_[same].freed_at)) {
          same = i;
        }
        if (b >= want) {
          if (larger < 0 || b < cached_[larger].bytes) larger = i;
        } else if (smaller < 0 || b > cached_[smaller].bytes) {
          smaller = i;
        }
      }
      if (larger >= 0 && cached_[larger].bytes - want <= want / fit_div_) fit = larger;
      if (same >= 0) fit = same;
      int pick = fit >= 0 ? fit : (larger >= 0 ? larger : smaller);
      if (pick >= 0) {
        src = std::move(cached_[pick]);
        cached_.erase(cached_.begin() + pick);
        stats_[kCached] -= src.bytes;
        stats_[kCachedResident] -= src.resident;
        path = same >= 0 ? kPathHit : (fit >= 0 ? kPathFit : kPathRemap);
        stats_[path == kPathHit ? kHits : (path == kPathFit ? kFits : kRemaps)] += 1;
        if (fit >= 0) want = src.bytes;  // kept whole
        if (same < 0) {  // the recent free of the nearest size (within 1/4), else itself
          double best = 0.25;
          for (const auto& h : history_) {
            if (!h) continue;
            double d = std::abs(std::log(static_cast<double>(h->asked) / static_cast<double>(n)));
            if (d < best) {
              best = d;
              like = h;
            }
          }
        }
      } else {
        stats_[kMisses] += 1;
      }
      stats_[kLive] += want;
      stats_[kPeakLive] = std::max(stats_[kPeakLive], stats_[kLive]);
      size_t rss = sample();
      // the bound, before anything new is faulted in: the share ahead_pct of what the
      // block may still fault in counted as resident; the least recently freed go first
      size_t fresh = (want > src.resident ? want - src.resident : 0) / 100 * ahead_pct_;
      while (!cached_.empty() && rss + fresh > stats_[kBasePeak] + stats_[kSlack]) {
        auto oldest = std::min_element(cached_.begin(), cached_.end(),
            [](const Cached& a, const Cached& b) { return a.freed_at < b.freed_at; });
        rss -= std::min(rss, oldest->resident);
        stats_[kCached] -= oldest->bytes;
        stats_[kCachedResident] -= oldest->resident;
        stats_[kEvictions] += 1;
        stats_[kEvictedBytes] += oldest->bytes;
        evict.push_back(std::move(*oldest));
        cached_.erase(oldest);
      }
    }
    for (const Cached& c : evict) munmap(c.ptr, c.bytes);
    size_t kept = 0;  // bytes of the block in memory as it is handed out
    if (src.ptr != nullptr) {
      size_t upto = std::min(src.bytes, want) / kPage;
      for (size_t q = 0; q < upto; ++q) kept += src.map[q];
      kept *= kPage;
    }
    if (src.ptr != nullptr && src.asked != n) {
      size_t dropped = drop_stale(src, like ? *like : src, n, want);
      kept -= std::min(kept, dropped);
      std::lock_guard<std::mutex> g(mu_);
      stats_[kDroppedBytes] += dropped;
    }
    void* p = nullptr;
    if (src.ptr != nullptr && src.bytes == want) {
      p = src.ptr;
    } else if (src.ptr != nullptr) {
      p = mremap(src.ptr, src.bytes, want, MREMAP_MAYMOVE);
      if (p == MAP_FAILED) {
        munmap(src.ptr, src.bytes);
        p = nullptr;
      }
    }
    if (p == nullptr) {
      kept = 0;
      p = mmap(nullptr, want, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p == MAP_FAILED) {
        std::lock_guard<std::mutex> g(mu_);
        stats_[kLive] -= want;
        TORCH_CHECK_WITH(OutOfMemoryError, false, "rnntrain cpucache: cannot map ", want,
                         " bytes: ", std::strerror(errno));
      }
    }
    {
      std::lock_guard<std::mutex> g(mu_);
      live_[p] = {want, n, kept, path};
    }
    return {p, p, &delete_block, c10::Device(c10::DeviceType::CPU)};
  }

  // false when ptr is not a live large block (then it is the base allocator's)
  bool free_large(void* ptr) {
    Live b;
    {
      std::lock_guard<std::mutex> g(mu_);
      auto it = live_.find(ptr);
      if (it == live_.end()) return false;
      b = it->second;
      live_.erase(it);
    }
    size_t resident = 0;
    auto map = resident_map(ptr, b.bytes, &resident);  // nobody else holds it now
    std::lock_guard<std::mutex> g(mu_);
    history_[seq_ % history_.size()] = std::make_shared<const Cached>(
        Cached{nullptr, b.bytes, resident, b.asked, seq_, map});
    cached_.push_back({ptr, b.bytes, resident, b.asked, ++seq_, std::move(map)});
    stats_[kLive] -= b.bytes;
    stats_[kCached] += b.bytes;
    stats_[kCachedResident] += resident;
    // what its user faulted in (a page dropped as stale and touched again counts once)
    stats_[kFaultedHits + b.path] += resident > b.resident ? resident - b.resident : 0;
    sample();
    return true;
  }

  void free_any(void* ptr) {
    if (reinterpret_cast<uintptr_t>(ptr) % kPage != 0 || !free_large(ptr)) base_delete_(ptr);
  }

  c10::DeleterFnPtr raw_deleter() const override { return &delete_block; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

  size_t release_cached() {
    std::vector<Cached> all;
    {
      std::lock_guard<std::mutex> g(mu_);
      all.swap(cached_);
      for (const Cached& c : all) stats_[kReleasedBytes] += c.bytes;
      stats_[kCached] = 0;
      stats_[kCachedResident] = 0;
    }
    size_t bytes = 0;
    for (const Cached& c : all) {
      munmap(c.ptr, c.bytes);
      bytes += c.bytes;
    }
    return bytes;
  }

  void configure(size_t threshold, size_t slack, size_t fit_div, size_t ahead_pct) {
    std::lock_guard<std::mutex> g(mu_);
    threshold_ = std::max(threshold, kPage);
    stats_[kThreshold] = threshold_;
    stats_[kSlack] = slack;
    fit_div_ = std::max<size_t>(fit_div, 1);
    ahead_pct_ = std::min<size_t>(ahead_pct, 100);
  }

  void stats(uint64_t* out) {
    std::lock_guard<std::mutex> g(mu_);
    std::copy(stats_, stats_ + kNStats, out);
  }

 private:
  // (under the lock) the resident size now, and base's peak (resident less the cache's free
  // blocks) updated; without /proc the books stand in: live + cached bytes
  size_t sample() {
    size_t rss = stats_[kLive] + stats_[kCachedResident];
    if (getpid() != statm_pid_) {  // a forked child: /proc/self was the parent when opened
      if (statm_ >= 0) close(statm_);
      statm_ = open("/proc/self/statm", O_RDONLY);
      statm_pid_ = getpid();
    }
    char buf[128];
    ssize_t got = statm_ >= 0 ? pread(statm_, buf, sizeof(buf) - 1, 0) : -1;
    if (got > 0) {
      buf[got] = 0;
      unsigned long size = 0, res = 0;
      if (std::sscanf(buf, "%lu %lu", &size, &res) == 2) rss = res * kPage;
    }
    size_t base = rss > stats_[kCachedResident] ? rss - stats_[kCachedResident] : 0;
    stats_[kBasePeak] = std::max<uint64_t>(stats_[kBasePeak], base);
    stats_[kRssPeak] = std::max<uint64_t>(stats_[kRssPeak], rss);
    return rss;
  }

  c10::Allocator* base_;
  c10::DeleterFnPtr base_delete_;
  int statm_;
  pid_t statm_pid_ = getpid();
  size_t threshold_ = SIZE_MAX;  // read without the lock: set before the allocator is in
  size_t fit_div_ = 8;
  size_t ahead_pct_ = 100;  // % of a new block's pages not yet resident counted in the bound
  std::mutex mu_;
  std::unordered_map<void*, Live> live_;
  std::vector<Cached> cached_;
  std::vector<std::shared_ptr<const Cached>> history_{32};  // the last frees' patterns
  uint64_t seq_ = 0;
  uint64_t stats_[kNStats] = {};
};

LargeCache* g_cache = nullptr;  // never destroyed: tensors may be freed at exit

void delete_block(void* ptr) { g_cache->free_any(ptr); }

}  // namespace

extern "C" {

// Installs the cache as torch's CPU allocator (or retunes it). Returns 0 when installed,
// -1 when the allocator in place has no raw deleter to hand small blocks back to, -2 when
// torch kept another allocator (a higher priority).
int rnntrain_cpucache_install(size_t threshold, size_t slack, size_t fit_div,
                              size_t ahead_pct) {
  if (g_cache == nullptr) {
    c10::Allocator* base = c10::GetCPUAllocator();
    c10::DeleterFnPtr del = base->raw_deleter();
    if (del == nullptr) return -1;
    g_cache = new LargeCache(base, del);
    g_cache->configure(threshold, slack, fit_div, ahead_pct);
    c10::SetCPUAllocator(g_cache, /*priority=*/0);
    if (c10::GetCPUAllocator() != g_cache) return -2;
    return 0;
  }
  g_cache->configure(threshold, slack, fit_div, ahead_pct);
  return c10::GetCPUAllocator() == g_cache ? 0 : -2;
}

int rnntrain_cpucache_nstats() { return kNStats; }

// bytes live, cached, cached and resident, peak live; base's peak (the resident size less
// the cached free blocks), the resident size's peak, both as sampled at large allocations
// and frees; hits, remaps, misses, bytes dropped as stale, evictions, bytes evicted, bytes released by
// release_cached; threshold, slack; fits (another size, the block kept whole); the bytes
// faulted in by the users of hits, fits, remaps and misses (resident at free less resident
// when handed out)
void rnntrain_cpucache_stats(uint64_t* out) {
  if (g_cache == nullptr) {
    std::fill(out, out + kNStats, 0);
  } else {
    g_cache->stats(out);
  }
}

// Unmaps every cached (free) block; returns the bytes given back.
size_t rnntrain_cpucache_release() { return g_cache == nullptr ? 0 : g_cache->release_cached(); }

}  // extern "C"
