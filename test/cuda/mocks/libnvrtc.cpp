// A stand-in libnvrtc for testing lib/cuda/nvrtc.ts where NVRTC is absent. Like a worst-case NVRTC it keeps the
// caller's pointers from nvrtcCreateProgram and reads them only when compiling, so they must stay valid until then.
// "Compiling" checks the source's #include "..." lines resolve to the headers given by name and produces, as the
// cubin, a text that records what NVRTC was handed; a source containing #error fails with a log instead.
#include <cstddef>
#include <cstring>
#include <string>
#include <vector>

namespace {
struct Program {
  const char* source;
  const char* name;
  std::vector<const char*> headers, includeNames;
  std::string log, cubin;
};
constexpr int kSuccess = 0, kInvalidInput = 3, kInvalidProgram = 4, kCompilation = 6;
}  // namespace

extern "C" {

int nvrtcCreateProgram(Program** program, const char* source, const char* name, int count, const char* const* headers,
                       const char* const* includeNames) {
  if (source == nullptr || count < 0) return kInvalidInput;
  *program = new Program{source, name, {headers, headers + count}, {includeNames, includeNames + count}, "", ""};
  return kSuccess;
}

int nvrtcCompileProgram(Program* program, int count, const char* const* options) {
  if (program == nullptr) return kInvalidProgram;
  const std::string source = program->source;
  if (source.find("#error") != std::string::npos) {
    program->log = std::string(program->name) + "(1): error: #error directive in the source\n";
    return kCompilation;
  }
  std::string cubin = std::string(program->name) + "|";
  for (int i = 0; i < count; i++) cubin += std::string(options[i]) + (i + 1 < count ? " " : "|");
  for (size_t at = source.find("#include \""); at != std::string::npos; at = source.find("#include \"", at + 1)) {
    const std::string wanted = source.substr(at + 10, source.find('"', at + 10) - at - 10);
    size_t index = 0;
    while (index < program->includeNames.size() && wanted != program->includeNames[index]) index++;
    if (index == program->includeNames.size()) {
      program->log = std::string(program->name) + ": cannot open source file \"" + wanted + "\"\n";
      return kCompilation;
    }
    cubin += wanted + "=" + program->headers[index] + "|";
  }
  program->cubin = cubin + std::to_string(source.size());
  return kSuccess;
}

int nvrtcGetProgramLogSize(Program* program, size_t* size) { *size = program->log.size() + 1; return kSuccess; }
int nvrtcGetProgramLog(Program* program, char* log) { std::memcpy(log, program->log.c_str(), program->log.size() + 1); return kSuccess; }
int nvrtcGetCUBINSize(Program* program, size_t* size) { *size = program->cubin.size(); return program->cubin.empty() ? kInvalidProgram : kSuccess; }
int nvrtcGetCUBIN(Program* program, char* cubin) { std::memcpy(cubin, program->cubin.data(), program->cubin.size()); return kSuccess; }
int nvrtcDestroyProgram(Program** program) {
  delete *program;
  *program = nullptr;
  return kSuccess;
}
const char* nvrtcGetErrorString(int result) {
  switch (result) {
    case kSuccess: return "NVRTC_SUCCESS";
    case kInvalidProgram: return "NVRTC_ERROR_INVALID_PROGRAM";
    case kCompilation: return "NVRTC_ERROR_COMPILATION";
    default: return "NVRTC_ERROR_UNKNOWN";
  }
}

}  // extern "C"
