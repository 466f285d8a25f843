// pencilfft's exchange through MPI inside XLA (exchange="mpi", pencilfft/_mpi_exchange.py).
//
// One XLA FFI handler, PencilfftMpiExchange: the all-to-all of a chunk-major block
// (n, ...) between the n processes of one mesh axis, on XLA's own buffers: chunk j of the
// input goes to peer j, the chunk received from peer j lands in slot j of the output, and the
// process's own chunk is copied across.  Built with the MPI compiler wrapper that mpi4py was
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

// x: (n, ...) chunk-major, chunk j for peer j; y: same shape, chunk j from peer j.
// ranks: the world ranks of the processes of every exchange group, n per group, in mesh order
// along the exchanged axis (every process reads its own group: the program is the same on all).
// where: (this device's coordinate along the axis, its group's row) from jax's axis_index,
// to check that the table (made where the mesh was traced) puts this process there.
ffi::Future Exchange(ffi::AnyBuffer x, ffi::Buffer<ffi::S32> where, ffi::Result<ffi::AnyBuffer> y,
                     int64_t n, int64_t tag, ffi::Span<const int32_t> ranks) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized) return Failed("MPI is not running in this process");
  const int64_t bytes = static_cast<int64_t>(x.size_bytes());
  if (n <= 0 || bytes % n || static_cast<int64_t>(y->size_bytes()) != bytes ||
      ranks.size() % n) {
    return Failed("inconsistent sizes (internal error)");
  }
  int me = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  if (where.element_count() != 2) return Failed("bad coordinates (internal error)");
  const int64_t pos = where.typed_data()[0], group = where.typed_data()[1];
  const int64_t start = group * n;
  if (pos < 0 || pos >= n || group < 0 || start + n > static_cast<int64_t>(ranks.size()) ||
      ranks[start + pos] != me) {
    return Failed("MPI rank " + std::to_string(me) + " is not where the mesh puts its device "
                  "(the devices of an abstract mesh were guessed wrong: pass `mesh=` or call "
                  "the transform under jax.set_mesh(mesh))");
  }
  const int64_t chunk = bytes / n;
  const char* src = static_cast<const char*>(x.untyped_data());
  char* dst = static_cast<char*>(y->untyped_data());
  std::memcpy(dst + pos * chunk, src + pos * chunk, chunk);  // one's own chunk stays
  if (n == 1) {
    ffi::Promise promise;
    promise.SetAvailable();
    return ffi::Future(promise);
  }
  auto* op = new Pending();
  op->requests.reserve(2 * (n - 1) * (chunk / kPiece + 1));
  // Receives first, then sends, each peer starting from the next one up (a ring order, so
  // that not every process sends to peer 0 first).
  for (int pass = 0; pass < 2; ++pass) {
    for (int64_t s = 1; s < n; ++s) {
      const int64_t peer = pass == 0 ? (pos - s + n) % n : (pos + s) % n;
      const int rank = ranks[start + peer];
      for (int64_t off = 0; off < chunk; off += kPiece) {
        const int count = static_cast<int>(std::min(kPiece, chunk - off));
        MPI_Request request;
        int err = pass == 0
            ? MPI_Irecv(dst + peer * chunk + off, count, MPI_BYTE, rank, static_cast<int>(tag),
                        MPI_COMM_WORLD, &request)
            : MPI_Isend(src + peer * chunk + off, count, MPI_BYTE, rank, static_cast<int>(tag),
                        MPI_COMM_WORLD, &request);
        if (err != MPI_SUCCESS) {
          // Posted requests stay posted (MPI cannot take them back); the job ends anyway.
          delete op;
          return Failed("MPI_Isend/MPI_Irecv failed with error " + std::to_string(err));
        }
        op->requests.push_back(request);
      }
    }
  }
  ffi::Future future(op->promise);
  progress().Add(op);
  return future;
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
