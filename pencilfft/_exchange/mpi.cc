// pencilfft's exchange through MPI inside XLA (exchange="mpi", pencilfft/_mpi_exchange.py).
//
// Three XLA FFI handlers, on XLA's own buffers: PencilfftMpiExchange, the all-to-all of a
// chunk-major block (n, ...) between the n processes of one mesh axis (chunk j of the input
// goes to peer j, the chunk received from peer j lands in slot j of the output, the process's
// own chunk is copied across); PencilfftMpiShift, halo_exchange's neighbour sends (the whole
// buffer to the process `shift` positions further along the axis); PencilfftMpiAllReduce,
// power_spectrum's sum over the processes of an axis.  Built with the MPI compiler wrapper
// that mpi4py was built with, so it talks to the same MPI library in the same process.
//
// Ordering.  XLA:CPU runs thunks that do not depend on each other concurrently and in no fixed
// order (its thunk executor hands half of the ready ones to other threads), and a custom call
// gets no scheduling edge as XLA's own collectives do.  So two independent exchanges of one
// program (two transforms) may start in either order on different processes.  A blocking
// collective would then deadlock (rank 0 waits in A for rank 1, which waits in B for rank 0),
// and two exchanges on one communicator could be matched with each other.  Hence:
//   * every exchange is point-to-point (MPI_Isend/MPI_Irecv on MPI_COMM_WORLD, peers named by
//     their world ranks), with an MPI tag of its own: messages of different exchanges are never
//     matched with each other;
//   * the tag belongs to the call in the compiled program (XLA's thunk), not to the lowered
//     call site: jax lowers a jitted function once and calls it at every use, so two uses of
//     one user function in one program carry the same attributes.  XLA makes one thunk per call
//     in the compiled program (calls are inlined) and runs the FFI instantiate stage once for
//     each, at compile time, in program order: `Instantiate` numbers the thunks of each `key`
//     (a hash of the call's shapes, peers and kind, the same on every process) in that order
//     and derives the tag from (key, number).  Every process compiles the same program the
//     same way, so the numbers agree; they are counted per key over the process's life, so
//     every process must compile the same programs holding that exchange in the same order,
//     as SPMD code does;
//   * the handler is asynchronous: it posts its messages and returns an ffi::Future, which a
//     progress thread completes when MPI_Testall says they are done.  XLA's thread goes on
//     with any other ready thunk, another exchange included, so no order between independent
//     exchanges is needed and none can deadlock;
//   * no communicator is created (that would be a collective call, itself order-dependent).
// Exchanges that depend on each other (the steps of one transform, iterations of a loop)
// run one after the other on every process; messages of one tag between two processes are
// received in the order sent (MPI's non-overtaking rule).
//
// Pipelined stages (issue 66).  PencilfftMpiExchangeStart posts the all-to-all of one piece and
// returns at once with a token; PencilfftMpiExchangeWait, given the token, the block that was
// sent and the buffer being received into, completes when the messages are in.  The program puts
// the next piece's FFT between the two calls, and the progress thread moves this piece's
// messages meanwhile: the overlap does not depend on XLA running thunks concurrently.  Both
// buffers stay XLA's, alive until the wait (it takes them as operands; its result aliases the
// received one), and the wait checks that they are where the start left them: a copy by XLA of
// a buffer in flight would be an error, never wrong data.  The start receives into a buffer the
// program hands it (aliased), so that a loop of pieces reuses its buffers.  The progress thread
// tests such an exchange every PENCILFFT_MPI_POLL_US microseconds (200) while the program
// computes, and spins only once the program waits for it (`Pending::awaited`): on a node of
// one core a spinning thread would take half of it from the FFT.
#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

// The MPI tag of one call in a compiled program (see "Ordering" above): FFI state made at
// XLA's instantiate stage, once per thunk.
struct Instance {
  static ffi::TypeId id;  // given by XLA when Python registers the type
  int64_t key = 0, number = 0;
  int tag = -1;  // the first of the call's tags; -1: MPI was not running at compile time
  int64_t n = 1;  // devices per group: a message's tag is the pair's (`Tag`)
};
ffi::TypeId Instance::id = {};

