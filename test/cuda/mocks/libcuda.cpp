// A stand-in libcuda.so.1 for testing lib/cuda/driver.ts where no GPU exists, built against cuda.h (so every
// function has the header's signature) and loaded by the real CudaContext through the project's FFI. It models
// the driver behaviour the host code depends on and a CPU run would otherwise hide:
//   - stream work is deferred: async copies, memsets, kernels and event records run only when the host waits
//     (cuStreamSynchronize, cuEventSynchronize), so a staging region reused too early or a download read before
//     its copy completes gives wrong bytes;
//   - async host copies must use pinned memory (cuMemHostAlloc), as real asynchrony requires;
//   - every call after setup needs the primary context current on the calling thread;
//   - CUdevice handles come from cuDeviceGet (deliberately not equal to the ordinal);
//   - dynamic shared memory above 48 KiB needs cuFuncSetAttribute first;
//   - cuMemFree with queued stream work, and releasing the context with anything still allocated, are recorded;
//   - stream capture: between cuStreamBeginCapture and cuStreamEndCapture the stream's work is recorded into a graph
//     (kernel arguments by value, as the driver copies them) and runs only when a graph made from it is launched and
//     the host waits; a wait on the capturing stream fails and invalidates the capture, and a host copy, a cuMemFree
//     or (outside relaxed mode) a cuMemAlloc during capture is recorded as a violation.
// Device memory is host memory. One kernel exists: fill_f32(float* out, float value, long long n).
// mock_report() returns what was recorded as JSON; MOCK_CUDA_MEMORY_LIMIT caps device bytes (to force OOM).
#include <cuda.h>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace {
constexpr CUdevice kDevice = 7;
CUcontext const kContext = reinterpret_cast<CUcontext>(0xc0);
thread_local CUcontext current = nullptr;
bool initialized = false;
int retains = 0;
using Work = std::vector<std::function<void()>>;
Work queue;  // the one stream's pending work
// Stream capture of the one stream: the work recorded so far, whether a failed call invalidated it, its mode.
bool capturing = false, captureInvalidated = false;
CUstreamCaptureMode captureMode = CU_STREAM_CAPTURE_MODE_GLOBAL;
Work captured;
std::map<CUgraph, Work> graphs;
std::map<CUgraphExec, Work> executables;
std::map<CUdeviceptr, size_t> deviceBlocks;
size_t deviceBytes = 0;
std::map<uintptr_t, size_t> pinnedBlocks;
std::set<CUstream> streams;
std::set<CUmodule> modules;
std::map<CUfunction, int> sharedLimit;
std::map<CUevent, long> eventTimes;  // -1 while the record is queued
long clock = 0;
std::vector<std::string> violations;
std::string report;
int launches = 0;
int graphLaunches = 0;

void violation(const std::string& what) { violations.push_back(what); }

CUresult needContext(const char* what) {
  if (current != kContext || retains == 0) {
    violation(std::string(what) + " without the primary context current");
    return CUDA_ERROR_INVALID_CONTEXT;
  }
  return CUDA_SUCCESS;
}

void drain() {
  for (auto& work : queue) work();
  queue.clear();
}

// Where the stream's next operation goes: into the graph being captured, or the queue.
void enqueue(std::function<void()> work) { (capturing ? captured : queue).push_back(std::move(work)); }

// A call that must not happen during capture: recorded, and (like the driver) it invalidates the capture.
CUresult refuseDuringCapture(const char* what) {
  violation(std::string(what) + " during stream capture");
  captureInvalidated = true;
  return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
}

bool pinned(const void* address, size_t bytes) {
  const auto at = reinterpret_cast<uintptr_t>(address);
  for (const auto& [start, size] : pinnedBlocks) if (at >= start && at + bytes <= start + size) return true;
  return false;
}

std::string quoted(const std::string& text) {
  std::string out = "\"";
  for (char c : text) out += (c == '"' || c == '\\') ? std::string("\\") + c : std::string(1, c);
  return out + "\"";
}
}  // namespace

