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
// - unbounded (slack >= kUnbounded: compute.allocator = "cache", blocks of 32 MiB and more):
//   nothing is evicted, a larger cached block is always reused whole (no shrink, no page
//   dropped: `keep_`) and no page is moved. The cache then only keeps the blocks that a
//   worker's own malloc arena (64 MiB heaps) would map and unmap in every task.
//
// - moves (where the kernel has userfaultfd's UFFDIO_MOVE, Linux 6.8+): oneDNN's LSTM
//   workspace is written in part by the forward and the rest by the backward, and the process
//   peaks as the backward starts. So a block reused is handed out with only the pages its
//   pattern's user had written by its thread's backward start (`early`, mincore of the
//   thread's live blocks at its first large allocation or free with grad mode off), and when
//   a block is freed during the backward the pages its user wrote there (the block's late
//   part) are moved, with their page tables, into the not yet resident pages the same
//   thread's live blocks will likely write (the pattern of the last free of their nearest
//   size), the most recently allocated first: the next-lower layer's workspace, whose
//   backward comes next, gets the pages the kernel would otherwise zero. Since reused blocks
//   then hold no late pages at the peak, a request of another size takes the cached block
//   that costs fewest pages (those it will likely touch early and lacks, plus the resident
//   pages it would drop or unmap) instead of "smallest larger". UFFDIO_MOVE refuses
//   a destination page already in memory, so nothing written is overwritten, whatever the
//   threads do. Every block the cache maps is registered with one userfaultfd (write-protect
//   mode, asynchronous, nothing protected: no access ever stops). Without it (older kernel,
//   seccomp, RNNTRAIN_CPUCACHE_MOVE=off, a forked child) blocks are reused whole as before.
// - fills (with moves): under the bound the process keeps spare resident pages (the cache's
//   free blocks, a reused block's stale pages, a shrunk block's tail, blocks evicted), while
//   the blocks handed out fault in the pages they lack, each zeroed by the kernel. So a block
//   handed out gets the pages it will likely touch early and lacks (its holes: the pattern
//   of the last free of the nearest size, scaled) moved in from those, the block's own
//   first, then the evicted blocks', then the cache's free blocks least recently freed
//   first; and at a thread's backward start, its last live workspace (whose backward comes
//   first, with no block freed before it to give it pages) gets the pages its pattern's
//   user wrote in the backward from the cache's free blocks. A move leaves the resident size
//   as it is and costs a fraction of a fault. cpucache.FILL turns it off.
//
// One mutex guards the large blocks' books; mmap, mremap, munmap and mincore run outside it.
// A free takes it only when the pointer is page-aligned (every large block is; a small one
// rarely): that pointer is looked up, any other goes straight to the base allocator.
// Built on first use by rnntrain/compute/cpucache.py; extern "C" functions for ctypes below.
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/GradMode.h>
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

// userfaultfd's page move (Linux 6.8) and asynchronous write-protect mode (6.7), for the
// headers of older systems
#ifndef UFFD_FEATURE_WP_ASYNC
#define UFFD_FEATURE_WP_ASYNC (1 << 15)
#endif
#ifndef UFFD_FEATURE_MOVE
#define UFFD_FEATURE_MOVE (1 << 16)
struct uffdio_move {
  __u64 dst, src, len, mode;
  __s64 move;
};
#define UFFDIO_MOVE_MODE_ALLOW_SRC_HOLES ((__u64)1 << 1)
#define UFFDIO_MOVE _IOWR(UFFDIO, 0x05, struct uffdio_move)
#endif
#ifndef UFFD_USER_MODE_ONLY
#define UFFD_USER_MODE_ONLY 1
#endif

namespace {

constexpr size_t kPage = 4096;
constexpr size_t kUnbounded = size_t{1} << 62;  // a slack this large: nothing evicted

// Each thread's number (live blocks belong to the thread that asked for them) and whether
// its last large allocation or free ran with grad mode off (a backward).
std::atomic<unsigned> g_threads{0};
struct ThreadState {
  unsigned id = g_threads.fetch_add(1);
  bool backward = false;
};
thread_local ThreadState t_state;

using Runs = std::vector<std::pair<size_t, size_t>>;  // page ranges [first, end), ascending

Runs runs_of(const std::vector<unsigned char>& map) {
  Runs r;
  for (size_t q = 0; q < map.size(); ++q) {
    if (!map[q]) continue;
    if (!r.empty() && r.back().second == q) {
      r.back().second = q + 1;
    } else {
      r.emplace_back(q, q + 1);
    }
  }
  return r;
}

// pages of r in [lo, hi)
size_t pages_in(const Runs& r, size_t lo, size_t hi) {
  size_t n = 0;
  for (const auto& [a, b] : r) {
    size_t x = std::max(a, lo), y = std::min(b, hi);
    if (x < y) n += y - x;
  }
  return n;
}

// pages in both a and b, below hi
size_t overlap(const Runs& a, const Runs& b, size_t hi) {
  size_t n = 0, i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    size_t x = std::max(a[i].first, b[j].first);
    size_t y = std::min({a[i].second, b[j].second, hi});
    if (x < y) n += y - x;
    if (a[i].second < b[j].second) {
      ++i;
    } else {
      ++j;
    }
  }
  return n;
}