// The tag of the messages from the device at `from` to the device at `to` of group `group`:
// one per pair, since a process may hold several devices of a group (exchange="mixed") and
// MPI matches messages by (source rank, tag) only.
int Tag(const Instance* instance, int64_t group, int64_t from, int64_t to) {
  return static_cast<int>(instance->tag + (group * instance->n + from) * instance->n + to);
}

// First tag of ours: above pencilfft's scatter/gather tag (0x5046) and the small tags user
// code usually sends with.
constexpr int64_t kTagBase = 0x6000;

std::mutex instances_mutex;
std::map<int64_t, int64_t> instances_made;         // key -> thunks numbered so far
std::vector<Instance> instances_log;               // every one, for the tests

ffi::ErrorOr<std::unique_ptr<Instance>> Instantiate(ffi::Dictionary attrs) {
  ffi::ErrorOr<int64_t> key = attrs.get<int64_t>("key");
  if (!key.has_value()) return ffi::Unexpected(key.error());
  ffi::ErrorOr<int64_t> n = attrs.get<int64_t>("n");
  if (!n.has_value()) return ffi::Unexpected(n.error());
  ffi::ErrorOr<ffi::Span<const int32_t>> ranks = attrs.get<ffi::Span<const int32_t>>("ranks");
  if (!ranks.has_value()) return ffi::Unexpected(ranks.error());
  auto instance = std::make_unique<Instance>();
  instance->key = *key;
  instance->n = std::max<int64_t>(*n, 1);
  // Every (group, from, to) pair of the call has a tag of its own: `pairs` consecutive tags.
  const int64_t pairs =
      std::max<int64_t>(static_cast<int64_t>(ranks->size()), 1) * instance->n;
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  int64_t upper = 32767;  // the least MPI_TAG_UB the standard allows
  if (initialized && !finalized) {
    int* value = nullptr;
    int flag = 0;
    MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &value, &flag);
    if (flag && value) upper = *value;
  }
  std::lock_guard<std::mutex> lock(instances_mutex);
  instance->number = instances_made[*key]++;
  if (initialized && !finalized && upper - kTagBase + 1 >= pairs) {
    // (key, number) spread over the blocks of `pairs` tags we may use: distinct calls that are
    // in flight at once between two processes get distinct tags unless the hash collides (1 in
    // ~5e8 / pairs with the mpich wheel's MPI_TAG_UB, 2^29 - 1; an MPI with a smaller bound
    // has fewer tags).
    const uint64_t blocks = static_cast<uint64_t>((upper - kTagBase + 1) / pairs);
    const uint64_t mixed = static_cast<uint64_t>(instance->key) +
                           static_cast<uint64_t>(instance->number) * 0x9E3779B97F4A7C15ull;
    instance->tag = static_cast<int>(kTagBase + static_cast<int64_t>(mixed % blocks) * pairs);
  }
  instances_log.push_back(*instance);
  return instance;
}

// One exchange in flight: its requests, the promise XLA waits on, and what to do once the
// messages are in (the reduction's sum) with the buffer they came into.
struct Pending {
  std::vector<MPI_Request> requests;
  ffi::Promise promise;
  std::vector<char> scratch;
  std::function<void()> finish;
  // Whether XLA's thread is waiting on it: from the start for a blocking exchange (XLA awaits
  // its future at once), only from the wait on for a pipelined one (set by ExchangeWait).
  std::shared_ptr<std::atomic<bool>> awaited = std::make_shared<std::atomic<bool>>(true);
};