extern "C" {

CUresult cuInit(unsigned int flags) {
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  initialized = true;
  return CUDA_SUCCESS;
}
CUresult cuDriverGetVersion(int* version) { *version = 13000; return CUDA_SUCCESS; }
CUresult cuDeviceGetCount(int* count) { *count = initialized ? 1 : 0; return initialized ? CUDA_SUCCESS : CUDA_ERROR_NOT_INITIALIZED; }
CUresult cuDeviceGet(CUdevice* device, int ordinal) {
  if (ordinal != 0) return CUDA_ERROR_INVALID_DEVICE;
  *device = kDevice;
  return CUDA_SUCCESS;
}
CUresult cuDeviceGetName(char* name, int length, CUdevice device) {
  if (device != kDevice) { violation("cuDeviceGetName given an ordinal, not a CUdevice"); return CUDA_ERROR_INVALID_DEVICE; }
  std::strncpy(name, "Mock GPU", length);
  return CUDA_SUCCESS;
}
CUresult cuDeviceGetAttribute(int* value, CUdevice_attribute attribute, CUdevice device) {
  if (device != kDevice) { violation("cuDeviceGetAttribute given an ordinal, not a CUdevice"); return CUDA_ERROR_INVALID_DEVICE; }
  switch (attribute) {
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *value = 9; return CUDA_SUCCESS;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: *value = 0; return CUDA_SUCCESS;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: *value = 132; return CUDA_SUCCESS;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: *value = 232448; return CUDA_SUCCESS;
    default: return CUDA_ERROR_INVALID_VALUE;
  }
}
CUresult cuDeviceTotalMem_v2(size_t* bytes, CUdevice device) {
  if (device != kDevice) { violation("cuDeviceTotalMem given an ordinal, not a CUdevice"); return CUDA_ERROR_INVALID_DEVICE; }
  *bytes = size_t(80) << 30;
  return CUDA_SUCCESS;
}
CUresult cuDevicePrimaryCtxRetain(CUcontext* context, CUdevice device) {
  if (device != kDevice) { violation("cuDevicePrimaryCtxRetain given an ordinal, not a CUdevice"); return CUDA_ERROR_INVALID_DEVICE; }
  retains++;
  *context = kContext;
  return CUDA_SUCCESS;
}
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice device) {
  if (device != kDevice) { violation("cuDevicePrimaryCtxRelease given an ordinal, not a CUdevice"); return CUDA_ERROR_INVALID_DEVICE; }
  if (!deviceBlocks.empty() || !pinnedBlocks.empty() || !streams.empty() || !modules.empty() || !queue.empty() ||
      !graphs.empty() || !executables.empty()) {
    violation("context released with " + std::to_string(deviceBlocks.size()) + " device blocks, " +
              std::to_string(pinnedBlocks.size()) + " pinned blocks, " + std::to_string(streams.size()) + " streams, " +
              std::to_string(modules.size()) + " modules, " + std::to_string(queue.size()) + " queued operations, " +
              std::to_string(graphs.size() + executables.size()) + " graphs");
  }
  retains--;
  return CUDA_SUCCESS;
}
CUresult cuCtxSetCurrent(CUcontext context) { current = context; return CUDA_SUCCESS; }

