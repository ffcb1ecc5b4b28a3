// The ABI check of the FFI bindings: for every symbol lib/cuda binds, a generated C++ translation unit includes the
// library's own headers and asserts at compile time (template deduction over decltype(&symbol)) that the argument
// count, every argument's size and register class, and the result's size equal what the FFI declares; that the
// name bound is the one the headers resolve to (cuda.h maps cuMemAlloc to cuMemAlloc_v2: binding the old name
// links the legacy ABI silently); and that every enumerator value used equals the header's. Separately, every
// bound name must be exported by the library on disk. Nothing here runs the libraries.
import { execFileSync } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { NativeSignature, NativeType } from "../../lib/core/ffi.ts";

/** One library's bindings: the tables lib/cuda opens it with, and the headers that declare them. */
export interface BindingGroup {
  name: string;
  headers: readonly string[];
  tables: ReadonlyArray<Readonly<Record<string, NativeSignature>>>;
  constants: Readonly<Record<string, number>>;
}

/** How a value travels on x86-64 / aarch64: its size and whether it goes in an integer or a floating register. */
const slots: Record<NativeType, { size: number; kind: "Void" | "Integer" | "Floating" }> = {
  void: { size: 0, kind: "Void" }, u8: { size: 1, kind: "Integer" }, i32: { size: 4, kind: "Integer" },
  u32: { size: 4, kind: "Integer" }, i64: { size: 8, kind: "Integer" }, u64: { size: 8, kind: "Integer" },
  f32: { size: 4, kind: "Floating" }, f64: { size: 8, kind: "Floating" }, pointer: { size: 8, kind: "Integer" },
  buffer: { size: 8, kind: "Integer" },
};

// The headers are read as a C compiler reads them, since the FFI calls the C API: with __cplusplus undefined, C++-only
// overloads (cublas_api.h wraps cublasGemmEx for callers passing the old cudaDataType) cannot make &symbol ambiguous.
// The C library headers come first, while __cplusplus still selects their C++-compatible declarations.
const prelude = `#include <type_traits>
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
namespace art_abi {
enum Kind { Void, Integer, Floating, Other };
struct Slot { unsigned size; Kind kind; };
constexpr bool operator==(Slot a, Slot b) { return a.size == b.size && a.kind == b.kind; }
template <class T> constexpr Slot slotOf() {
  if constexpr (std::is_void_v<T>) return {0, Void};
  else if constexpr (std::is_floating_point_v<T>) return {sizeof(T), Floating};
  else if constexpr (std::is_integral_v<T> || std::is_enum_v<T> || std::is_pointer_v<T>) return {sizeof(T), Integer};
  else return {sizeof(T), Other};  // a struct by value: never what the FFI passes
}
template <class F> struct Signature;
template <class R, class... A> struct Signature<R (*)(A...)> {
  static constexpr Slot result = slotOf<R>();
  static constexpr unsigned count = sizeof...(A);
  static constexpr Slot arg(unsigned i) {
    constexpr Slot all[] = {slotOf<A>()..., Slot{0, Void}};
    return all[i < count ? i : count];
  }
};
// glibc declares its functions noexcept in C++.
template <class R, class... A> struct Signature<R (*)(A...) noexcept> : Signature<R (*)(A...)> {};
constexpr bool same(const char* a, const char* b) {
  while (*a && *a == *b) { ++a; ++b; }
  return *a == *b;
}
}  // namespace art_abi
#define ART_ABI_STRING(x) #x
#define ART_ABI_EXPANDED(x) ART_ABI_STRING(x)
#undef __cplusplus
`;

function slotLiteral(type: NativeType): string {
  const { size, kind } = slots[type];
  return `art_abi::Slot{${size}, art_abi::${kind}}`;
}

function describe(type: NativeType): string {
  const { size, kind } = slots[type];
  return kind === "Void" ? "void" : `${type} (${size}-byte ${kind === "Integer" ? "integer/pointer" : "floating point"})`;
}

/** The unversioned name a header macro may map to a versioned export: cuMemAlloc for cuMemAlloc_v2. */
function baseName(symbol: string): string {
  return symbol.replace(/_v\d+$/, "");
}