struct Cached {
  void* ptr;
  size_t bytes;
  size_t resident;                 // bytes of it in memory when freed
  size_t asked;                    // the size its last user asked for
  uint64_t freed_at;               // sequence number of the free: the smallest goes first
  std::vector<unsigned char> map;  // per page: in memory when freed (mincore)
  std::vector<unsigned char> early;  // per page: in memory at its thread's backward start
                                     // (moves on; else empty: `map` stands in)
  bool registered = false;           // with the userfaultfd (moves into it possible)
  Runs runs;                         // moves on: `map` as ranges (of a cached block), or
                                     // the early pattern (of a history entry)
};

// The pages a request of n bytes will likely touch before its backward: the early pattern
// of `like` (the last free of the nearest size) scaled to n, all of them when there is none;
// below `pages`.
Runs predict(const Cached* like, size_t n, size_t pages) {
  if (like == nullptr) return pages > 0 ? Runs{{0, pages}} : Runs{};
  Runs p;
  double scale = static_cast<double>(n) / static_cast<double>(like->asked);
  for (const auto& [a, b] : like->runs) {
    size_t x = static_cast<size_t>(static_cast<double>(a) * scale);
    size_t y = std::min(pages, static_cast<size_t>(std::ceil(static_cast<double>(b) * scale)));
    if (x >= pages) break;
    if (!p.empty() && p.back().second >= x) {
      p.back().second = std::max(p.back().second, y);
    } else if (x < y) {
      p.emplace_back(x, y);
    }
  }
  return p;
}

enum Stat {
  kLive, kCached, kCachedResident, kPeakLive, kBasePeak, kRssPeak, kHits, kRemaps, kMisses,
  kDroppedBytes, kEvictions, kEvictedBytes, kReleasedBytes, kThreshold, kSlack,
  kFits, kFaultedHits, kFaultedFits, kFaultedRemaps, kFaultedMisses, kMoving, kMoves,
  kMovedBytes, kFills, kFilledBytes, kNStats
};

// How a block was handed out: the same asked size; another size, the block kept whole (up
// to 1/fit_div larger); resized (mremap); mapped fresh. Each has its count and the bytes
// its users faulted in (kFaultedHits + path).
enum Path { kPathHit, kPathFit, kPathRemap, kPathMiss };

