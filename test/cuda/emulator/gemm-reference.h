// cublasGemmEx's definition, column-major, for the emulator and the mock cuBLAS:
// C[i + j·ldc] = alpha · Σ_l op(A)[i, l] · op(B)[l, j] + beta · C, with op(X) = X (0, CUBLAS_OP_N) or Xᵀ
// (1, CUBLAS_OP_T), operands CUDA_R_32F (0) or CUDA_R_16BF (14), C CUDA_R_32F, f32 sums. beta == 0 does not read C,
// as in cuBLAS. Compute type CUBLAS_COMPUTE_32F (68) multiplies the operands as they are; CUBLAS_COMPUTE_32F_FAST_TF32
// (77) first rounds each f32 operand to TF32, as the tensor cores take it: 10 explicit mantissa bits, to nearest with
// ties away from zero (PTX's cvt.rna.tf32.f32; a bf16 operand has 7 and is unchanged). Returns 0, or 1 for an
// unsupported type or compute type, 2 for a leading dimension smaller than its matrix's rows.
#pragma once
#include <cstdint>
#include <cstring>

// f32 → TF32 as cvt.rna.tf32.f32: add half of the 13 dropped bits' weight to the magnitude, then drop them (a carry
// into the exponent is the correct rounding; infinities and NaNs keep their class).
inline float round_to_tf32(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, 4);
  if ((bits & 0x7f800000u) != 0x7f800000u) bits = (bits + 0x1000u) & ~0x1fffu;
  std::memcpy(&value, &bits, 4);
  return value;
}

inline int reference_gemm_ex(int transa, int transb, int m, int n, int k, float alpha, const void* a, int a_type, int lda,
                             const void* b, int b_type, int ldb, float beta, void* c, int c_type, int ldc, int compute) {
  if ((a_type != 0 && a_type != 14) || (b_type != 0 && b_type != 14) || c_type != 0 || (compute != 68 && compute != 77)) return 1;
  if (lda < (transa ? k : m) || ldb < (transb ? n : k) || ldc < m) return 2;
  const bool tf32 = compute == 77;
  auto load = [tf32](const void* base, int type, long long i) {
    if (type == 0) return tf32 ? round_to_tf32(static_cast<const float*>(base)[i]) : static_cast<const float*>(base)[i];
    const uint32_t bits = uint32_t(static_cast<const uint16_t*>(base)[i]) << 16;  // bf16 is f32's upper half
    float value;
    std::memcpy(&value, &bits, 4);
    return value;
  };
  float* result = static_cast<float*>(c);
  for (int j = 0; j < n; j++) for (int i = 0; i < m; i++) {
    float sum = 0.0f;
    for (int l = 0; l < k; l++) {
      const float op_a = load(a, a_type, transa ? l + (long long)i * lda : i + (long long)l * lda);
      const float op_b = load(b, b_type, transb ? j + (long long)l * ldb : l + (long long)j * ldb);
      sum += op_a * op_b;
    }
    float& cell = result[i + (long long)j * ldc];
    cell = alpha * sum + (beta == 0.0f ? 0.0f : beta * cell);
  }
  return 0;
}