// How long the progress thread sleeps between two tests of messages nobody waits on yet (a
// pipelined exchange while the next piece's FFT runs), in microseconds:
// PENCILFFT_MPI_POLL_US, default 200.  MPI over TCP moves bytes only inside MPI calls, but a
// test every 200 us keeps the socket buffers (megabytes) full at several Gbit/s; spinning
// instead takes half of a core the FFT needs where the process has one.  While XLA waits on
// an exchange the thread spins (yielding): then nothing else needs the core.
std::atomic<int64_t>& PollMicroseconds() {
  static std::atomic<int64_t> us{[] {
    const char* text = std::getenv("PENCILFFT_MPI_POLL_US");
    char* end = nullptr;
    long v = text ? std::strtol(text, &end, 10) : 200;
    if (text && (end == text || *end || v < 0)) v = 200;
    return static_cast<int64_t>(std::min(v, 100000L));
  }()};
  return us;
}

std::chrono::microseconds PollInterval() {
  return std::chrono::microseconds(PollMicroseconds().load());
}

// The progress thread: tests the requests of every exchange in flight and completes their
// promises.  MPI needs MPI_THREAD_MULTIPLE for this (mpi4py asks for it by default;
// `pencilfft._mpi_exchange` checks).
class Progress {
 public:
  void Add(Pending* op) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      ops_.push_back(op);
      if (!started_) {
        started_ = true;
        std::thread([this] { Run(); }).detach();  // lives as long as the process
      }
    }
    wake_.notify_one();
  }

  // XLA has started waiting on an exchange in flight: test at once, and spin until it is in.
  void Hurry() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      hurry_ = true;
    }
    wake_.notify_one();
  }

 private:
  void Run() {
    std::vector<Pending*> done;
    for (;;) {
      bool awaited = false;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [this] { return !ops_.empty(); });
        hurry_ = false;
        for (auto it = ops_.begin(); it != ops_.end();) {
          int flag = 0;
          MPI_Testall(static_cast<int>((*it)->requests.size()), (*it)->requests.data(), &flag,
                      MPI_STATUSES_IGNORE);
          if (flag) {
            done.push_back(*it);
            it = ops_.erase(it);
          } else {
            awaited = awaited || (*it)->awaited->load();
            ++it;
          }
        }
      }
      // Outside the lock, each on a thread of its own: completing a promise runs the rest of
      // that device's program on the completing thread, and that rest may block (in one of
      // XLA's own collectives, waiting for the process's other devices, whose exchanges this
      // thread must go on completing).
      for (Pending* op : done) {
        std::thread([op] {
          if (op->finish) op->finish();
          op->promise.SetAvailable();
          delete op;
        }).detach();
      }
      if (done.empty()) {
        if (awaited) {
          std::this_thread::yield();
        } else {
          std::unique_lock<std::mutex> lock(mutex_);
          wake_.wait_for(lock, PollInterval(), [this] { return hurry_; });
        }
      }
      done.clear();
    }
  }

  std::mutex mutex_;
  std::condition_variable wake_;
  std::vector<Pending*> ops_;
  bool started_ = false;
  bool hurry_ = false;
};

Progress& progress() {
  static Progress* p = new Progress();  // never destroyed: its thread is detached
  return *p;
}

ffi::Future Failed(std::string message) {
  ffi::Promise promise;
  promise.SetError(ffi::Error(ffi::ErrorCode::kInternal, "pencilfft MPI exchange: " + message));
  return ffi::Future(promise);
}

// Messages larger than this are cut into pieces (MPI counts are ints).
constexpr int64_t kPiece = int64_t{1} << 30;

ffi::Future Done() {
  ffi::Promise promise;
  promise.SetAvailable();
  return ffi::Future(promise);
}