CUresult cuMemGetInfo_v2(size_t* free, size_t* total) {
  if (CUresult r = needContext("cuMemGetInfo")) return r;
  *total = size_t(80) << 30;
  *free = *total - deviceBytes;
  return CUDA_SUCCESS;
}
CUresult cuStreamCreate(CUstream* stream, unsigned int flags) {
  if (CUresult r = needContext("cuStreamCreate")) return r;
  if (flags != CU_STREAM_NON_BLOCKING) violation("stream created without CU_STREAM_NON_BLOCKING");
  *stream = reinterpret_cast<CUstream>(new char);
  streams.insert(*stream);
  return CUDA_SUCCESS;
}
CUresult cuStreamDestroy_v2(CUstream stream) {
  if (CUresult r = needContext("cuStreamDestroy")) return r;
  if (!streams.erase(stream)) return CUDA_ERROR_INVALID_HANDLE;
  drain();
  delete reinterpret_cast<char*>(stream);
  return CUDA_SUCCESS;
}
CUresult cuStreamSynchronize(CUstream stream) {
  if (CUresult r = needContext("cuStreamSynchronize")) return r;
  if (!streams.count(stream)) return CUDA_ERROR_INVALID_HANDLE;
  if (capturing) return refuseDuringCapture("cuStreamSynchronize");
  drain();
  return CUDA_SUCCESS;
}
CUresult cuEventCreate(CUevent* event, unsigned int flags) {
  if (CUresult r = needContext("cuEventCreate")) return r;
  if (flags != CU_EVENT_DEFAULT) violation("event created without timing");
  *event = reinterpret_cast<CUevent>(new char);
  eventTimes[*event] = -1;
  return CUDA_SUCCESS;
}
CUresult cuEventRecord(CUevent event, CUstream stream) {
  if (CUresult r = needContext("cuEventRecord")) return r;
  if (!eventTimes.count(event) || !streams.count(stream)) return CUDA_ERROR_INVALID_HANDLE;
  eventTimes[event] = -1;
  enqueue([event] { eventTimes[event] = ++clock; });
  return CUDA_SUCCESS;
}
CUresult cuEventSynchronize(CUevent event) {
  if (CUresult r = needContext("cuEventSynchronize")) return r;
  if (!eventTimes.count(event)) return CUDA_ERROR_INVALID_HANDLE;
  drain();
  return CUDA_SUCCESS;
}
CUresult cuEventElapsedTime_v2(float* ms, CUevent start, CUevent end) {
  if (CUresult r = needContext("cuEventElapsedTime")) return r;
  if (!eventTimes.count(start) || !eventTimes.count(end)) return CUDA_ERROR_INVALID_HANDLE;
  if (eventTimes[start] < 0 || eventTimes[end] < 0) return CUDA_ERROR_NOT_READY;
  *ms = 0.5f * float(eventTimes[end] - eventTimes[start]);  // half a millisecond per event recorded since start
  return CUDA_SUCCESS;
}
CUresult cuEventDestroy_v2(CUevent event) {
  if (CUresult r = needContext("cuEventDestroy")) return r;
  if (!eventTimes.erase(event)) return CUDA_ERROR_INVALID_HANDLE;
  delete reinterpret_cast<char*>(event);
  return CUDA_SUCCESS;
}

CUresult cuMemAlloc_v2(CUdeviceptr* address, size_t bytes) {
  if (CUresult r = needContext("cuMemAlloc")) return r;
  const char* limit = std::getenv("MOCK_CUDA_MEMORY_LIMIT");
  if (capturing && captureMode != CU_STREAM_CAPTURE_MODE_RELAXED) return refuseDuringCapture("cuMemAlloc outside relaxed capture mode");
  if (limit && deviceBytes + bytes > std::strtoull(limit, nullptr, 10)) return CUDA_ERROR_OUT_OF_MEMORY;
  void* block = std::malloc(bytes);
  *address = reinterpret_cast<CUdeviceptr>(block);
  deviceBlocks[*address] = bytes;
  deviceBytes += bytes;
  return CUDA_SUCCESS;
}
CUresult cuMemFree_v2(CUdeviceptr address) {
  if (CUresult r = needContext("cuMemFree")) return r;
  auto block = deviceBlocks.find(address);
  if (block == deviceBlocks.end()) return CUDA_ERROR_INVALID_VALUE;
  if (capturing) return refuseDuringCapture("cuMemFree");
  if (!queue.empty()) violation("cuMemFree with " + std::to_string(queue.size()) + " stream operations still queued");
  drain();
  deviceBytes -= block->second;
  deviceBlocks.erase(block);
  std::free(reinterpret_cast<void*>(address));
  return CUDA_SUCCESS;
}
CUresult cuMemHostAlloc(void** address, size_t bytes, unsigned int flags) {
  if (CUresult r = needContext("cuMemHostAlloc")) return r;
  (void)flags;
  *address = std::malloc(bytes);
  pinnedBlocks[reinterpret_cast<uintptr_t>(*address)] = bytes;
  return CUDA_SUCCESS;
}
CUresult cuMemFreeHost(void* address) {
  if (CUresult r = needContext("cuMemFreeHost")) return r;
  if (!pinnedBlocks.erase(reinterpret_cast<uintptr_t>(address))) return CUDA_ERROR_INVALID_VALUE;
  if (!queue.empty()) violation("cuMemFreeHost with stream operations still queued");
  std::free(address);
  return CUDA_SUCCESS;
}
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr destination, const void* source, size_t bytes, CUstream stream) {
  if (CUresult r = needContext("cuMemcpyHtoDAsync")) return r;
  if (!streams.count(stream)) return CUDA_ERROR_INVALID_HANDLE;
  if (!pinned(source, bytes)) { violation("cuMemcpyHtoDAsync from pageable memory"); return CUDA_ERROR_INVALID_VALUE; }
  if (capturing) violation("cuMemcpyHtoDAsync captured: the graph would read the staging memory at every replay");
  enqueue([=] { std::memcpy(reinterpret_cast<void*>(destination), source, bytes); });
  return CUDA_SUCCESS;
}
CUresult cuMemcpyDtoHAsync_v2(void* destination, CUdeviceptr source, size_t bytes, CUstream stream) {
  if (CUresult r = needContext("cuMemcpyDtoHAsync")) return r;
  if (!streams.count(stream)) return CUDA_ERROR_INVALID_HANDLE;
  if (!pinned(destination, bytes)) { violation("cuMemcpyDtoHAsync to pageable memory"); return CUDA_ERROR_INVALID_VALUE; }
  if (capturing) violation("cuMemcpyDtoHAsync captured: the graph would write the staging memory at every replay");
  enqueue([=] { std::memcpy(destination, reinterpret_cast<const void*>(source), bytes); });
  return CUDA_SUCCESS;
}
CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr destination, CUdeviceptr source, size_t bytes, CUstream stream) {
  if (CUresult r = needContext("cuMemcpyDtoDAsync")) return r;
  if (!streams.count(stream)) return CUDA_ERROR_INVALID_HANDLE;
  enqueue([=] { std::memmove(reinterpret_cast<void*>(destination), reinterpret_cast<const void*>(source), bytes); });
  return CUDA_SUCCESS;
}
CUresult cuMemsetD8Async(CUdeviceptr destination, unsigned char value, size_t bytes, CUstream stream) {
  if (CUresult r = needContext("cuMemsetD8Async")) return r;
  if (!streams.count(stream)) return CUDA_ERROR_INVALID_HANDLE;
  enqueue([=] { std::memset(reinterpret_cast<void*>(destination), value, bytes); });
  return CUDA_SUCCESS;
}

