// pencilfft's exchange between the CPU devices of one process (exchange="local",
// pencilfft/_exchange/local.py).
//
// The devices of one process share its memory, yet XLA's all_to_all between them runs as
// three passes over the block (the chunks sliced out, exchanged through per-peer buffers,
// concatenated), and pencilfft adds two local transposes around it (chunks made contiguous,
// then interleaved in the order the next FFT wants).  Here the whole pencil transpose is one
// pass: once every device of a group has handed in its block, device i's output is written
// straight from every peer's input, chunk i of axis `split` of peer p landing at position p of
// axis `gather`, the axes already in `order`.
//
// The rendezvous.  The instantiate stage makes one state per exchange of the compiled program
// (XLA's thunk), shared by every call of the program; a call's arrivals meet there, per call
// (XLA's run id, the same on all the devices of one call) and group (the devices with the same
// coordinates on the other mesh axes), and are matched by the device's coordinate along the
// axis, round after round (the k-th arrival of a device in a call belongs to round k: a loop
// may run the exchange several times).  The handler is asynchronous: a device that arrives
// returns a future at once, so XLA's thread goes on with other ready work, and independent
// exchanges that devices reach in different orders never wait for each other.  When the last
// device of a group arrives, the copies (one task per destination device and peer) go to a
// pool of threads of ours, one per core this process may use (`_threads.available_cores()`);
// when all are done the futures are completed, each on a thread of its own (see `Pool`).  No
// device's input is released before every copy that reads it is done.
//
// Never a silent wait.  A round that does not fill within PENCILFFT_LOCAL_TIMEOUT seconds
// (default 600), or, in a one-process job, within half of that (20 s by default) in which no
// thread of the process ran
// (then nothing is on its way: the devices missing never started their part of the call,
// which is what XLA's CPU client does to a loop that runs 32 calls ahead of its results on
// fewer cores than twice its devices, `Expired`), fails with an error that says who waited for
// whom and why; so does every other round of that call, and any device of it that comes later.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#ifdef __linux__
#include <sched.h>
#endif

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

// ---------------------------------------------------------------------------------------------
// The copy: one peer's chunk into one device's output, any rank, any strides (in elements).

constexpr int kMaxRank = 8;
constexpr int64_t kTile = 16;

template <typename T>
void Copy(const T* src, T* dst, int rank, const int64_t* dims, const int64_t* ss,
          const int64_t* ds) {
  // The innermost axes: A, along which the destination is contiguous (written in order), and
  // B, along which the source is.  Distinct, they are walked in tiles so that both sides stay
  // in cache; the other axes are the outer loops.
  for (int k = 0; k < rank; ++k)
    if (dims[k] == 0) return;  // nothing to copy
  int a = -1, b = -1;
  for (int k = 0; k < rank; ++k) {
    if (dims[k] == 1) continue;
    if (a < 0 || ds[k] < ds[a]) a = k;
    if (b < 0 || ss[k] < ss[b]) b = k;
  }
  if (a < 0) {  // a single element
    *dst = *src;
    return;
  }
  int outer[kMaxRank], n_outer = 0;
  for (int k = 0; k < rank; ++k)
    if (k != a && k != b && dims[k] > 1) outer[n_outer++] = k;
  int64_t index[kMaxRank] = {0};
  for (;;) {
    const T* s = src;
    T* d = dst;
    for (int j = 0; j < n_outer; ++j) {
      s += index[j] * ss[outer[j]];
      d += index[j] * ds[outer[j]];
    }
    if (a == b) {
      const int64_t len = dims[a], sa = ss[a], da = ds[a];
      if (sa == 1 && da == 1) {
        std::memcpy(d, s, len * sizeof(T));
      } else {
        for (int64_t i = 0; i < len; ++i) d[i * da] = s[i * sa];
      }
    } else {
      const int64_t na = dims[a], nb = dims[b];
      const int64_t sa = ss[a], sb = ss[b], da = ds[a], db = ds[b];
      for (int64_t b0 = 0; b0 < nb; b0 += kTile) {
        const int64_t b1 = std::min(nb, b0 + kTile);
        for (int64_t a0 = 0; a0 < na; a0 += kTile) {
          const int64_t a1 = std::min(na, a0 + kTile);
          for (int64_t i = b0; i < b1; ++i) {
            const T* sr = s + i * sb;
            T* dr = d + i * db;
            for (int64_t j = a0; j < a1; ++j) dr[j * da] = sr[j * sa];
          }
        }
      }
    }
    int j = n_outer - 1;  // the odometer over the outer axes
    for (; j >= 0; --j) {
      if (++index[j] < dims[outer[j]]) break;
      index[j] = 0;
    }
    if (j < 0) return;
  }
}

