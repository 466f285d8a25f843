// pencilfft's exchange through MPI inside XLA (exchange="mpi", pencilfft/_mpi_exchange.py).
//
// Two XLA FFI handlers, on XLA's own buffers: PencilfftMpiExchange, the all-to-all of a
// chunk-major block (n, ...) between the n processes of one mesh axis (chunk j of the input
// goes to peer j, the chunk received from peer j lands in slot j of the output, the process's
// own chunk is copied across); PencilfftMpiShift, halo_exchange's neighbour sends (the whole
// buffer to the process `shift` positions further along the axis).  Built with the MPI compiler wrapper that mpi4py was
// built with, so it talks to the same MPI library in the same process.
//
// Ordering.  XLA:CPU runs thunks that do not depend on each other concurrently and in no fixed
// order (its thunk executor hands half of the ready ones to other threads), and a custom call
// gets no scheduling edge as XLA's own collectives do.  So two independent exchanges of one
// program (two transforms) may start in either order on different processes.  A blocking
// collective would then deadlock (rank 0 waits in A for rank 1, which waits in B for rank 0),
// and two exchanges on one communicator could be matched with each other.  Hence:
//   * every exchange is point-to-point (MPI_Isend/MPI_Irecv on MPI_COMM_WORLD, peers named by
//     their world ranks), with a tag of its own (`tag`, one per call site, given at lowering):
//     messages of different exchanges are never matched with each other;
//   * the handler is asynchronous: it posts its messages and returns an ffi::Future, which a
//     progress thread completes when MPI_Testall says they are done.  XLA's thread goes on
//     with any other ready thunk, another exchange included, so no order between independent
//     exchanges is needed and none can deadlock;
//   * no communicator is created (that would be a collective call, itself order-dependent).
// Exchanges that depend on each other (the steps of one transform, iterations of a loop)
// run one after the other on every process; messages of one tag between two processes are
// received in the order sent (MPI's non-overtaking rule).
#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

// One exchange in flight: its requests and the promise XLA waits on.
struct Pending {
  std::vector<MPI_Request> requests;
  ffi::Promise promise;
};

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

 private:
  void Run() {
    std::vector<Pending*> done;
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [this] { return !ops_.empty(); });
        for (auto it = ops_.begin(); it != ops_.end();) {
          int flag = 0;
          MPI_Testall(static_cast<int>((*it)->requests.size()), (*it)->requests.data(), &flag,
                      MPI_STATUSES_IGNORE);
          if (flag) {
            done.push_back(*it);
            it = ops_.erase(it);
          } else {
            ++it;
          }
        }
      }
      // Outside the lock: completing a promise may run the rest of XLA's program on this
      // thread, which may post the next exchange (Add).
      for (Pending* op : done) {
        op->promise.SetAvailable();
        delete op;
      }
      if (done.empty()) std::this_thread::yield();
      done.clear();
    }
  }

  std::mutex mutex_;
  std::condition_variable wake_;
  std::vector<Pending*> ops_;
  bool started_ = false;
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
                   int64_t* start, int64_t* pos) {
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
bool Post(Pending* op, bool receive, char* data, int64_t bytes, int rank, int64_t tag) {
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
  // Posted requests stay posted (MPI cannot take them back); the job ends anyway.
  delete op;
  return Failed("MPI_Isend/MPI_Irecv failed");
}

// The all-to-all.  x: (n, ...) chunk-major, chunk j for peer j; y: same shape, chunk j from
// peer j.
ffi::Future Exchange(ffi::AnyBuffer x, ffi::Buffer<ffi::S32> where, ffi::Result<ffi::AnyBuffer> y,
                     int64_t n, int64_t tag, ffi::Span<const int32_t> ranks) {
  int64_t start = 0, pos = 0;
  std::string why = Locate(where, n, ranks, &start, &pos);
  if (!why.empty()) return Failed(why);
  const int64_t bytes = static_cast<int64_t>(x.size_bytes());
  if (bytes % n || static_cast<int64_t>(y->size_bytes()) != bytes) {
    return Failed("inconsistent sizes (internal error)");
  }
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
    if (!Post(op, true, dst + peer * chunk, chunk, ranks[start + peer], tag)) {
      return PostFailed(op);
    }
  }
  for (int64_t s = 1; s < n; ++s) {
    const int64_t peer = (pos + s) % n;
    if (!Post(op, false, src + peer * chunk, chunk, ranks[start + peer], tag)) {
      return PostFailed(op);
    }
  }
  return Start(op);
}

// The shift (halo_exchange's neighbour sends, a ppermute by `shift` positions): y on the
// device at `pos` is x of the device at pos - shift; along a non-periodic axis the devices
// with no such neighbour get zeros (as ppermute gives them) and the last ones send nothing.
ffi::Future Shift(ffi::AnyBuffer x, ffi::Buffer<ffi::S32> where, ffi::Result<ffi::AnyBuffer> y,
                  int64_t n, int64_t shift, bool periodic, int64_t tag,
                  ffi::Span<const int32_t> ranks) {
  int64_t start = 0, pos = 0;
  std::string why = Locate(where, n, ranks, &start, &pos);
  if (!why.empty()) return Failed(why);
  const int64_t bytes = static_cast<int64_t>(x.size_bytes());
  if (static_cast<int64_t>(y->size_bytes()) != bytes) {
    return Failed("inconsistent sizes (internal error)");
  }
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
  if ((receives && !Post(op, true, dst, bytes, ranks[start + from_pos], tag)) ||
      (sends && !Post(op, false, src, bytes, ranks[start + to_pos], tag))) {
    return PostFailed(op);
  }
  if (op->requests.empty()) {
    delete op;
    return Done();
  }
  return Start(op);
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(PencilfftMpiExchange, Exchange,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<int64_t>("n")
                                  .Attr<int64_t>("tag")
                                  .Attr<ffi::Span<const int32_t>>("ranks"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(PencilfftMpiShift, Shift,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<int64_t>("n")
                                  .Attr<int64_t>("shift")
                                  .Attr<bool>("periodic")
                                  .Attr<int64_t>("tag")
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