/** The C++ translation unit that checks `group` (every assertion message starts with "ABI <symbol>"). */
export function generateAbiCheck(group: BindingGroup): string {
  const lines = [prelude, ...group.headers.map((header) => `#include <${header}>`)];
  group.tables.forEach((table, tableIndex) => {
    for (const [symbol, signature] of Object.entries(table)) {
      const alias = `art_sig_${tableIndex}_${symbol}`;
      const base = baseName(symbol);
      // A legacy entry has no declaration of its own in current headers: its signature is the current symbol's.
      const declared = signature.legacyNameOf ? base : symbol;
      lines.push(`using ${alias} = art_abi::Signature<decltype(&${declared})>;`);
      lines.push(`static_assert(${alias}::count == ${signature.args.length}, "ABI ${symbol}: the headers declare a different ` +
        `number of arguments than the FFI's ${signature.args.length}");`);
      lines.push(`static_assert(${alias}::result == ${slotLiteral(signature.result)}, "ABI ${symbol} result: the FFI declares ` +
        `${describe(signature.result)}, the headers another size or class");`);
      signature.args.forEach((type, i) => {
        lines.push(`static_assert(${alias}::count != ${signature.args.length} || ${alias}::arg(${i}) == ${slotLiteral(type)}, ` +
          `"ABI ${symbol} argument ${i + 1}: the FFI declares ${describe(type)}, the headers another size or class");`);
      });
      const expected = signature.legacyNameOf ?? symbol;
      // A versioned name may also be bound when its base is no macro (e.g. cuCtxSynchronize_v2 beside cuCtxSynchronize).
      const unmapped = symbol !== base ? ` || art_abi::same(ART_ABI_EXPANDED(${base}), "${base}")` : "";
      lines.push(`static_assert(art_abi::same(ART_ABI_EXPANDED(${base}), "${expected}")${unmapped}, "ABI ${symbol} name: the ` +
        `headers resolve ${base} to " ART_ABI_EXPANDED(${base}) ", the FFI binds ${symbol}` +
        `${signature.legacyNameOf ? ` as the legacy name of ${signature.legacyNameOf}` : ""}");`);
    }
  });
  for (const [name, value] of Object.entries(group.constants)) {
    lines.push(`static_assert(static_cast<long long>(${name}) == ${value}, "ABI constant ${name}: the code uses ${value}, ` +
      `the headers another value");`);
  }
  return `${lines.join("\n")}\n`;
}

/**
 * Compiles the check for `group` with `compiler` (-fsyntax-only) and returns every problem: the failed assertions'
 * messages, and any other compiler error (an undeclared symbol, a missing header), one line each. Empty = all agree.
 */
export function runAbiCheck(group: BindingGroup, compiler: string, includeDirs: readonly string[]): string[] {
  const dir = mkdtempSync(join(tmpdir(), "art-abi-"));
  try {
    const file = join(dir, "abi-check.cpp");
    writeFileSync(file, generateAbiCheck(group));
    try {
      execFileSync(compiler, ["-std=c++17", "-fsyntax-only", "-fmax-errors=0", ...includeDirs.flatMap((d) => ["-I", d]), file],
        { stdio: ["ignore", "ignore", "pipe"], encoding: "utf8" });
      return [];
    } catch (error) {
      const stderr = (error as { stderr?: string }).stderr ?? String(error);
      const problems = stderr.split("\n").filter((line) => line.includes(" error: ")).flatMap((line) => {
        const message = line.slice(line.indexOf(" error: ") + 8);
        const assertion = /^static assertion failed: (.*)$/.exec(message);
        if (assertion) return [assertion[1]];
        const undeclared = /^.(\w+). was not declared/.exec(message);
        if (undeclared) return [`ABI ${undeclared[1]}: not declared by ${group.headers.join(", ")}`];
        // What an undeclared symbol drags along (the alias of its signature) says nothing new.
        return /art_sig_|template argument \d+ is invalid/.test(message) ? [] : [message];
      });
      return problems.length > 0 ? problems : [stderr.trim()];
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

/** Names of the functions `library` exports (nm -D), without symbol versions. */
export function exportedSymbols(library: string): Set<string> {
  const text = execFileSync("nm", ["-D", "--defined-only", library], { encoding: "utf8", maxBuffer: 64 << 20 });
  const names = new Set<string>();
  for (const line of text.split("\n")) {
    const name = line.trim().split(/\s+/)[2];
    if (name) names.add(name.replace(/@.*$/, ""));
  }
  return names;
}

/** The bound names of `group` that `exported` lacks; a missing optional symbol is allowed (it is bound when present). */
export function missingExports(group: BindingGroup, exported: Set<string>): string[] {
  return group.tables.flatMap((table) => Object.entries(table))
    .filter(([symbol, signature]) => !signature.optional && !exported.has(symbol))
    .map(([symbol]) => symbol);
}