struct Bytes16 {
  uint64_t lo, hi;
};

void CopyBytes(size_t element, const char* src, char* dst, int rank, const int64_t* dims,
               const int64_t* ss, const int64_t* ds) {
  switch (element) {
    case 1: return Copy(reinterpret_cast<const uint8_t*>(src), reinterpret_cast<uint8_t*>(dst),
                        rank, dims, ss, ds);
    case 2: return Copy(reinterpret_cast<const uint16_t*>(src), reinterpret_cast<uint16_t*>(dst),
                        rank, dims, ss, ds);
    case 4: return Copy(reinterpret_cast<const uint32_t*>(src), reinterpret_cast<uint32_t*>(dst),
                        rank, dims, ss, ds);
    case 8: return Copy(reinterpret_cast<const uint64_t*>(src), reinterpret_cast<uint64_t*>(dst),
                        rank, dims, ss, ds);
    default: return Copy(reinterpret_cast<const Bytes16*>(src), reinterpret_cast<Bytes16*>(dst),
                         rank, dims, ss, ds);
  }
}

// What the exchange does to one group, the same for every device of it (from the attributes
// and the input's shape): the shapes and strides of every peer's chunk on both sides.
struct Geometry {
  int rank = 0;
  int64_t n = 1;
  size_t element = 0;
  int64_t dims[kMaxRank];      // one chunk, in input axes
  int64_t src[kMaxRank];       // input strides, in input axes
  int64_t dst[kMaxRank];       // output strides, in input axes
  int64_t src_chunk = 0;       // elements between chunk i and i + 1 of the input's `split`
  int64_t dst_peer = 0;        // elements between the parts from peer p and p + 1 in the output
  // A reshard (several exchanges in one pass): per (destination i, peer p), the box peer p's
  // input gives device i's output, as (source offset, destination offset, dims[rank]) in
  // elements and global axes (`src`, `dst`: the strides of those axes); empty: an exchange.
  std::vector<int64_t> table;
};

// ---------------------------------------------------------------------------------------------
// The pools of threads of ours: one that runs the copies, as many threads as the `threads`
// attribute asks (`_threads.available_cores()`: the cores of this process, shared by all its
// devices, since one round's copies are every device's; copies are bound by memory bandwidth,
// more threads would only contend; the pool grows if a later program asks for more), and one that
// completes the futures, with a thread per future in flight: XLA runs the rest of that device's
// program on the thread that completes its future, and that rest may block (in one of XLA's
// own collectives, waiting for the other devices), so no future may wait for a busy thread.

class Pool {
 public:
  explicit Pool(bool grow) : grow_(grow) {}

  // `want`: the threads a fixed pool should have (ignored by a growing one).
  void Run(std::function<void()> task, int want = 1) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      tasks_.push_back(std::move(task));
      if (grow_ ? tasks_.size() > idle_ : threads_ < want) {
        const int add = grow_ ? 1 : want - threads_;  // a fixed pool: all at once
        threads_ += add;
        for (int i = 0; i < add; ++i) std::thread([this] { Work(); }).detach();  // process-long
      }
    }
    wake_.notify_one();
  }

 private:
  void Work() {
    for (;;) {
      std::function<void()> task;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        ++idle_;
        wake_.wait(lock, [this] { return !tasks_.empty(); });
        --idle_;
        task = std::move(tasks_.front());
        tasks_.pop_front();
      }
      task();
    }
  }

  const bool grow_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::function<void()>> tasks_;
  size_t idle_ = 0;
  int threads_ = 0;
};