struct Live {
  size_t bytes;     // mapped
  size_t asked;     // by its user
  size_t resident;  // in memory when handed out (after drop_stale), + pages moved in
  Path path;
  unsigned thread;  // t_state.id of its user
  uint64_t seq;     // allocation order
  bool registered;  // with the userfaultfd: pages can be moved into it
  bool snapped;     // early taken (at its thread's backward start)
  std::vector<unsigned char> early;
  std::shared_ptr<const Cached> like;  // the pattern it will likely touch (moves into it)
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
  // with moves, the pattern is what its user had written by its backward's start
  const std::vector<unsigned char>& pat = like.early.empty() ? like.map : like.early;
  // pages past the asked size (a block kept whole, up to 1/fit_div larger) are kept: the
  // next larger request of the size class finds them in memory
  size_t pages = std::min({c.bytes, want, (n + kPage - 1) / kPage * kPage}) / kPage;
  size_t dropped = 0, run = 0;
  double scale = static_cast<double>(like.asked) / static_cast<double>(n);
  for (size_t q = 0; q <= pages; ++q) {
    bool stale = false;
    if (q < pages && c.map[q]) {
      size_t src = static_cast<size_t>(static_cast<double>(q) * scale);
      stale = src >= pat.size() || !pat[src];
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
    enter();
    size_t want = (n + kPage - 1) / kPage * kPage;
    Cached src{nullptr, 0, 0, 0, 0, {}, {}};
    std::shared_ptr<const Cached> like;  // the pattern to keep, for another size
    std::shared_ptr<const Cached> near;  // moves: the recent free of the nearest size
    bool moving = moving_now();
    uint64_t seq = 0;
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
      if (moving) near = nearest(n);
      if (larger >= 0 && (keep_ || cached_[larger].bytes - want <= want / fit_div_)) fit = larger;
      if (moving && same < 0) {
        // moves on (reused blocks then hold their early pages only, so the choice does not
        // raise the peak): the block that costs fewest pages, those the request will likely
        // touch that it lacks + its resident pages dropped or unmapped with a shrunk tail,
        // against a fresh mapping's (every page it will touch); kept whole when it holds
        // `want` without wasting over 1/fit_div, else resized
        fit = larger = smaller = -1;
        size_t np = (n + kPage - 1) / kPage, wp = want / kPage;
        Runs touch = predict(near.get(), n, np);
        size_t all = pages_in(touch, 0, np), cost = all, gap = 0;
        for (int i = 0; i < static_cast<int>(cached_.size()); ++i) {
          const Cached& c = cached_[i];
          size_t b = c.bytes / kPage;
          bool keep = b >= wp && b - wp <= wp / fit_div_;
          size_t end = keep ? b : wp, lim = std::min(b, end);
          size_t both = overlap(c.runs, touch, lim);
          size_t k = all - both + pages_in(c.runs, 0, std::min(lim, np)) - both +
                     (b > end ? pages_in(c.runs, end, b) : 0);
          size_t g = b > wp ? b - wp : wp - b;
          if (k < cost || (k == cost && (fit < 0 && larger < 0 ? true : g < gap))) {
            cost = k;
            gap = g;
            fit = keep ? i : -1;
            larger = keep ? -1 : i;
          }
        }
        like = near;
      }
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
        if (same < 0 && !moving) like = nearest(n);  // the recent free of the nearest size
      } else {
        stats_[kMisses] += 1;
      }
      seq = ++alloc_seq_;
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
    // fills (moves on): the pages the request will likely touch early (the pattern of the
    // recent free of the nearest size, scaled) that the block does not hold (its holes) are
    // moved in from pages that are resident but would otherwise be given back or wait
    // unused: the block's own stale pages (resident, not in the pattern: dropped otherwise),
    // the tail a shrink would unmap, the blocks evicted for the bound, then the cache's free
    // blocks, least recently freed first. A move costs a fraction of the fault (and the
    // zeroing) it saves, and the resident size does not change.
    const Cached* pat = like ? like.get()
                             : (path == kPathHit && near && near->asked == n ? near.get() : nullptr);
    bool fill = fill_ && moving && pat != nullptr;
    size_t filled = 0;  // pages moved in
    size_t np = (n + kPage - 1) / kPage;
    std::vector<unsigned char> want_page;  // per page below np: in the pattern
    if (fill) {
      want_page.assign(np, 0);
      for (const auto& [a, b] : predict(pat, n, np)) {
        std::fill(want_page.begin() + static_cast<long>(a), want_page.begin() + static_cast<long>(b), 1);
      }
    }
    if (fill && src.ptr != nullptr && src.registered && src.bytes > want) {
      // a shrink: the tail's resident pages into the holes below, before mremap unmaps them
      std::vector<size_t> holes, tail;
      size_t wp = want / kPage, bp = src.bytes / kPage;
      for (size_t q = 0; q < std::min(np, wp); ++q) {
        if (want_page[q] && !src.map[q]) holes.push_back(q);
      }
      for (size_t q = wp; q < bp && tail.size() < holes.size(); ++q) {
        if (src.map[q]) tail.push_back(q);
      }
      size_t k = fill_holes(static_cast<char*>(src.ptr), holes, static_cast<char*>(src.ptr), tail);
      for (size_t i = 0; i < k; ++i) {
        src.map[holes[i]] = 1;
        src.map[tail[i]] = 0;
      }
      filled += k;
    }
    if (!fill) {
      for (const Cached& c : evict) munmap(c.ptr, c.bytes);
    }
    size_t kept = 0;  // bytes of the block in memory as it is handed out
    if (src.ptr != nullptr) {
      size_t upto = std::min(src.bytes, want) / kPage;
      for (size_t q = 0; q < upto; ++q) kept += src.map[q];
      kept *= kPage;
    }
    // a block reused for another size drops the pages the next user will likely not touch;
    // with moves, any reused block also drops its late part (the pattern's early pages kept)
    std::vector<size_t> stale;  // fills: those pages, moved into the holes or dropped below
    if (src.ptr != nullptr && !keep_ && (src.asked != n || (moving && !src.early.empty()))) {
      if (fill) {
        size_t upto = std::min({src.bytes, want, np * kPage}) / kPage;
        for (size_t q = 0; q < upto; ++q) {
          if (src.map[q] && !want_page[q]) stale.push_back(q);
        }
      } else {
        size_t dropped = drop_stale(src, like ? *like : src, n, want);
        kept -= std::min(kept, dropped);
        std::lock_guard<std::mutex> g(mu_);
        stats_[kDroppedBytes] += dropped;
      }
    }
    void* p = nullptr;
    bool registered = false, fresh = src.ptr == nullptr;  // fresh: mapped now, no pages
    if (src.ptr != nullptr && src.bytes == want) {
      p = src.ptr;
      registered = src.registered;
    } else if (src.ptr != nullptr) {
      p = mremap(src.ptr, src.bytes, want, MREMAP_MAYMOVE);
      if (p == MAP_FAILED) {
        munmap(src.ptr, src.bytes);
        p = nullptr;
      }
    }
    if (p == nullptr) {
      kept = 0;
      fresh = true;
      stale.clear();
      p = mmap(nullptr, want, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p == MAP_FAILED) {
        if (fill) {  // (without fills they were unmapped above)
          for (const Cached& c : evict) munmap(c.ptr, c.bytes);
        }
        std::lock_guard<std::mutex> g(mu_);
        stats_[kLive] -= want;
        TORCH_CHECK_WITH(OutOfMemoryError, false, "rnntrain cpucache: cannot map ", want,
                         " bytes: ", std::strerror(errno));
      }
    }
    if (moving && !registered) registered = register_block(p, want);
    if (fill) {
      // the holes now (a reused block's pages keep their offsets through mremap)
      std::vector<size_t> holes;
      size_t upto = fresh ? 0 : std::min(src.map.size(), want / kPage);
      for (size_t q = 0; q < std::min(np, want / kPage); ++q) {
        if (want_page[q] && !(q < upto && src.map[q])) holes.push_back(q);
      }
      size_t moved_in = 0;  // pages from other blocks
      if (registered && !holes.empty()) {
        size_t k = fill_holes(static_cast<char*>(p), holes, static_cast<char*>(p), stale);
        filled += k;
        holes.erase(holes.begin(), holes.begin() + static_cast<long>(k));
        stale.erase(stale.begin(), stale.begin() + static_cast<long>(k));
        for (const Cached& c : evict) {
          if (holes.empty()) break;
          std::vector<size_t> res;
          for (size_t q = 0; q < c.map.size() && res.size() < holes.size(); ++q) {
            if (c.map[q]) res.push_back(q);
          }
          size_t e = fill_holes(static_cast<char*>(p), holes, static_cast<char*>(c.ptr), res);
          moved_in += e;
          holes.erase(holes.begin(), holes.begin() + static_cast<long>(e));
        }
        moved_in += fill_from_cache(static_cast<char*>(p), holes);
      }
      for (const Cached& c : evict) munmap(c.ptr, c.bytes);
      size_t dropped = 0;  // the stale pages left
      for (size_t i = 0; i < stale.size();) {
        size_t j = i + 1;
        while (j < stale.size() && stale[j] == stale[j - 1] + 1) ++j;
        madvise(static_cast<char*>(p) + stale[i] * kPage, (j - i) * kPage, MADV_DONTNEED);
        dropped += (j - i) * kPage;
        i = j;
      }
      filled += moved_in;
      // (a stale page moved into a hole, or a tail page before the shrink, stays counted)
      kept = kept - std::min(kept, dropped) + moved_in * kPage;
      std::lock_guard<std::mutex> g(mu_);
      stats_[kDroppedBytes] += dropped;
      if (filled > 0) stats_[kFills] += 1;
      stats_[kFilledBytes] += filled * kPage;
    }
    {
      std::lock_guard<std::mutex> g(mu_);
      live_[p] = {want, n, kept, path, t_state.id, seq, registered, false, {}, std::move(near)};
    }
    return {p, p, &delete_block, c10::Device(c10::DeviceType::CPU)};
  }