// Where this process sits: `ranks` holds the world ranks of the processes of every group that
// exchanges together, n per group, in mesh order along the exchanged axis (every process reads
// its own group: the program is the same on all); `where` = (this device's coordinate along
// the axis, its group's row), from jax's axis_index.  Checks that the table (made where the
// mesh was traced) puts this process there; an error message if not.
std::string Locate(ffi::Buffer<ffi::S32>& where, int64_t n, ffi::Span<const int32_t> ranks,
                   int64_t* start, int64_t* pos, int64_t* group_out) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized) return "MPI is not running in this process";
  if (n <= 0 || ranks.size() % n || where.element_count() != 2) {
    return "inconsistent sizes (internal error)";
  }
  int me = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  *pos = where.typed_data()[0];
  const int64_t group = where.typed_data()[1];
  *group_out = group;
  *start = group * n;
  if (*pos < 0 || *pos >= n || group < 0 || *start + n > static_cast<int64_t>(ranks.size()) ||
      ranks[*start + *pos] != me) {
    return "MPI rank " + std::to_string(me) + " is not where the mesh puts its device (the "
           "devices of an abstract mesh were guessed wrong: pass `mesh=` or call the "
           "transform under jax.set_mesh(mesh))";
  }
  return "";
}

// Posts one message (in pieces of at most kPiece bytes: MPI counts are ints); false on error.
bool Post(Pending* op, bool receive, char* data, int64_t bytes, int rank, int tag) {
  for (int64_t off = 0; off < bytes; off += kPiece) {
    const int count = static_cast<int>(std::min(kPiece, bytes - off));
    MPI_Request request;
    int err = receive ? MPI_Irecv(data + off, count, MPI_BYTE, rank, static_cast<int>(tag),
                                  MPI_COMM_WORLD, &request)
                      : MPI_Isend(data + off, count, MPI_BYTE, rank, static_cast<int>(tag),
                                  MPI_COMM_WORLD, &request);
    if (err != MPI_SUCCESS) return false;
    op->requests.push_back(request);
  }
  return true;
}

// Hands the posted messages to the progress thread; XLA waits on the returned future.
ffi::Future Start(Pending* op) {
  ffi::Future future(op->promise);
  progress().Add(op);
  return future;
}

ffi::Future PostFailed(Pending* op) {
  // Posted requests stay posted (MPI cannot take them back) and may still write into the op's
  // scratch: it is left alone (leaked).  The job ends anyway.
  (void)op;
  return Failed("MPI_Isend/MPI_Irecv failed");
}

// The start of every call: where this process sits (`Locate`), the call's tag, and the sizes
// in bytes of x and y (equal; `chunks` must divide them).  An error message, or "".
std::string Begin(const Instance* instance, ffi::Buffer<ffi::S32>& where, int64_t n,
                  ffi::Span<const int32_t> ranks, size_t x_bytes, size_t y_bytes,
                  int64_t chunks, int64_t* start, int64_t* pos, int64_t* group) {
  std::string why = Locate(where, n, ranks, start, pos, group);
  if (!why.empty()) return why;
  if (instance->tag < 0) {
    return "MPI was not running when this program was compiled, or its tags are too few";
  }
  if (instance->n != n) return "inconsistent sizes (internal error)";
  const int64_t bytes = static_cast<int64_t>(x_bytes);
  if (bytes % chunks || static_cast<int64_t>(y_bytes) != bytes) {
    return "inconsistent sizes (internal error)";
  }
  return "";
}