Pool& copiers() {
  static Pool* p = new Pool(false);  // never destroyed: its threads are detached
  return *p;
}

Pool& completers() {
  static Pool* p = new Pool(true);
  return *p;
}

// ---------------------------------------------------------------------------------------------
// The rendezvous

struct Round {
  std::vector<const char*> in;
  std::vector<char*> out;
  std::vector<ffi::Promise> promises;
  std::vector<bool> present;
  std::vector<int32_t> device;  // XLA's device ordinal of each coordinate that came
  int64_t arrived = 0;
  Geometry geometry;
  std::chrono::steady_clock::time_point since;
};

// A round's key: the run of the program (XLA's run id, one per call of a compiled program, the
// same on all its devices) and the group.
using Key = std::pair<int64_t, int64_t>;

// One exchange of a compiled program (FFI state made at XLA's instantiate stage, once per
// thunk), shared by every call of that program.
struct Instance {
  static ffi::TypeId id;  // given by XLA when Python registers the type
  std::mutex mutex;
  std::map<Key, std::deque<Round>> rounds;  // rounds not yet full, oldest first
  Instance();
  ~Instance();
};
ffi::TypeId Instance::id = {};

// Every live instance, for the watchdog.
std::mutex registry_mutex;
std::set<Instance*>& registry() {
  static auto* r = new std::set<Instance*>();
  return *r;
}

// The runs whose rounds failed lately, and why: a device of such a run that arrives afterwards
// (it started late, or its peers gave up before it came) fails at once instead of waiting for
// peers that will never come.  A run id names one call of one program; two programs' ids meet
// only by chance, so a failure is remembered briefly (`kFailedKeep`: late devices come as soon
// as the failure frees XLA's threads) and only the newest few.
constexpr size_t kFailedRuns = 64;
constexpr double kFailedKeep = 120.0;  // seconds
struct FailedRunRecord {
  int64_t run;
  std::string why;
  std::chrono::steady_clock::time_point when;
};
std::mutex failed_mutex;
std::atomic<bool> any_failed{false};  // the fast path of every arrival: nothing ever failed
std::deque<FailedRunRecord>& failed_runs() {
  static auto* f = new std::deque<FailedRunRecord>();
  return *f;
}

bool FailedRun(int64_t run, std::string* why) {
  if (!any_failed.load(std::memory_order_acquire)) return false;
  std::lock_guard<std::mutex> lock(failed_mutex);
  const auto now = std::chrono::steady_clock::now();
  while (!failed_runs().empty() &&
         std::chrono::duration<double>(now - failed_runs().front().when).count() > kFailedKeep)
    failed_runs().pop_front();
  for (const FailedRunRecord& record : failed_runs()) {
    if (record.run == run) {
      *why = record.why;
      return true;
    }
  }
  return false;
}

// Whether this process is the whole job (set by Python at lowering, `_exchange.local`): only
// then can "no thread of this process runs" mean that the missing devices will never come
// (in a job of several processes they may be waiting, idle, for another process).
std::atomic<int> job_processes{0};  // 0: not told yet

// How long a round may wait: PENCILFFT_LOCAL_TIMEOUT seconds (600 when unset), and, in a
// one-process job, while no thread of this process runs, half of that (20 s when unset: XLA's
// own collectives on CPUs say they may be stuck after 20 s).  A device that waits for something
// outside the process (a host callback that sleeps or reads a slow disk) looks idle too: a
// larger PENCILFFT_LOCAL_TIMEOUT lets it.
struct Limits {
  double any, idle;
};

Limits Timeouts() {
  const char* text = std::getenv("PENCILFFT_LOCAL_TIMEOUT");
  const double value = text ? std::atof(text) : 0.0;
  return value > 0 ? Limits{value, value / 2} : Limits{600.0, 20.0};
}

double ProcessCpuSeconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