  // false when ptr is not a live large block (then it is the base allocator's)
  bool free_large(void* ptr) {
    if (reinterpret_cast<uintptr_t>(ptr) % kPage != 0) return false;
    enter();
    Live b;
    {
      std::lock_guard<std::mutex> g(mu_);
      auto it = live_.find(ptr);
      if (it == live_.end()) return false;
      b = std::move(it->second);
      live_.erase(it);
    }
    size_t resident = 0;
    auto map = resident_map(ptr, b.bytes, &resident);  // nobody else holds it now
    if (b.early.size() != map.size()) b.early.clear();
    // the pattern as its user touched it (before any page moves out)
    auto seen = std::make_shared<const Cached>(
        Cached{nullptr, b.bytes, resident, b.asked, 0, map, b.early, false,
               moving_now() ? runs_of(b.early.empty() ? map : b.early) : Runs{}});
    size_t before = resident;
    Runs runs;
    if (moving_now()) {
      if (b.snapped && !b.early.empty() && t_state.backward) give_late(ptr, b, map, &resident);
      runs = runs_of(map);
    }
    std::lock_guard<std::mutex> g(mu_);
    history_[seq_ % history_.size()] = std::move(seen);
    cached_.push_back({ptr, b.bytes, resident, b.asked, ++seq_, std::move(map),
                       std::move(b.early), b.registered, std::move(runs)});
    stats_[kLive] -= b.bytes;
    stats_[kCached] += b.bytes;
    stats_[kCachedResident] += resident;
    resident = before;  // the books: what its user faulted in
    // what its user faulted in (a page dropped as stale and touched again counts once)
    stats_[kFaultedHits + b.path] += resident > b.resident ? resident - b.resident : 0;
    sample();
    return true;
  }