// The all-to-all.  x: (n, ...) chunk-major, chunk j for peer j; y: same shape, chunk j from
// peer j.
ffi::Future Exchange(Instance* instance, ffi::AnyBuffer x, ffi::Buffer<ffi::S32> where,
                     ffi::Result<ffi::AnyBuffer> y, int64_t n, int64_t key,
                     ffi::Span<const int32_t> ranks) {
  int64_t start = 0, pos = 0, group = 0;
  std::string why = Begin(instance, where, n, ranks, x.size_bytes(), y->size_bytes(), n, &start,
                          &pos, &group);
  if (!why.empty()) return Failed(why);
  const int64_t bytes = static_cast<int64_t>(x.size_bytes());
  const int64_t chunk = bytes / n;
  char* src = static_cast<char*>(x.untyped_data());
  char* dst = static_cast<char*>(y->untyped_data());
  std::memcpy(dst + pos * chunk, src + pos * chunk, chunk);  // one's own chunk stays
  if (n == 1) return Done();
  auto* op = new Pending();
  op->requests.reserve(2 * (n - 1) * (chunk / kPiece + 1));
  // Receives first, then sends, each peer starting from the next one up (a ring order, so
  // that not every process sends to peer 0 first).
  for (int64_t s = 1; s < n; ++s) {
    const int64_t peer = (pos - s + n) % n;
    if (!Post(op, true, dst + peer * chunk, chunk, ranks[start + peer],
              Tag(instance, group, peer, pos))) {
      return PostFailed(op);
    }
  }
  for (int64_t s = 1; s < n; ++s) {
    const int64_t peer = (pos + s) % n;
    if (!Post(op, false, src + peer * chunk, chunk, ranks[start + peer],
              Tag(instance, group, pos, peer))) {
      return PostFailed(op);
    }
  }
  return Start(op);
}

// The shift (halo_exchange's neighbour sends, a ppermute by `shift` positions): y on the
// device at `pos` is x of the device at pos - shift; along a non-periodic axis the devices
// with no such neighbour get zeros (as ppermute gives them) and the last ones send nothing.
ffi::Future Shift(Instance* instance, ffi::AnyBuffer x, ffi::Buffer<ffi::S32> where,
                  ffi::Result<ffi::AnyBuffer> y, int64_t n, int64_t shift, bool periodic,
                  int64_t key, ffi::Span<const int32_t> ranks) {
  int64_t start = 0, pos = 0, group = 0;
  std::string why = Begin(instance, where, n, ranks, x.size_bytes(), y->size_bytes(), 1, &start,
                          &pos, &group);
  if (!why.empty()) return Failed(why);
  const int64_t bytes = static_cast<int64_t>(x.size_bytes());
  char* src = static_cast<char*>(x.untyped_data());
  char* dst = static_cast<char*>(y->untyped_data());
  const int64_t from = pos - shift, to = pos + shift;
  const bool receives = periodic || (from >= 0 && from < n);
  const bool sends = periodic || (to >= 0 && to < n);
  if (!receives) std::memset(dst, 0, bytes);
  const int64_t from_pos = ((from % n) + n) % n, to_pos = ((to % n) + n) % n;
  if (from_pos == pos) {  // onto itself (periodic, shift a multiple of n)
    std::memcpy(dst, src, bytes);
    return Done();
  }
  auto* op = new Pending();
  if ((receives && !Post(op, true, dst, bytes, ranks[start + from_pos],
                         Tag(instance, group, from_pos, pos))) ||
      (sends && !Post(op, false, src, bytes, ranks[start + to_pos],
                      Tag(instance, group, pos, to_pos)))) {
    return PostFailed(op);
  }
  if (op->requests.empty()) {
    delete op;
    return Done();
  }
  return Start(op);
}

// y = the sum of the blocks x (summed element by element, real numbers or the real and
// imaginary parts) of `n` blocks of `bytes` bytes laid side by side in `blocks`, in that order.
template <typename T>
void SumBlocks(const char* blocks, int64_t n, int64_t bytes, char* y) {
  const int64_t count = bytes / static_cast<int64_t>(sizeof(T));
  T* out = reinterpret_cast<T*>(y);
  const T* first = reinterpret_cast<const T*>(blocks);
  std::copy(first, first + count, out);
  for (int64_t j = 1; j < n; ++j) {
    const T* block = reinterpret_cast<const T*>(blocks + j * bytes);
    for (int64_t i = 0; i < count; ++i) out[i] += block[i];
  }
}