int Cores() {  // the cores this process may run on
#ifdef __linux__
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return CPU_COUNT(&set);
#endif
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

std::string Join(const std::vector<int64_t>& values) {
  std::string out;
  for (int64_t v : values) out += (out.empty() ? "" : ", ") + std::to_string(v);
  return out;
}

// Why a round failed, for its devices: who waited, for whom, how long, and the likely cause.
std::string Expired(int64_t run, const Round& round, double waited, bool idle, double limit) {
  std::vector<int64_t> missing, came, devices;
  for (size_t i = 0; i < round.present.size(); ++i) {
    (round.present[i] ? came : missing).push_back(static_cast<int64_t>(i));
    if (round.present[i]) devices.push_back(round.device[i]);
  }
  std::string text = "pencilfft local exchange: in call " + std::to_string(run) +
                     " of this program (XLA's run id), devices " + Join(devices) +
                     " (coordinate(s) " + Join(came) +
                     " along the exchange's mesh axes) waited " +
                     std::to_string(static_cast<int>(waited)) +
                     " s for the devices at coordinate(s) " + Join(missing) + ", ";
  text += idle ? "while no thread of this process ran: those devices never started their part "
                 "of this call, or stopped before this exchange (a failed or skipped branch), "
                 "or wait for something outside this process (a host callback: "
                 "PENCILFFT_LOCAL_TIMEOUT=T lets them take T/2 s). "
               : "which never reached this exchange within PENCILFFT_LOCAL_TIMEOUT (" +
                     std::to_string(static_cast<int>(limit)) +
                     " s): did their part of this call fail, take another branch, or never "
                     "start? ";
  text += "A part that never starts is XLA's CPU client's doing, not this exchange's: it runs "
          "each device's part of a call on one of max(cores, devices) threads (this process "
          "may use " + std::to_string(Cores()) +
          " cores), and a call dispatched while 32 before it are unfinished waits on one of "
          "those threads, so a loop that never waits for its results can hold them all while "
          "parts still wait to start, wherever there are fewer than twice as many cores as "
          "devices (jax's own collectives hang the same way). Wait for a result every 10 calls "
          "or so (jax.block_until_ready), or set PJRT_NPROC to at least twice the number of "
          "devices before jax starts.";
  return text;
}

// Rounds that waited too long fail (their devices get the reason), and so does every other
// round of their run: the run cannot complete once some of its devices have failed.
void Watch() {
  using Clock = std::chrono::steady_clock;
  auto last = Clock::now();
  double last_cpu = ProcessCpuSeconds();
  double idle_for = 0.0;  // seconds in a row in which no thread of this process ran
  for (;;) {
    std::this_thread::sleep_for(std::chrono::seconds(1));
    const auto now = Clock::now();
    const double cpu = ProcessCpuSeconds();
    const double step = std::chrono::duration<double>(now - last).count();
    // Idle: less than 1% of a core used.  A step much longer than the 1 s slept (the process
    // was stopped, or starved) says nothing about the missing devices: start again.
    idle_for = (step < 3.0 && cpu - last_cpu < 0.01 * step) ? idle_for + step : 0.0;
    last = now;
    last_cpu = cpu;
    const auto [limit, idle_limit] = Timeouts();
    const bool one_process = job_processes.load() == 1;
    std::vector<std::pair<int64_t, Round>> expired;
    {
      std::lock_guard<std::mutex> lock(registry_mutex);
      std::vector<std::pair<int64_t, std::string>> failing;  // runs failed in this scan
      for (Instance* instance : registry()) {
        std::lock_guard<std::mutex> inner(instance->mutex);
        for (auto& [key, rounds] : instance->rounds) {
          for (const Round& round : rounds) {
            const double waited = std::chrono::duration<double>(now - round.since).count();
            const bool idle = one_process && idle_for >= idle_limit && waited >= idle_limit;
            if (waited > limit || idle) {
              failing.emplace_back(key.first, Expired(key.first, round, waited, idle, limit));
              break;
            }
          }
        }
      }
      for (auto& [run, why] : failing) {
        std::string known;
        if (FailedRun(run, &known)) continue;
        std::lock_guard<std::mutex> failed(failed_mutex);
        failed_runs().push_back({run, std::move(why), now});
        if (failed_runs().size() > kFailedRuns) failed_runs().pop_front();
        any_failed.store(true, std::memory_order_release);
      }
      // Every waiting round of a failed run goes (those of runs failed before too: a device
      // that arrived while its run was being failed).
      for (Instance* instance : registry()) {
        std::lock_guard<std::mutex> inner(instance->mutex);
        for (auto it = instance->rounds.begin(); it != instance->rounds.end();) {
          std::string why;
          if (!FailedRun(it->first.first, &why)) {
            ++it;
            continue;
          }
          for (Round& round : it->second) expired.emplace_back(it->first.first, std::move(round));
          it = instance->rounds.erase(it);
        }
      }
    }
    for (auto& [run, round] : expired) {
      std::string why;
      FailedRun(run, &why);
      for (size_t i = 0; i < round.present.size(); ++i) {
        if (round.present[i])
          round.promises[i].SetError(ffi::Error(ffi::ErrorCode::kDeadlineExceeded, why));
      }
    }
  }
}

Instance::Instance() {
  static std::once_flag started;
  std::call_once(started, [] { std::thread(Watch).detach(); });
  std::lock_guard<std::mutex> lock(registry_mutex);
  registry().insert(this);
}

Instance::~Instance() {
  std::lock_guard<std::mutex> lock(registry_mutex);
  registry().erase(this);
}

ffi::ErrorOr<std::unique_ptr<Instance>> Instantiate() { return std::make_unique<Instance>(); }

ffi::Future Failed(std::string message) {
  ffi::Promise promise;
  promise.SetError(ffi::Error(ffi::ErrorCode::kInternal, "pencilfft local exchange: " + message));
  return ffi::Future(promise);
}

// The copies of a full round, then its futures: all on the pool.  One task per (destination,
// peer) chunk, so that a round of few devices still keeps every copying thread busy.
void Dispatch(std::shared_ptr<Round> round, int threads) {
  const int64_t n = round->geometry.n;
  auto left = std::make_shared<std::atomic<int64_t>>(n * n);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t p = 0; p < n; ++p) {
      copiers().Run([round, left, i, p, n] {
        const Geometry& g = round->geometry;
        const size_t e = g.element;
        if (g.table.empty()) {
          // chunk i of peer p -> part p of device i's output
          CopyBytes(e, round->in[p] + i * g.src_chunk * e, round->out[i] + p * g.dst_peer * e,
                    g.rank, g.dims, g.src, g.dst);
        } else {  // the box of peer p's block that lands in device i's
          const int64_t* row = g.table.data() + (i * n + p) * (2 + g.rank);
          CopyBytes(e, round->in[p] + row[0] * e, round->out[i] + row[1] * e, g.rank, row + 2,
                    g.src, g.dst);
        }
        if (left->fetch_sub(1) == 1) {
          // Every copy is done: every input may go.  A thread per device, so that the
          // devices' programs go on in parallel on the threads that complete them.
          for (int64_t j = 0; j < n; ++j) {
            completers().Run([round, j] { round->promises[j].SetAvailable(); });
          }
        }
      }, threads);
    }
  }
}