  void free_any(void* ptr) {
    if (!free_large(ptr)) base_delete_(ptr);
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
      for (const Cached& c : all) {  // (blocks lent for a fill come back counted)
        stats_[kReleasedBytes] += c.bytes;
        stats_[kCached] -= c.bytes;
        stats_[kCachedResident] -= c.resident;
      }
    }
    size_t bytes = 0;
    for (const Cached& c : all) {
      munmap(c.ptr, c.bytes);
      bytes += c.bytes;
    }
    return bytes;
  }

  void configure(size_t threshold, size_t slack, size_t fit_div, size_t ahead_pct,
                 bool move, bool fill) {
    if (move && uffd_ < 0 && why_.empty()) open_uffd();
    std::lock_guard<std::mutex> g(mu_);
    move_ = move && uffd_ >= 0;
    fill_ = fill;
    stats_[kMoving] = move_;
    threshold_ = std::max(threshold, kPage);
    stats_[kThreshold] = threshold_;
    stats_[kSlack] = slack;
    keep_ = slack >= kUnbounded;
    fit_div_ = std::max<size_t>(fit_div, 1);
    ahead_pct_ = std::min<size_t>(ahead_pct, 100);
  }

  void stats(uint64_t* out) {
    std::lock_guard<std::mutex> g(mu_);
    std::copy(stats_, stats_ + kNStats, out);
  }

  // why pages are not moved (empty when they are, or were not asked for)
  const std::string& why_not_moving() const { return why_; }

 private:
  // userfaultfd for moves: user-mode faults only (allowed unprivileged), the page move and
  // the asynchronous write-protect mode (a registration that never stops an access), then
  // one page moved between two small mappings and read back. Any failure: no moves, why_.
  void open_uffd() {
    auto fail = [this](const char* what, int err) {
      why_ = std::string(what) + ": " + std::strerror(err);
      if (uffd_ >= 0) close(uffd_);
      uffd_ = -1;
    };
    uffd_ = static_cast<int>(syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK | UFFD_USER_MODE_ONLY));
    if (uffd_ < 0) return fail("userfaultfd", errno);
    uffdio_api api{};
    api.api = UFFD_API;
    api.features = UFFD_FEATURE_MOVE | UFFD_FEATURE_WP_ASYNC;
    if (ioctl(uffd_, UFFDIO_API, &api) != 0) return fail("userfaultfd UFFDIO_API", errno);
    uffd_pid_ = getpid();
    char* a = static_cast<char*>(mmap(nullptr, 2 * kPage, PROT_READ | PROT_WRITE,
                                      MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    if (a == MAP_FAILED) return fail("mmap", errno);
    a[0] = 42;
    int err = register_block(a + kPage, kPage) ? 0 : EINVAL;
    uffdio_move mv{};
    mv.dst = reinterpret_cast<uintptr_t>(a + kPage);
    mv.src = reinterpret_cast<uintptr_t>(a);
    mv.len = kPage;
    if (err == 0 && ioctl(uffd_, UFFDIO_MOVE, &mv) != 0) err = errno;
    bool ok = err == 0 && a[kPage] == 42;
    munmap(a, 2 * kPage);
    if (!ok) fail("userfaultfd UFFDIO_MOVE", err ? err : EIO);
  }

  bool register_block(void* p, size_t bytes) {
    if (uffd_ < 0 || getpid() != uffd_pid_) return false;
    uffdio_register r{};
    r.range.start = reinterpret_cast<uintptr_t>(p);
    r.range.len = bytes;
    r.mode = UFFDIO_REGISTER_MODE_WP;
    return ioctl(uffd_, UFFDIO_REGISTER, &r) == 0;
  }

  bool moving_now() const { return move_ && getpid() == uffd_pid_; }

  // Moves page from[i] of mapping s into page holes[i] of mapping d (registered with the
  // userfaultfd; may be s), in order, each run contiguous on both sides in one call, until
  // either list ends or a move fails; returns the pairs done. Nobody writes either range
  // meanwhile (a block being handed out, the calling thread's own, blocks off the cache).
  size_t fill_holes(char* d, const std::vector<size_t>& holes, char* s,
                    const std::vector<size_t>& from) {
    size_t n = std::min(holes.size(), from.size()), i = 0, calls = 0;
    while (i < n) {
      size_t len = 1;
      while (i + len < n && holes[i + len] == holes[i] + len && from[i + len] == from[i] + len) {
        ++len;
      }
      uffdio_move mv{};
      mv.dst = reinterpret_cast<uintptr_t>(d + holes[i] * kPage);
      mv.src = reinterpret_cast<uintptr_t>(s + from[i] * kPage);
      mv.len = len * kPage;
      mv.mode = UFFDIO_MOVE_MODE_ALLOW_SRC_HOLES;
      int rc = ioctl(uffd_, UFFDIO_MOVE, &mv);
      size_t done = rc == 0 ? len : (mv.move > 0 ? static_cast<size_t>(mv.move) / kPage : 0);
      ++calls;
      i += done;
      if (rc != 0) break;
    }
    std::lock_guard<std::mutex> g(mu_);
    stats_[kMoves] += calls;
    return i;
  }

  // (under the lock) the recent free of the nearest asked size (within 1/4), or null
  std::shared_ptr<const Cached> nearest(size_t n) const {
    std::shared_ptr<const Cached> like;
    double best = 0.25;
    for (const auto& h : history_) {
      if (!h) continue;
      double d = std::abs(std::log(static_cast<double>(h->asked) / static_cast<double>(n)));
      if (d < best) {
        best = d;
        like = h;
      }
    }
    return like;
  }

  // At a large allocation or free: whether this thread runs a backward now (grad mode off);
  // at its start the thread's live blocks note the pages they hold (`early`), and when the
  // next forward starts they forget them.
  void enter() {
    if (!move_) return;
    bool bwd = !c10::GradMode::is_enabled();
    if (bwd != t_state.backward) snap_thread(bwd);
    t_state.backward = bwd;
  }

  void snap_thread(bool start) {
    std::vector<std::pair<void*, Live*>> mine;
    std::vector<std::tuple<void*, size_t, uint64_t>> todo;
    {
      std::lock_guard<std::mutex> g(mu_);
      for (auto& [p, l] : live_) {
        if (l.thread != t_state.id) continue;
        if (!start) {
          l.snapped = false;
          l.early.clear();
        } else if (!l.snapped) {
          todo.emplace_back(p, l.bytes, l.seq);
        }
      }
    }
    void* last = nullptr;  // the thread's most recent live block with a pattern
    uint64_t last_seq = 0;
    size_t last_bytes = 0, last_asked = 0;
    std::shared_ptr<const Cached> last_like;
    for (auto& [p, bytes, seq] : todo) {
      size_t r = 0;
      auto e = resident_map(p, bytes, &r);  // freed meanwhile: ignored below
      std::lock_guard<std::mutex> g(mu_);
      auto it = live_.find(p);
      if (it != live_.end() && it->second.seq == seq) {
        it->second.early = std::move(e);
        it->second.snapped = true;
        if (it->second.registered && it->second.like && seq > last_seq &&
            has_late(*it->second.like)) {
          last = p;
          last_seq = seq;
          last_bytes = bytes;
          last_asked = it->second.asked;
          last_like = it->second.like;
        }
      }
    }
    if (start && fill_ && last != nullptr) {
      // its backward comes first and has no block freed before it to give it pages: the
      // pages its pattern's user wrote and it lacks, from the cache's free blocks
      size_t r = 0;
      auto now = resident_map(last, last_bytes, &r);
      size_t pages = std::min(last_bytes, (last_asked + kPage - 1) / kPage * kPage) / kPage;
      double scale = static_cast<double>(last_like->asked) / static_cast<double>(last_asked);
      std::vector<size_t> holes;
      for (size_t q = 0; q < pages; ++q) {
        size_t from = static_cast<size_t>(static_cast<double>(q) * scale);
        if (!now[q] && from < last_like->map.size() && last_like->map[from]) holes.push_back(q);
      }
      size_t k = fill_from_cache(static_cast<char*>(last), holes);
      std::lock_guard<std::mutex> g(mu_);
      auto it = live_.find(last);
      if (it != live_.end() && it->second.seq == last_seq) it->second.resident += k * kPage;
      stats_[kFilledBytes] += k * kPage;
      if (k > 0) stats_[kFills] += 1;
    }
  }

  // whether a pattern's user wrote pages in its backward (a workspace's late part)
  static bool has_late(const Cached& like) {
    if (like.early.size() != like.map.size()) return false;
    size_t late = 0;
    for (size_t q = 0; q < like.map.size(); ++q) late += like.map[q] && !like.early[q];
    return late >= 16;
  }

  // Pages of the cache's free blocks, the least recently freed first, moved into the holes
  // of block d (registered; holes ascending); returns the pages moved. The blocks lent are
  // off the cache during the moves (no other thread hands one out meanwhile); their pages
  // count as cached until moved.
  size_t fill_from_cache(char* d, const std::vector<size_t>& holes) {
    if (holes.empty()) return 0;
    std::vector<Cached> lent;
    {
      std::lock_guard<std::mutex> g(mu_);
      std::vector<size_t> idx(cached_.size());
      for (size_t i = 0; i < idx.size(); ++i) idx[i] = i;
      std::sort(idx.begin(), idx.end(), [this](size_t a, size_t b) {
        return cached_[a].freed_at < cached_[b].freed_at;
      });
      size_t got = 0;
      std::vector<size_t> take;
      for (size_t i : idx) {
        if (got >= holes.size()) break;
        if (cached_[i].resident == 0) continue;
        got += cached_[i].resident / kPage;
        take.push_back(i);
      }
      std::sort(take.rbegin(), take.rend());
      for (size_t i : take) {
        lent.push_back(std::move(cached_[i]));
        cached_.erase(cached_.begin() + static_cast<long>(i));
      }
    }
    size_t done = 0;
    for (Cached& c : lent) {
      if (done == holes.size()) break;
      std::vector<size_t> res;
      for (size_t q = 0; q < c.map.size() && res.size() < holes.size() - done; ++q) {
        if (c.map[q]) res.push_back(q);
      }
      std::vector<size_t> rest(holes.begin() + static_cast<long>(done), holes.end());
      size_t k = fill_holes(d, rest, static_cast<char*>(c.ptr), res);
      for (size_t i = 0; i < k; ++i) c.map[res[i]] = 0;
      c.resident -= std::min(c.resident, k * kPage);
      if (k > 0 && !c.runs.empty()) c.runs = runs_of(c.map);
      done += k;
    }
    std::lock_guard<std::mutex> g(mu_);
    stats_[kCachedResident] -= std::min<uint64_t>(stats_[kCachedResident], done * kPage);
    for (Cached& c : lent) cached_.push_back(std::move(c));
    return done;
  }

  // A block freed during its thread's backward: the pages its user wrote since the
  // backward started (map, not early) move into the pages the same thread's live blocks
  // will likely write and do not hold yet (their `like` pattern, not resident now), the
  // most recently allocated first. map and *resident lose the pages moved.
  void give_late(void* ptr, const Live& b, std::vector<unsigned char>& map, size_t* resident) {
    size_t np = map.size();
    std::vector<size_t> late;
    for (size_t q = 0; q < np; ++q) {
      if (map[q] && !b.early[q]) late.push_back(q);
    }
    if (late.size() < 16) return;  // not worth the calls
    struct Target {
      void* p;
      size_t bytes, asked;
      uint64_t seq;
      std::shared_ptr<const Cached> like;
    };
    std::vector<Target> targets;
    {
      std::lock_guard<std::mutex> g(mu_);
      for (const auto& [p, l] : live_) {
        if (l.thread == b.thread && l.registered && l.like && p != ptr) {
          targets.push_back({p, l.bytes, l.asked, l.seq, l.like});
        }
      }
    }
    std::sort(targets.begin(), targets.end(),
              [](const Target& x, const Target& y) { return x.seq > y.seq; });
    size_t next = 0;  // into late
    char* src = static_cast<char*>(ptr);
    for (const Target& t : targets) {
      if (next == late.size()) break;
      size_t r = 0;
      auto now = resident_map(t.p, t.bytes, &r);
      size_t pages = std::min(t.bytes, (t.asked + kPage - 1) / kPage * kPage) / kPage;
      double scale = static_cast<double>(t.like->asked) / static_cast<double>(t.asked);
      size_t moved = 0, q = 0;
      while (q < pages && next < late.size()) {
        size_t from = static_cast<size_t>(static_cast<double>(q) * scale);
        if (now[q] || from >= t.like->map.size() || !t.like->map[from]) {
          ++q;
          continue;
        }
        // the longest run wanted at q that the late pages from `next` fill contiguously
        size_t len = 1;
        while (q + len < pages && next + len < late.size() &&
               late[next + len] == late[next] + len && !now[q + len]) {
          size_t f = static_cast<size_t>(static_cast<double>(q + len) * scale);
          if (f >= t.like->map.size() || !t.like->map[f]) break;
          ++len;
        }
        uffdio_move mv{};
        mv.dst = reinterpret_cast<uintptr_t>(static_cast<char*>(t.p) + q * kPage);
        mv.src = reinterpret_cast<uintptr_t>(src + late[next] * kPage);
        mv.len = len * kPage;
        mv.mode = UFFDIO_MOVE_MODE_ALLOW_SRC_HOLES;
        int rc = ioctl(uffd_, UFFDIO_MOVE, &mv);
        int err = rc == 0 ? 0 : errno;
        size_t done = rc == 0 ? len : (mv.move > 0 ? static_cast<size_t>(mv.move) / kPage : 0);
        {
          std::lock_guard<std::mutex> g(mu_);
          stats_[kMoves] += 1;
          stats_[kMovedBytes] += done * kPage;
        }
        for (size_t k = 0; k < done; ++k) map[late[next + k]] = 0;
        moved += done;
        next += done;
        q += done;
        if (rc != 0) {
          if (err == EEXIST || (err == EAGAIN && done < len)) {
            ++q;  // that destination page was written meanwhile: the next one
          } else {
            break;  // the target went away (or the kernel refuses): the next target
          }
        }
      }
      if (moved > 0) {
        *resident -= std::min(*resident, moved * kPage);
        std::lock_guard<std::mutex> g(mu_);
        auto it = live_.find(t.p);
        if (it != live_.end() && it->second.seq == t.seq) it->second.resident += moved * kPage;
      }
    }
  }

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
  bool keep_ = false;        // unbounded (compute.allocator = "cache"): a larger block is
                            // reused whole, no page dropped
  size_t ahead_pct_ = 100;  // % of a new block's pages not yet resident counted in the bound
  bool move_ = false;       // pages moved into live blocks (userfaultfd is open)
  bool fill_ = false;       // with moves: holes filled (allocate, snap_thread)
  int uffd_ = -1;
  pid_t uffd_pid_ = 0;      // the process that opened it (a forked child does not move)
  std::string why_;         // why not moving: the call that failed
  uint64_t alloc_seq_ = 0;
  std::mutex mu_;
  std::unordered_map<void*, Live> live_;
  std::vector<Cached> cached_;
  std::vector<std::shared_ptr<const Cached>> history_{256};  // the last frees' patterns
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
                              size_t ahead_pct, size_t move, size_t fill) {
  if (g_cache == nullptr) {
    c10::Allocator* base = c10::GetCPUAllocator();
    c10::DeleterFnPtr del = base->raw_deleter();
    if (del == nullptr) return -1;
    g_cache = new LargeCache(base, del);
    g_cache->configure(threshold, slack, fit_div, ahead_pct, move != 0, fill != 0);
    c10::SetCPUAllocator(g_cache, /*priority=*/0);
    if (c10::GetCPUAllocator() != g_cache) return -2;
    return 0;
  }
  g_cache->configure(threshold, slack, fit_div, ahead_pct, move != 0, fill != 0);
  return c10::GetCPUAllocator() == g_cache ? 0 : -2;
}

// Why pages are not moved into live blocks (the failing call and its error), or "" when
// they are or were not asked for; copied into out (size n, NUL-terminated).
void rnntrain_cpucache_why_not_moving(char* out, size_t n) {
  std::string w = g_cache == nullptr ? std::string() : g_cache->why_not_moving();
  if (n > 0) {
    std::strncpy(out, w.c_str(), n - 1);
    out[n - 1] = 0;
  }
}

int rnntrain_cpucache_nstats() { return kNStats; }

// bytes live, cached, cached and resident, peak live; base's peak (the resident size less
// the cached free blocks), the resident size's peak, both as sampled at large allocations
// and frees; hits, remaps, misses, bytes dropped as stale, evictions, bytes evicted, bytes released by
// release_cached; threshold, slack; fits (another size, the block kept whole); the bytes
// faulted in by the users of hits, fits, remaps and misses (resident at free less resident
// when handed out); moving (1 when pages are moved), page moves (UFFDIO_MOVE calls),
// bytes moved (a backward's pages into live blocks); fills (blocks handed out, and
// workspaces at a backward's start, that got pages moved into their holes), bytes filled
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