// The sum over the n processes of one group (power_spectrum's reduction, a psum of a few
// hundred numbers): every process sends its whole block to the others and adds the n blocks in
// the group's order, so that every process holds the same bits (jax takes the result to be
// replicated).
ffi::Future AllReduce(Instance* instance, ffi::AnyBuffer x, ffi::Buffer<ffi::S32> where,
                      ffi::Result<ffi::AnyBuffer> y, int64_t n, int64_t key,
                      ffi::Span<const int32_t> ranks) {
  int64_t start = 0, pos = 0, group = 0;
  std::string why = Begin(instance, where, n, ranks, x.size_bytes(), y->size_bytes(), 1, &start,
                          &pos, &group);
  if (!why.empty()) return Failed(why);
  const int64_t bytes = static_cast<int64_t>(x.size_bytes());
  void (*sum)(const char*, int64_t, int64_t, char*) = nullptr;
  switch (x.element_type()) {
    case ffi::DataType::F32:
    case ffi::DataType::C64:
      sum = SumBlocks<float>;
      break;
    case ffi::DataType::F64:
    case ffi::DataType::C128:
      sum = SumBlocks<double>;
      break;
    default:
      return Failed("the reduction sums float32/64 and complex64/128 only (internal error)");
  }
  auto* op = new Pending();
  op->scratch.resize(static_cast<size_t>(n * bytes));
  char* blocks = op->scratch.data();
  char* src = static_cast<char*>(x.untyped_data());
  std::memcpy(blocks + pos * bytes, src, bytes);
  char* dst = static_cast<char*>(y->untyped_data());
  op->finish = [sum, blocks, n, bytes, dst] { sum(blocks, n, bytes, dst); };
  for (int64_t s = 1; s < n; ++s) {
    const int64_t peer = (pos - s + n) % n;
    if (!Post(op, true, blocks + peer * bytes, bytes, ranks[start + peer],
              Tag(instance, group, peer, pos))) {
      return PostFailed(op);
    }
  }
  for (int64_t s = 1; s < n; ++s) {
    const int64_t peer = (pos + s) % n;
    if (!Post(op, false, src, bytes, ranks[start + peer], Tag(instance, group, pos, peer))) {
      return PostFailed(op);
    }
  }
  if (op->requests.empty()) {  // a group of one
    op->finish();
    delete op;
    return Done();
  }
  return Start(op);
}


// ---------------------------------------------------------------------------------------------
// The pipelined exchange: one piece's all-to-all started, the next piece's work, then the wait.

// One started exchange, from PencilfftMpiExchangeStart until its wait has returned.
struct Flight {
  std::mutex mutex;
  bool done = false;          // its messages are in (set by the progress thread's finish)
  bool waited = false;        // its wait came and found it not done: `promise` is awaited
  ffi::Promise promise;
  const void* send = nullptr;  // the buffers the messages use, checked by the wait
  void* recv = nullptr;
  std::shared_ptr<std::atomic<bool>> awaited;  // its Pending's: set when the wait comes
};

std::mutex flights_mutex;
std::map<int32_t, std::shared_ptr<Flight>> flights;  // token -> the exchange in flight
int32_t next_token = 1;

std::shared_ptr<Flight> TakeFlight(int32_t token) {
  std::lock_guard<std::mutex> lock(flights_mutex);
  auto it = flights.find(token);
  if (it == flights.end()) return nullptr;
  std::shared_ptr<Flight> flight = it->second;
  flights.erase(it);
  return flight;
}