// What both handlers check of a device's call (element type, sizes, its coordinate), and
// the geometry's fields they share: "" and `g` begun, or why not.
std::string Start(const ffi::AnyBuffer& x, ffi::Result<ffi::AnyBuffer>& y,
                  const ffi::Buffer<ffi::S32>& where, int64_t n, int rank, Geometry& g,
                  int64_t& pos, int64_t& group) {
  const size_t element = ffi::ByteWidth(x.element_type());
  if (element == 0 || element > 16 || (element & (element - 1)) ||
      y->element_type() != x.element_type() || y->size_bytes() != x.size_bytes()) {
    return "unsupported element type or sizes (internal error)";
  }
  pos = where.typed_data()[0];
  group = where.typed_data()[1];
  if (pos < 0 || pos >= n) return "the device's coordinate is out of range (internal error)";
  g.rank = rank;
  g.n = n;
  g.element = element;
  return "";
}

// One device's arrival at the first round of its group in this call (`run`) that it has not
// joined yet (a call may run an exchange several times, in a loop); the last one to arrive
// dispatches the round's copies.  A device of a call whose rounds failed fails at once.
ffi::Future Arrive(Instance* instance, const ffi::AnyBuffer& x, ffi::Result<ffi::AnyBuffer>& y,
                   int64_t n, int64_t pos, int64_t group, Geometry g, int64_t threads,
                   int64_t run, int32_t device) {
  if (std::string why; FailedRun(run, &why)) {
    ffi::Promise promise;
    promise.SetError(ffi::Error(
        ffi::ErrorCode::kDeadlineExceeded,
        "pencilfft local exchange: device " + std::to_string(device) +
            " came to this exchange after the other devices of its call had given up: " + why));
    return ffi::Future(promise);
  }
  ffi::Promise promise;
  ffi::Future future(promise);
  std::shared_ptr<Round> full;
  {
    std::lock_guard<std::mutex> lock(instance->mutex);
    auto& rounds = instance->rounds[Key{run, group}];
    auto it = rounds.begin();
    while (it != rounds.end() && it->present[pos]) ++it;
    if (it == rounds.end()) {
      Round fresh;
      fresh.in.assign(n, nullptr);
      fresh.out.assign(n, nullptr);
      fresh.promises.resize(n);
      fresh.present.assign(n, false);
      fresh.device.assign(n, -1);
      fresh.geometry = std::move(g);
      fresh.since = std::chrono::steady_clock::now();
      rounds.push_back(std::move(fresh));
      it = std::prev(rounds.end());
    }
    it->in[pos] = static_cast<const char*>(x.untyped_data());
    it->out[pos] = static_cast<char*>(y->untyped_data());
    it->promises[pos] = promise;
    it->present[pos] = true;
    it->device[pos] = device;
    if (++it->arrived == n) {  // the first round not yet full: this one, the front
      full = std::make_shared<Round>(std::move(*it));
      rounds.erase(it);
      if (rounds.empty()) instance->rounds.erase(Key{run, group});
    }
  }
  if (full) Dispatch(std::move(full), static_cast<int>(std::max<int64_t>(threads, 1)));
  return future;
}

