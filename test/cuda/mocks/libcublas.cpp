// A stand-in for libcublas and libcublasLt (one file serves both paths) for testing lib/cuda/blas.ts where no GPU
// exists: the handle's life, the stream and workspace it is bound to (cublasSetStream resets the workspace, as
// cuBLAS documents), host-pointer alpha/beta, status names, and cublasGemmEx's
// 19 arguments in order, which it computes with the same column-major reference as the emulator
// (emulator/gemm-reference.h) on host memory. Its declarations are checked against the real headers by the ABI
// test through Blas's binding table, not here (no cuBLAS headers on this machine). MOCK_CUBLAS_FAIL_GEMM=1 makes
// cublasGemmEx report CUBLAS_STATUS_EXECUTION_FAILED; mock_cublas_report() returns what was recorded as JSON.
#include <cstddef>
#include <cstdlib>
#include <string>
#include <vector>
#include "../emulator/gemm-reference.h"

namespace {
struct Handle { void* stream = nullptr; void* workspace = nullptr; size_t workspaceBytes = 0; };
std::vector<std::string> violations;
int gemms = 0, live = 0;
void* lastStream = nullptr;
size_t lastWorkspaceBytes = 0;
std::string report;
constexpr int kSuccess = 0, kNotInitialized = 1, kInvalidValue = 7, kExecutionFailed = 13, kNotSupported = 15;
constexpr int kComputeF32 = 68, kComputeF32FastTf32 = 77, kGemmDefault = -1;
}  // namespace

extern "C" {

size_t cublasLtGetVersion() { return 130000; }

int cublasCreate_v2(Handle** handle) {
  *handle = new Handle;
  live++;
  return kSuccess;
}
int cublasDestroy_v2(Handle* handle) {
  if (handle == nullptr) return kNotInitialized;
  delete handle;
  live--;
  return kSuccess;
}
int cublasSetStream_v2(Handle* handle, void* stream) {
  if (handle == nullptr) return kNotInitialized;
  handle->stream = stream;
  handle->workspace = nullptr;
  handle->workspaceBytes = 0;
  return kSuccess;
}
int cublasSetWorkspace_v2(Handle* handle, void* workspace, size_t bytes) {
  if (handle == nullptr) return kNotInitialized;
  if (workspace == nullptr || bytes == 0) return kInvalidValue;
  handle->workspace = workspace;
  handle->workspaceBytes = bytes;
  return kSuccess;
}
const char* cublasGetStatusName(int status) {
  switch (status) {
    case kSuccess: return "CUBLAS_STATUS_SUCCESS";
    case kInvalidValue: return "CUBLAS_STATUS_INVALID_VALUE";
    case kExecutionFailed: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case kNotSupported: return "CUBLAS_STATUS_NOT_SUPPORTED";
    default: return "CUBLAS_STATUS_UNKNOWN";
  }
}
int cublasGemmEx(Handle* handle, int transa, int transb, int m, int n, int k, const void* alpha, const void* a, int a_type,
                 int lda, const void* b, int b_type, int ldb, const void* beta, void* c, int c_type, int ldc, int compute,
                 int algo) {
  if (handle == nullptr) return kNotInitialized;
  if (handle->stream == nullptr) violations.push_back("cublasGemmEx on the default stream (cublasSetStream not called)");
  if ((compute != kComputeF32 && compute != kComputeF32FastTf32) || algo != kGemmDefault) return kNotSupported;
  if (const char* fail = std::getenv("MOCK_CUBLAS_FAIL_GEMM"); fail && fail[0] == '1') return kExecutionFailed;
  lastStream = handle->stream;
  lastWorkspaceBytes = handle->workspaceBytes;
  gemms++;
  // Host pointer mode: alpha and beta are read during the call.
  const float alpha_value = *static_cast<const float*>(alpha), beta_value = *static_cast<const float*>(beta);
  const int status = reference_gemm_ex(transa, transb, m, n, k, alpha_value, a, a_type, lda, b, b_type, ldb, beta_value, c, c_type, ldc, compute);
  return status == 0 ? kSuccess : status == 1 ? kNotSupported : kInvalidValue;
}

const char* mock_cublas_report() {
  report = "{\"gemms\": " + std::to_string(gemms) + ", \"liveHandles\": " + std::to_string(live) + ", \"lastStream\": " +
           std::to_string(reinterpret_cast<unsigned long long>(lastStream)) + ", \"lastWorkspaceBytes\": " +
           std::to_string(lastWorkspaceBytes) + ", \"violations\": [";
  for (size_t i = 0; i < violations.size(); i++) report += (i ? ", \"" : "\"") + violations[i] + "\"";
  return (report += "]}").c_str();
}

}  // extern "C"