// x: (n, ...) chunk-major, chunk j for peer j; sending: x itself (aliased), what the wait is
// given to keep it alive; into: a block of x's size whose buffer the program hands over (its
// values are not read); recv: `into`'s buffer (aliased), chunk j from peer j once the wait has
// returned; token: what the wait is given.  The pipelined stage hands over buffers it has
// finished with, so that a loop of pieces needs no new buffer and no copy into its carry.
ffi::Error ExchangeStart(Instance* instance, ffi::AnyBuffer x, ffi::Buffer<ffi::S32> where,
                         ffi::AnyBuffer into, ffi::Result<ffi::Buffer<ffi::S32>> token,
                         ffi::Result<ffi::AnyBuffer> sending, ffi::Result<ffi::AnyBuffer> recv,
                         int64_t n, int64_t key, ffi::Span<const int32_t> ranks) {
  int64_t start = 0, pos = 0, group = 0;
  std::string why = Begin(instance, where, n, ranks, x.size_bytes(), recv->size_bytes(), n,
                          &start, &pos, &group);
  if (!why.empty()) {
    return ffi::Error(ffi::ErrorCode::kInternal, "pencilfft MPI exchange: " + why);
  }
  if (token->element_count() != 1 || sending->untyped_data() != x.untyped_data() ||
      recv->untyped_data() != into.untyped_data()) {
    return ffi::Error(ffi::ErrorCode::kInternal,
                      "pencilfft MPI exchange: start's results (internal error)");
  }
  const int64_t chunk = static_cast<int64_t>(x.size_bytes()) / n;
  char* src = static_cast<char*>(x.untyped_data());
  char* dst = static_cast<char*>(recv->untyped_data());
  std::memcpy(dst + pos * chunk, src + pos * chunk, chunk);  // one's own chunk stays
  auto flight = std::make_shared<Flight>();
  flight->send = src;
  flight->recv = dst;
  int32_t id;
  {
    std::lock_guard<std::mutex> lock(flights_mutex);
    id = next_token;
    next_token = next_token == INT32_MAX ? 1 : next_token + 1;
    flights[id] = flight;
  }
  token->typed_data()[0] = id;
  if (n == 1) {
    flight->done = true;
    return ffi::Error::Success();
  }
  auto* op = new Pending();
  op->awaited->store(false);
  flight->awaited = op->awaited;
  op->requests.reserve(2 * (n - 1) * (chunk / kPiece + 1));
  op->finish = [flight] {
    std::lock_guard<std::mutex> lock(flight->mutex);
    flight->done = true;
    if (flight->waited) flight->promise.SetAvailable();
  };
  for (int64_t s = 1; s < n; ++s) {
    const int64_t peer = (pos - s + n) % n;
    if (!Post(op, true, dst + peer * chunk, chunk, ranks[start + peer],
              Tag(instance, group, peer, pos))) {
      return ffi::Error(ffi::ErrorCode::kInternal, "pencilfft MPI exchange: MPI_Irecv failed");
    }
  }
  for (int64_t s = 1; s < n; ++s) {
    const int64_t peer = (pos + s) % n;
    if (!Post(op, false, src + peer * chunk, chunk, ranks[start + peer],
              Tag(instance, group, pos, peer))) {
      return ffi::Error(ffi::ErrorCode::kInternal, "pencilfft MPI exchange: MPI_Isend failed");
    }
  }
  progress().Add(op);  // (its own promise is completed too, and awaited by nobody)
  return ffi::Error::Success();
}

// Completes when the exchange `token` started is in; `sent` and `recv` are the buffers it was
// started with (start's `sending` and `recv`; the result is `recv`, aliased).
ffi::Future ExchangeWait(ffi::Buffer<ffi::S32> token, ffi::AnyBuffer sent, ffi::AnyBuffer recv,
                         ffi::Result<ffi::AnyBuffer> y) {
  if (token.element_count() != 1) return Failed("token size (internal error)");
  std::shared_ptr<Flight> flight = TakeFlight(token.typed_data()[0]);
  if (!flight) return Failed("no exchange in flight for this token (internal error)");
  if (flight->send != sent.untyped_data() || flight->recv != recv.untyped_data() ||
      y->untyped_data() != recv.untyped_data()) {
    // XLA moved a buffer that MPI is still reading or writing: refuse, rather than hand on
    // what the copy caught.  (The messages still land in the old buffers, kept by `flight`'s
    // owner... which is nobody now: the job must end.)
    return Failed("a buffer of an exchange in flight was moved by the compiler (internal "
                  "error: pass pipeline=False, and report it)");
  }
  std::lock_guard<std::mutex> lock(flight->mutex);
  if (flight->done) return Done();
  flight->waited = true;
  ffi::Future future(flight->promise);
  // From now on the progress thread spins on it (nothing else needs the core).
  if (flight->awaited) flight->awaited->store(true);
  progress().Hurry();
  return future;
}