ffi::Future Exchange(Instance* instance, ffi::RunId run, int32_t device, ffi::AnyBuffer x,
                     ffi::Buffer<ffi::S32> where, ffi::Result<ffi::AnyBuffer> y, int64_t n,
                     int64_t split, int64_t gather, ffi::Span<const int64_t> order,
                     int64_t threads) {
  const auto shape = x.dimensions();
  const int rank = static_cast<int>(shape.size());
  if (rank < 1 || rank > kMaxRank || static_cast<int>(order.size()) != rank || n < 1 ||
      split < 0 || split >= rank || gather < 0 || gather >= rank ||
      where.element_count() != 2 || shape[split] % n) {
    return Failed("inconsistent attributes (internal error)");
  }
  Geometry g;
  int64_t pos = 0, group = 0;
  if (std::string why = Start(x, y, where, n, rank, g, pos, group); !why.empty())
    return Failed(why);
  int64_t out_shape[kMaxRank], out_stride[kMaxRank];
  g.src[rank - 1] = 1;
  for (int k = rank - 2; k >= 0; --k) g.src[k] = g.src[k + 1] * shape[k + 1];
  for (int k = 0; k < rank; ++k) g.dims[k] = shape[k];
  g.dims[split] = shape[split] / n;
  for (int k = 0; k < rank; ++k) {
    const int64_t ax = order[k];
    if (ax < 0 || ax >= rank) return Failed("inconsistent order (internal error)");
    out_shape[k] = ax == gather ? g.dims[ax] * n : g.dims[ax];
  }
  const auto y_shape = y->dimensions();
  for (int k = 0; k < rank; ++k)
    if (y_shape[k] != out_shape[k]) return Failed("inconsistent output shape (internal error)");
  out_stride[rank - 1] = 1;
  for (int k = rank - 2; k >= 0; --k) out_stride[k] = out_stride[k + 1] * out_shape[k + 1];
  for (int k = 0; k < rank; ++k) g.dst[order[k]] = out_stride[k];
  g.src_chunk = g.dims[split] * g.src[split];
  g.dst_peer = g.dims[gather] * g.dst[gather];

  return Arrive(instance, x, y, n, pos, group, std::move(g), threads, run.run_id, device);
}