CUresult cuModuleLoadData(CUmodule* module, const void* image) {
  if (CUresult r = needContext("cuModuleLoadData")) return r;
  if (image == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *module = reinterpret_cast<CUmodule>(new char);
  modules.insert(*module);
  return CUDA_SUCCESS;
}
CUresult cuModuleUnload(CUmodule module) {
  if (CUresult r = needContext("cuModuleUnload")) return r;
  if (!modules.erase(module)) return CUDA_ERROR_INVALID_HANDLE;
  delete reinterpret_cast<char*>(module);
  return CUDA_SUCCESS;
}
CUresult cuModuleGetFunction(CUfunction* function, CUmodule module, const char* name) {
  if (CUresult r = needContext("cuModuleGetFunction")) return r;
  if (!modules.count(module) || std::strcmp(name, "fill_f32") != 0) return CUDA_ERROR_NOT_FOUND;
  static char fill;
  *function = reinterpret_cast<CUfunction>(&fill);
  return CUDA_SUCCESS;
}
CUresult cuFuncSetAttribute(CUfunction function, CUfunction_attribute attribute, int value) {
  if (CUresult r = needContext("cuFuncSetAttribute")) return r;
  if (attribute != CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES || value > 227 * 1024) return CUDA_ERROR_INVALID_VALUE;
  sharedLimit[function] = value;
  return CUDA_SUCCESS;
}
CUresult cuLaunchKernel(CUfunction function, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                        unsigned shared, CUstream stream, void** params, void** extra) {
  if (CUresult r = needContext("cuLaunchKernel")) return r;
  if (!streams.count(stream) || extra != nullptr || params == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (gx * gy * gz == 0 || bx * by * bz == 0 || bx * by * bz > 1024) return CUDA_ERROR_INVALID_VALUE;
  const int limit = sharedLimit.count(function) ? sharedLimit[function] : 48 * 1024;
  if (int(shared) > limit) { violation("launch with " + std::to_string(shared) + " bytes of shared memory above its limit"); return CUDA_ERROR_INVALID_VALUE; }
  // The driver copies the argument values now: the host may reuse the block as soon as this returns.
  float* out = *static_cast<float**>(params[0]);
  const float value = *static_cast<float*>(params[1]);
  const long long n = *static_cast<long long*>(params[2]);
  launches++;
  enqueue([=] { for (long long i = 0; i < n; i++) out[i] = value; });
  return CUDA_SUCCESS;
}

CUresult cuStreamBeginCapture_v2(CUstream stream, CUstreamCaptureMode mode) {
  if (CUresult r = needContext("cuStreamBeginCapture")) return r;
  if (!streams.count(stream)) return CUDA_ERROR_INVALID_HANDLE;
  if (capturing) return CUDA_ERROR_ILLEGAL_STATE;
  capturing = true;
  captureInvalidated = false;
  captureMode = mode;
  captured.clear();
  return CUDA_SUCCESS;
}
CUresult cuStreamEndCapture(CUstream stream, CUgraph* graph) {
  if (CUresult r = needContext("cuStreamEndCapture")) return r;
  if (!streams.count(stream)) return CUDA_ERROR_INVALID_HANDLE;
  if (!capturing) return CUDA_ERROR_ILLEGAL_STATE;
  capturing = false;
  if (captureInvalidated) {
    captured.clear();
    *graph = nullptr;
    return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
  }
  *graph = reinterpret_cast<CUgraph>(new char);
  graphs[*graph] = std::move(captured);
  captured.clear();
  return CUDA_SUCCESS;
}
CUresult cuGraphInstantiateWithFlags(CUgraphExec* executable, CUgraph graph, unsigned long long flags) {
  if (CUresult r = needContext("cuGraphInstantiate")) return r;
  if (!graphs.count(graph) || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  *executable = reinterpret_cast<CUgraphExec>(new char);
  executables[*executable] = graphs[graph];
  return CUDA_SUCCESS;
}
CUresult cuGraphDestroy(CUgraph graph) {
  if (CUresult r = needContext("cuGraphDestroy")) return r;
  if (!graphs.erase(graph)) return CUDA_ERROR_INVALID_VALUE;
  delete reinterpret_cast<char*>(graph);
  return CUDA_SUCCESS;
}
CUresult cuGraphLaunch(CUgraphExec executable, CUstream stream) {
  if (CUresult r = needContext("cuGraphLaunch")) return r;
  if (!executables.count(executable) || !streams.count(stream)) return CUDA_ERROR_INVALID_VALUE;
  for (const auto& work : executables[executable]) enqueue(work);
  graphLaunches++;
  return CUDA_SUCCESS;
}
CUresult cuGraphExecDestroy(CUgraphExec executable) {
  if (CUresult r = needContext("cuGraphExecDestroy")) return r;
  if (!executables.erase(executable)) return CUDA_ERROR_INVALID_VALUE;
  delete reinterpret_cast<char*>(executable);
  return CUDA_SUCCESS;
}

CUresult cuGetErrorName(CUresult error, const char** text) {
  switch (error) {
    case CUDA_SUCCESS: *text = "CUDA_SUCCESS"; return CUDA_SUCCESS;
    case CUDA_ERROR_INVALID_VALUE: *text = "CUDA_ERROR_INVALID_VALUE"; return CUDA_SUCCESS;
    case CUDA_ERROR_OUT_OF_MEMORY: *text = "CUDA_ERROR_OUT_OF_MEMORY"; return CUDA_SUCCESS;
    case CUDA_ERROR_INVALID_CONTEXT: *text = "CUDA_ERROR_INVALID_CONTEXT"; return CUDA_SUCCESS;
    case CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED: *text = "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED"; return CUDA_SUCCESS;
    case CUDA_ERROR_STREAM_CAPTURE_INVALIDATED: *text = "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED"; return CUDA_SUCCESS;
    default: *text = nullptr; return CUDA_ERROR_INVALID_VALUE;
  }
}
CUresult cuGetErrorString(CUresult error, const char** text) {
  switch (error) {
    case CUDA_ERROR_INVALID_VALUE: *text = "invalid argument"; return CUDA_SUCCESS;
    case CUDA_ERROR_OUT_OF_MEMORY: *text = "out of memory"; return CUDA_SUCCESS;
    case CUDA_ERROR_INVALID_CONTEXT: *text = "invalid device context"; return CUDA_SUCCESS;
    case CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED: *text = "operation not permitted when stream is capturing"; return CUDA_SUCCESS;
    case CUDA_ERROR_STREAM_CAPTURE_INVALIDATED: *text = "operation failed due to a previous error during capture"; return CUDA_SUCCESS;
    default: *text = nullptr; return CUDA_ERROR_INVALID_VALUE;
  }
}

const char* mock_report() {
  report = "{\"launches\": " + std::to_string(launches) + ", \"graphLaunches\": " + std::to_string(graphLaunches) + ", \"retains\": " + std::to_string(retains) + ", \"violations\": [";
  for (size_t i = 0; i < violations.size(); i++) report += (i ? ", " : "") + quoted(violations[i]);
  return (report += "]}").c_str();
}

}  // extern "C"