// `x` itself (the result aliases it), once the other operands exist: an order between work that
// shares no data, which XLA keeps (it drops optimization barriers before it schedules the CPU
// program, and would run the pipeline's steps in any order).
ffi::Error After(ffi::AnyBuffer x, ffi::RemainingArgs, ffi::Result<ffi::AnyBuffer> y) {
  if (y->untyped_data() != x.untyped_data()) {
    std::memcpy(y->untyped_data(), x.untyped_data(), x.size_bytes());
  }
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(PencilfftMpiInstantiate, Instantiate,
                              ffi::Ffi::BindInstantiate().Attrs<ffi::Dictionary>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(PencilfftMpiExchange, Exchange,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::State<Instance>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<int64_t>("n")
                                  .Attr<int64_t>("key")
                                  .Attr<ffi::Span<const int32_t>>("ranks"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(PencilfftMpiExchangeStart, ExchangeStart,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::State<Instance>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<int64_t>("n")
                                  .Attr<int64_t>("key")
                                  .Attr<ffi::Span<const int32_t>>("ranks"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(PencilfftMpiExchangeWait, ExchangeWait,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(PencilfftAfter, After,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .RemainingArgs()
                                  .Ret<ffi::AnyBuffer>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(PencilfftMpiShift, Shift,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::State<Instance>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<int64_t>("n")
                                  .Attr<int64_t>("shift")
                                  .Attr<bool>("periodic")
                                  .Attr<int64_t>("key")
                                  .Attr<ffi::Span<const int32_t>>("ranks"));

// For the Python side's check that MPI was started with threads allowed (the progress
// thread): 1 if so, 0 if not, -1 if MPI is not running (MPICH aborts on a query then).
extern "C" int pencilfft_mpi_thread_multiple() {
  int initialized = 0, finalized = 0, level = -1;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized) return -1;
  MPI_Query_thread(&level);
  return level == MPI_THREAD_MULTIPLE ? 1 : 0;
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(PencilfftMpiAllReduce, AllReduce,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::State<Instance>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<int64_t>("n")
                                  .Attr<int64_t>("key")
                                  .Attr<ffi::Span<const int32_t>>("ranks"));

// For registering the state type with XLA (jax.ffi.register_ffi_type).
static void DeleteInstance(void* instance) { delete static_cast<Instance*>(instance); }
static XLA_FFI_TypeInfo instance_type_info = {XLA_FFI_TypeInfo_STRUCT_SIZE, nullptr,
                                              DeleteInstance};
// Sets the progress thread's interval (microseconds, 0: spin) and returns the one before; a
// negative value only reads it (the benchmarks compare intervals in one job).
extern "C" int64_t pencilfft_mpi_poll_us(int64_t us) {
  if (us < 0) return PollMicroseconds().load();
  return PollMicroseconds().exchange(std::min<int64_t>(us, 100000));
}

extern "C" void* pencilfft_mpi_instance_type_id() { return &Instance::id; }
extern "C" void* pencilfft_mpi_instance_type_info() { return &instance_type_info; }

// For the tests: the (key, number, tag) of every call instantiated so far in this process,
// oldest first; copies at most `capacity` triples into `out` and returns how many there are.
extern "C" int64_t pencilfft_mpi_instances(int64_t* out, int64_t capacity) {
  std::lock_guard<std::mutex> lock(instances_mutex);
  const int64_t count = static_cast<int64_t>(instances_log.size());
  for (int64_t i = 0; i < count && i < capacity; ++i) {
    out[3 * i] = instances_log[i].key;
    out[3 * i + 1] = instances_log[i].number;
    out[3 * i + 2] = instances_log[i].tag;
  }
  return count;
}