// Several exchanges in one pass (`_exchange.local.reshard`): the devices of a group (those
// with the same coordinates on the mesh axes the exchanges leave alone) trade the boxes of
// their blocks that `table` names; `src_strides`/`dst_strides`: the blocks' strides of each
// global axis, the order `table`'s dims are in.
ffi::Future Reshard(Instance* instance, ffi::RunId run, int32_t device, ffi::AnyBuffer x,
                    ffi::Buffer<ffi::S32> where, ffi::Result<ffi::AnyBuffer> y, int64_t n,
                    ffi::Span<const int64_t> table,
                    ffi::Span<const int64_t> src_strides, ffi::Span<const int64_t> dst_strides,
                    int64_t threads) {
  const int rank = static_cast<int>(src_strides.size());
  if (rank < 1 || rank > kMaxRank || static_cast<int>(dst_strides.size()) != rank || n < 1 ||
      static_cast<int64_t>(table.size()) != n * n * (2 + rank) || where.element_count() != 2) {
    return Failed("inconsistent reshard attributes (internal error)");
  }
  Geometry g;
  int64_t pos = 0, group = 0;
  if (std::string why = Start(x, y, where, n, rank, g, pos, group); !why.empty())
    return Failed(why);
  const int64_t count = static_cast<int64_t>(x.size_bytes() / g.element);
  for (int64_t r = 0; r < n * n; ++r) {  // every box inside both blocks
    const int64_t* row = table.begin() + r * (2 + rank);
    int64_t last_src = row[0], last_dst = row[1];
    bool empty = false;
    for (int k = 0; k < rank; ++k) {
      if (row[2 + k] < 0) return Failed("negative box (internal error)");
      if (row[2 + k] == 0) empty = true;
      last_src += (row[2 + k] - 1) * src_strides[k];
      last_dst += (row[2 + k] - 1) * dst_strides[k];
    }
    if (!empty && (row[0] < 0 || row[1] < 0 || last_src >= count || last_dst >= count))
      return Failed("a box outside the block (internal error)");
  }
  for (int k = 0; k < rank; ++k) {
    g.src[k] = src_strides[k];
    g.dst[k] = dst_strides[k];
  }
  g.table.assign(table.begin(), table.end());
  return Arrive(instance, x, y, n, pos, group, std::move(g), threads, run.run_id, device);
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(PencilfftLocalInstantiate, Instantiate, ffi::Ffi::BindInstantiate());

XLA_FFI_DEFINE_HANDLER_SYMBOL(PencilfftLocalExchange, Exchange,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::State<Instance>>()
                                  .Ctx<ffi::RunId>()
                                  .Ctx<ffi::DeviceOrdinal>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<int64_t>("n")
                                  .Attr<int64_t>("split")
                                  .Attr<int64_t>("gather")
                                  .Attr<ffi::Span<const int64_t>>("order")
                                  .Attr<int64_t>("threads"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(PencilfftLocalReshard, Reshard,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::State<Instance>>()
                                  .Ctx<ffi::RunId>()
                                  .Ctx<ffi::DeviceOrdinal>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<int64_t>("n")
                                  .Attr<ffi::Span<const int64_t>>("table")
                                  .Attr<ffi::Span<const int64_t>>("src_strides")
                                  .Attr<ffi::Span<const int64_t>>("dst_strides")
                                  .Attr<int64_t>("threads"));

// For registering the state type with XLA (jax.ffi.register_ffi_type).
static void DeleteInstance(void* instance) { delete static_cast<Instance*>(instance); }
static XLA_FFI_TypeInfo instance_type_info = {XLA_FFI_TypeInfo_STRUCT_SIZE, nullptr,
                                              DeleteInstance};
extern "C" void* pencilfft_local_instance_type_id() { return &Instance::id; }
extern "C" void* pencilfft_local_instance_type_info() { return &instance_type_info; }
// How many processes the job has (`_exchange.local`, at every lowering: jax's count is fixed once
// its backend is up).
extern "C" void pencilfft_local_job(int processes) { job_processes.store(processes); }
