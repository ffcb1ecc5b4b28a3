;; The CPU backend's row-wise and elementwise ops on four f32 lanes at a time: its fast path (with a system BLAS), where
;; these ops in JavaScript (V8's Math.exp alone costs about 13 ns a call) took a third of a prefill beside the BLAS's
;; products. The formulas are kernels.ts', attention.ts' and sample.ts' (their references); the caller (wasm-elementwise.ts)
;; copies operands into this module's memory and results out. Pointers are byte offsets into that memory; `vectors`
;; counts groups of 4 floats (the caller pads the last group); widths passed as `d`/`half` are multiples of 4.
;;
;; exp on (-inf, 88] (Cephes' expf scheme; above 88.38 it is +inf, and inputs past 89 would wrap the exponent): k = round(x / ln 2), r = x − k·ln 2 with ln 2 split in two so r keeps
;; its low bits, e^r by a degree-7 polynomial on |r| ≤ ln2/2 (relative error ~1e-7), then 2^k built in the exponent
;; field (−126 ≤ k ≤ 127 keeps it a normal number). Below −87.33 the result would be subnormal: it is flushed to 0.
;; A NaN stays NaN: the clamp is f32x4.pmax(x, floor), "floor if x < floor else x", so a NaN passes it, and every
;; later step keeps it (pmax is one maxps, where f32x4.max's NaN and signed-zero rules cost eight instructions: 1.3 →
;; 0.84 ns an element). It exists once, as the loop
;; $exp_vectors, whose constants sit in locals set before the loop: V8 neither inlines a call per vector into a loop
;; nor hoists v128 constants out of one, and each costs as much as the polynomial (measured: 2.6 ns an element
;; that way, 1.5 ns this way). The other kernels take their exponentials through it, a block at a time. Its
;; multiply-adds are relaxed SIMD's f32x4.relaxed_madd (one FMA instruction where the CPU has one: 1.15 ns an element
;; against 1.5); scripts/build-wasm.ts also assembles this module with each written as a product then a sum, for
;; runtimes without relaxed SIMD. Either rounds within the bounds the tests state.

(module
  (memory (export "memory") 1)

  ;; dst = exp(src − shift), `vectors` groups of 4 (dst may be src)
  (func $exp_vectors (export "exp_shifted") (param $src i32) (param $dst i32) (param $vectors i32) (param $shift f32)
    (local $end i32) (local $s v128) (local $x v128) (local $t v128) (local $k v128) (local $r v128) (local $p v128)
    (local $underflow v128) (local $floor v128) (local $log2e v128) (local $magic v128) (local $ln2hi v128)
    (local $ln2lo v128) (local $c7 v128) (local $c6 v128) (local $c5 v128) (local $c4 v128) (local $c3 v128)
    (local $c2 v128) (local $one v128) (local $bias v128)
    (local.set $floor (v128.const f32x4 -87.33 -87.33 -87.33 -87.33))
    (local.set $log2e (v128.const f32x4 1.44269504088896341 1.44269504088896341 1.44269504088896341 1.44269504088896341))
    (local.set $magic (v128.const f32x4 12582912 12582912 12582912 12582912))
    (local.set $ln2hi (v128.const f32x4 0.693359375 0.693359375 0.693359375 0.693359375))
    (local.set $ln2lo (v128.const f32x4 -2.12194440e-4 -2.12194440e-4 -2.12194440e-4 -2.12194440e-4))
    (local.set $c7 (v128.const f32x4 1.9875691500e-4 1.9875691500e-4 1.9875691500e-4 1.9875691500e-4))
    (local.set $c6 (v128.const f32x4 1.3981999507e-3 1.3981999507e-3 1.3981999507e-3 1.3981999507e-3))
    (local.set $c5 (v128.const f32x4 8.3334519073e-3 8.3334519073e-3 8.3334519073e-3 8.3334519073e-3))
    (local.set $c4 (v128.const f32x4 4.1665795894e-2 4.1665795894e-2 4.1665795894e-2 4.1665795894e-2))
    (local.set $c3 (v128.const f32x4 1.6666665459e-1 1.6666665459e-1 1.6666665459e-1 1.6666665459e-1))
    (local.set $c2 (v128.const f32x4 5.0000001201e-1 5.0000001201e-1 5.0000001201e-1 5.0000001201e-1))
    (local.set $one (v128.const f32x4 1 1 1 1))
    (local.set $bias (v128.const i32x4 127 127 127 127))
    (local.set $s (f32x4.splat (local.get $shift)))
    (local.set $end (i32.add (local.get $src) (i32.shl (local.get $vectors) (i32.const 4))))
    (block $done
      (loop $next
        (br_if $done (i32.ge_u (local.get $src) (local.get $end)))
        (local.set $x (f32x4.sub (v128.load (local.get $src)) (local.get $s)))
        (local.set $underflow (f32x4.lt (local.get $x) (local.get $floor)))
        (local.set $x (f32x4.pmax (local.get $x) (local.get $floor)))
        ;; k = round(x / ln 2) by the magic-number trick: adding 1.5·2^23 leaves k in the low mantissa bits of $t,
        ;; rounded to nearest even (as f32x4.nearest would), without float-integer conversions
        (local.set $t (f32x4.relaxed_madd (local.get $x) (local.get $log2e) (local.get $magic)))
        (local.set $k (f32x4.sub (local.get $t) (local.get $magic)))
        (local.set $r (f32x4.sub (f32x4.sub (local.get $x) (f32x4.mul (local.get $k) (local.get $ln2hi)))
          (f32x4.mul (local.get $k) (local.get $ln2lo))))
        ;; e^r ≈ 1 + r + r²·(c2 + r·(c3 + r·(c4 + r·(c5 + r·(c6 + r·c7)))))
        (local.set $p (f32x4.relaxed_madd (local.get $c7) (local.get $r) (local.get $c6)))
        (local.set $p (f32x4.relaxed_madd (local.get $p) (local.get $r) (local.get $c5)))
        (local.set $p (f32x4.relaxed_madd (local.get $p) (local.get $r) (local.get $c4)))
        (local.set $p (f32x4.relaxed_madd (local.get $p) (local.get $r) (local.get $c3)))
        (local.set $p (f32x4.relaxed_madd (local.get $p) (local.get $r) (local.get $c2)))
        (local.set $p (f32x4.add (f32x4.relaxed_madd (f32x4.mul (local.get $p) (local.get $r)) (local.get $r) (local.get $r))
          (local.get $one)))
        ;; × 2^k: $t's bits are 1.5·2^23's plus k; shifting (those bits + 127) left by 23 drops 1.5·2^23's (its low 22
        ;; bits are zero) and leaves (k + 127) << 23, 2^k's bit pattern
        (local.set $p (f32x4.mul (local.get $p) (i32x4.shl (i32x4.add (local.get $t) (local.get $bias)) (i32.const 23))))
        (v128.store (local.get $dst) (v128.andnot (local.get $p) (local.get $underflow)))
        (local.set $src (i32.add (local.get $src) (i32.const 16)))
        (local.set $dst (i32.add (local.get $dst) (i32.const 16)))
        (br $next))))

  ;; sigma = σ(gate), complement = 1 − σ(gate), each without cancellation or overflow: with e = exp(−|g|) (never the
  ;; exponential of a positive number) and d = 1 / (1 + e) they are d and e·d, in the order the sign of g says (1 − σ
  ;; computed as a difference would lose its digits where σ is near 1). Whole loops, so that the callers' loops are
  ;; plain products (V8 does not inline a call per vector).
  (func $sigmoid_vectors (param $gate i32) (param $sigma i32) (param $complement i32) (param $vectors i32)
    (local $i i32) (local $end i32) (local $g v128) (local $e v128) (local $d v128) (local $ed v128) (local $nonnegative v128)
    (local $one v128) (local $zero v128)
    (local.set $one (v128.const f32x4 1 1 1 1))
    (local.set $end (i32.shl (local.get $vectors) (i32.const 4)))
    (block $done
      (loop $next
        (br_if $done (i32.ge_u (local.get $i) (local.get $end)))
        (v128.store (i32.add (local.get $sigma) (local.get $i))
          (f32x4.neg (f32x4.abs (v128.load (i32.add (local.get $gate) (local.get $i))))))
        (local.set $i (i32.add (local.get $i) (i32.const 16)))
        (br $next)))
    (call $exp_vectors (local.get $sigma) (local.get $sigma) (local.get $vectors) (f32.const 0))
    (local.set $i (i32.const 0))
    (block $done2
      (loop $next2
        (br_if $done2 (i32.ge_u (local.get $i) (local.get $end)))
        (local.set $e (v128.load (i32.add (local.get $sigma) (local.get $i))))
        (local.set $d (f32x4.div (local.get $one) (f32x4.add (local.get $one) (local.get $e))))
        (local.set $ed (f32x4.mul (local.get $e) (local.get $d)))
        (local.set $nonnegative (f32x4.ge (v128.load (i32.add (local.get $gate) (local.get $i))) (local.get $zero)))
        (v128.store (i32.add (local.get $sigma) (local.get $i)) (v128.bitselect (local.get $d) (local.get $ed) (local.get $nonnegative)))
        (v128.store (i32.add (local.get $complement) (local.get $i)) (v128.bitselect (local.get $ed) (local.get $d) (local.get $nonnegative)))
        (local.set $i (i32.add (local.get $i) (i32.const 16)))
        (br $next2))))

  ;; out = g / (1 + e^−g) · up (the reference's formula; e: room for `vectors` groups). e^−g is taken of min(−g, 89) (pmin,
  ;; which lets a NaN through, as $exp_vectors' clamp does): past
  ;; 88.72 it is +inf, so σ is 0 (the true σ(g) is below 3.4e-39 there), g = −inf gives NaN as −inf · 0 would, and
  ;; the clamp keeps the exponent trick from wrapping (the backward, which needs 1 − σ, goes through $sigmoid_vectors).
  (func (export "swiglu") (param $gate i32) (param $up i32) (param $out i32) (param $e i32) (param $vectors i32)
    (local $i i32) (local $end i32) (local $limit v128) (local $one v128)
    (local.set $limit (v128.const f32x4 89 89 89 89))
    (local.set $one (v128.const f32x4 1 1 1 1))
    (local.set $end (i32.shl (local.get $vectors) (i32.const 4)))
    (block $done
      (loop $next
        (br_if $done (i32.ge_u (local.get $i) (local.get $end)))
        (v128.store (i32.add (local.get $e) (local.get $i))
          (f32x4.pmin (f32x4.neg (v128.load (i32.add (local.get $gate) (local.get $i)))) (local.get $limit)))
        (local.set $i (i32.add (local.get $i) (i32.const 16)))
        (br $next)))
    (call $exp_vectors (local.get $e) (local.get $e) (local.get $vectors) (f32.const 0))
    (local.set $i (i32.const 0))
    (block $done2
      (loop $next2
        (br_if $done2 (i32.ge_u (local.get $i) (local.get $end)))
        (v128.store (i32.add (local.get $out) (local.get $i))
          (f32x4.mul (f32x4.div (v128.load (i32.add (local.get $gate) (local.get $i)))
                                (f32x4.add (local.get $one) (v128.load (i32.add (local.get $e) (local.get $i)))))
            (v128.load (i32.add (local.get $up) (local.get $i)))))
        (local.set $i (i32.add (local.get $i) (i32.const 16)))
        (br $next2))))

  ;; dUp += dOut · g · σ(g);  dGate += dOut · up · σ(g) · (1 + g · (1 − σ(g)))
  (func (export "swiglu_backward") (param $gate i32) (param $up i32) (param $dOut i32) (param $dGate i32) (param $dUp i32)
                                   (param $sigma i32) (param $complement i32) (param $vectors i32)
    (local $i i32) (local $end i32) (local $g v128) (local $s v128) (local $d v128)
    (call $sigmoid_vectors (local.get $gate) (local.get $sigma) (local.get $complement) (local.get $vectors))
    (local.set $end (i32.shl (local.get $vectors) (i32.const 4)))
    (block $done
      (loop $next
        (br_if $done (i32.ge_u (local.get $i) (local.get $end)))
        (local.set $g (v128.load (i32.add (local.get $gate) (local.get $i))))
        (local.set $s (v128.load (i32.add (local.get $sigma) (local.get $i))))
        (local.set $d (v128.load (i32.add (local.get $dOut) (local.get $i))))
        (v128.store (i32.add (local.get $dUp) (local.get $i)) (f32x4.add (v128.load (i32.add (local.get $dUp) (local.get $i)))
          (f32x4.mul (f32x4.mul (local.get $d) (local.get $g)) (local.get $s))))
        (v128.store (i32.add (local.get $dGate) (local.get $i)) (f32x4.add (v128.load (i32.add (local.get $dGate) (local.get $i)))
          (f32x4.mul (f32x4.mul (f32x4.mul (local.get $d) (v128.load (i32.add (local.get $up) (local.get $i)))) (local.get $s))
            (f32x4.add (v128.const f32x4 1 1 1 1)
              (f32x4.mul (local.get $g) (v128.load (i32.add (local.get $complement) (local.get $i))))))))
        (local.set $i (i32.add (local.get $i) (i32.const 16)))
        (br $next))))

  ;; Σ of `count` floats at `at`, in f64 (two f64x2 accumulators take the low and high lanes of each group)
  (func $sum_f64 (param $at i32) (param $count i32) (result f64)
    (local $i i32) (local $full i32) (local $lo v128) (local $hi v128) (local $x v128) (local $sum f64)
    (local.set $full (i32.shl (i32.shr_u (local.get $count) (i32.const 2)) (i32.const 4)))
    (block $done
      (loop $next
        (br_if $done (i32.ge_u (local.get $i) (local.get $full)))
        (local.set $x (v128.load (i32.add (local.get $at) (local.get $i))))
        (local.set $lo (f64x2.add (local.get $lo) (f64x2.promote_low_f32x4 (local.get $x))))
        (local.set $hi (f64x2.add (local.get $hi)
          (f64x2.promote_low_f32x4 (i8x16.shuffle 8 9 10 11 12 13 14 15 0 1 2 3 4 5 6 7 (local.get $x) (local.get $x)))))
        (local.set $i (i32.add (local.get $i) (i32.const 16)))
        (br $next)))
    (local.set $sum (f64.add (f64.add (f64x2.extract_lane 0 (local.get $lo)) (f64x2.extract_lane 1 (local.get $lo)))
      (f64.add (f64x2.extract_lane 0 (local.get $hi)) (f64x2.extract_lane 1 (local.get $hi)))))
    (local.set $full (i32.shl (local.get $count) (i32.const 2)))
    (block $tail_done
      (loop $tail
        (br_if $tail_done (i32.ge_u (local.get $i) (local.get $full)))
        (local.set $sum (f64.add (local.get $sum) (f64.promote_f32 (f32.load (i32.add (local.get $at) (local.get $i))))))
        (local.set $i (i32.add (local.get $i) (i32.const 4)))
        (br $tail)))
    (local.get $sum))

;; Σ exp(x − shift) over `vectors` groups (the caller pads the last group with −inf), in f64; `x` is overwritten
;; The sampler's weights: out = samplingExp(f32((x − max) · inverse)) of sample.ts, which is the CUDA sampler's
  ;; sampling_exp, bit for bit: the same correctly rounded f32 operations in the same order (never a fused
  ;; multiply-add), k = floor(t + 1/2) with t = v·log2 e, e^f by the degree-7 Taylor polynomial, times 2^k built in
  ;; the exponent field; 0 where t is not above −125 (NaN too). For v ≤ 0, the reference's domain. `x` may be `out`.
  (func (export "sampling_weights") (param $x i32) (param $out i32) (param $vectors i32) (param $max f32) (param $inverse f32)
    (local $end i32) (local $m v128) (local $s v128) (local $v v128) (local $t v128) (local $k v128) (local $f v128)
    (local $p v128) (local $floor v128) (local $log2e v128) (local $half v128) (local $ln2hi v128) (local $ln2lo v128)
    (local $c7 v128) (local $c6 v128) (local $c5 v128) (local $c4 v128) (local $c3 v128) (local $one v128) (local $bias v128)
    (local.set $m (f32x4.splat (local.get $max)))
    (local.set $s (f32x4.splat (local.get $inverse)))
    (local.set $floor (v128.const f32x4 -125 -125 -125 -125))
    (local.set $log2e (v128.const f32x4 0x1.715476p+0 0x1.715476p+0 0x1.715476p+0 0x1.715476p+0))
    (local.set $half (v128.const f32x4 0.5 0.5 0.5 0.5))
    (local.set $ln2hi (v128.const f32x4 0x1.62e4p-1 0x1.62e4p-1 0x1.62e4p-1 0x1.62e4p-1))
    (local.set $ln2lo (v128.const f32x4 0x1.7f7d1cp-20 0x1.7f7d1cp-20 0x1.7f7d1cp-20 0x1.7f7d1cp-20))
    ;; f32(1/7!) … f32(1/3!), exactly as sample.ts rounds them
    (local.set $c7 (v128.const f32x4 0x1.a01a02p-13 0x1.a01a02p-13 0x1.a01a02p-13 0x1.a01a02p-13))
    (local.set $c6 (v128.const f32x4 0x1.6c16c2p-10 0x1.6c16c2p-10 0x1.6c16c2p-10 0x1.6c16c2p-10))
    (local.set $c5 (v128.const f32x4 0x1.111112p-7 0x1.111112p-7 0x1.111112p-7 0x1.111112p-7))
    (local.set $c4 (v128.const f32x4 0x1.555556p-5 0x1.555556p-5 0x1.555556p-5 0x1.555556p-5))
    (local.set $c3 (v128.const f32x4 0x1.555556p-3 0x1.555556p-3 0x1.555556p-3 0x1.555556p-3))
    (local.set $one (v128.const f32x4 1 1 1 1))
    (local.set $bias (v128.const i32x4 127 127 127 127))
    (local.set $end (i32.add (local.get $x) (i32.shl (local.get $vectors) (i32.const 4))))
    (block $done
      (loop $next
        (br_if $done (i32.ge_u (local.get $x) (local.get $end)))
        (local.set $v (f32x4.mul (f32x4.sub (v128.load (local.get $x)) (local.get $m)) (local.get $s)))
        (local.set $t (f32x4.mul (local.get $v) (local.get $log2e)))
        (local.set $k (f32x4.floor (f32x4.add (local.get $t) (local.get $half))))
        (local.set $f (f32x4.sub (f32x4.sub (local.get $v) (f32x4.mul (local.get $k) (local.get $ln2hi)))
          (f32x4.mul (local.get $k) (local.get $ln2lo))))
        (local.set $p (f32x4.add (f32x4.mul (local.get $c7) (local.get $f)) (local.get $c6)))
        (local.set $p (f32x4.add (f32x4.mul (local.get $p) (local.get $f)) (local.get $c5)))
        (local.set $p (f32x4.add (f32x4.mul (local.get $p) (local.get $f)) (local.get $c4)))
        (local.set $p (f32x4.add (f32x4.mul (local.get $p) (local.get $f)) (local.get $c3)))
        (local.set $p (f32x4.add (f32x4.mul (local.get $p) (local.get $f)) (local.get $half)))
        (local.set $p (f32x4.add (f32x4.mul (local.get $p) (local.get $f)) (local.get $one)))
        (local.set $p (f32x4.add (f32x4.mul (local.get $p) (local.get $f)) (local.get $one)))
        ;; × 2^k, k in −125..0 where the result is kept: (k + 127) << 23 is 2^k's bit pattern
        (local.set $p (f32x4.mul (local.get $p)
          (i32x4.shl (i32x4.add (i32x4.trunc_sat_f32x4_s (local.get $k)) (local.get $bias)) (i32.const 23))))
        (v128.store (local.get $out) (v128.and (local.get $p) (f32x4.gt (local.get $t) (local.get $floor))))
        (local.set $x (i32.add (local.get $x) (i32.const 16)))
        (local.set $out (i32.add (local.get $out) (i32.const 16)))
        (br $next))))

  (func (export "sum_exp") (param $x i32) (param $vectors i32) (param $shift f32) (result f64)
    (call $exp_vectors (local.get $x) (local.get $x) (local.get $vectors) (local.get $shift))
    (call $sum_f64 (local.get $x) (i32.shl (local.get $vectors) (i32.const 2))))

    ;; Softmax of each of `rows` rows (`stride` floats apart) over its keys 0..lasts[r], zero from there up to `end`:
  ;; attention.ts causalSoftmax, a block of rows per call. `temp` is 16 bytes for the last partial group.
  (func (export "softmax_rows") (param $scores i32) (param $stride i32) (param $rows i32) (param $lasts i32) (param $end i32)
                                (param $temp i32)
    (local $r i32) (local $row i32) (local $count i32) (local $full i32) (local $j i32) (local $m v128) (local $max f32)
    (local $inverse f32) (local $scale v128)
    (block $rows_done
      (loop $next_row
        (br_if $rows_done (i32.ge_u (local.get $r) (local.get $rows)))
        (local.set $row (i32.add (local.get $scores) (i32.shl (i32.mul (local.get $r) (local.get $stride)) (i32.const 2))))
        (local.set $count (i32.add (i32.load (i32.add (local.get $lasts) (i32.shl (local.get $r) (i32.const 2)))) (i32.const 1)))
        (local.set $full (i32.shl (i32.shr_u (local.get $count) (i32.const 2)) (i32.const 4)))
        ;; the row's max (NaN propagates, as Math.max's does)
        (local.set $m (v128.const f32x4 -inf -inf -inf -inf))
        (local.set $j (i32.const 0))
        (block $max_done
          (loop $max
            (br_if $max_done (i32.ge_u (local.get $j) (local.get $full)))
            (local.set $m (f32x4.max (local.get $m) (v128.load (i32.add (local.get $row) (local.get $j)))))
            (local.set $j (i32.add (local.get $j) (i32.const 16)))
            (br $max)))
        (local.set $max (f32.max (f32.max (f32x4.extract_lane 0 (local.get $m)) (f32x4.extract_lane 1 (local.get $m)))
          (f32.max (f32x4.extract_lane 2 (local.get $m)) (f32x4.extract_lane 3 (local.get $m)))))
        (block $max_tail_done
          (loop $max_tail
            (br_if $max_tail_done (i32.ge_u (local.get $j) (i32.shl (local.get $count) (i32.const 2))))
            (local.set $max (f32.max (local.get $max) (f32.load (i32.add (local.get $row) (local.get $j)))))
            (local.set $j (i32.add (local.get $j) (i32.const 4)))
            (br $max_tail)))
        ;; exponentials: whole groups in place, the last partial group through `temp` (its neighbours are another
        ;; row's or past this row's keys)
        (call $exp_vectors (local.get $row) (local.get $row) (i32.shr_u (local.get $full) (i32.const 4)) (local.get $max))
        (v128.store (local.get $temp) (v128.const f32x4 0 0 0 0))
        (memory.copy (local.get $temp) (i32.add (local.get $row) (local.get $full))
          (i32.sub (i32.shl (local.get $count) (i32.const 2)) (local.get $full)))
        (call $exp_vectors (local.get $temp) (local.get $temp) (i32.const 1) (local.get $max))
        (memory.copy (i32.add (local.get $row) (local.get $full)) (local.get $temp)
          (i32.sub (i32.shl (local.get $count) (i32.const 2)) (local.get $full)))
        ;; normalise, then zero the keys past this row's last up to the block's
        (local.set $inverse (f32.demote_f64 (f64.div (f64.const 1) (call $sum_f64 (local.get $row) (local.get $count)))))
        (local.set $scale (f32x4.splat (local.get $inverse)))
        (local.set $j (i32.const 0))
        (block $scale_done
          (loop $scale_next
            (br_if $scale_done (i32.ge_u (local.get $j) (local.get $full)))
            (v128.store (i32.add (local.get $row) (local.get $j))
              (f32x4.mul (v128.load (i32.add (local.get $row) (local.get $j))) (local.get $scale)))
            (local.set $j (i32.add (local.get $j) (i32.const 16)))
            (br $scale_next)))
        (block $scale_tail_done
          (loop $scale_tail
            (br_if $scale_tail_done (i32.ge_u (local.get $j) (i32.shl (local.get $count) (i32.const 2))))
            (f32.store (i32.add (local.get $row) (local.get $j))
              (f32.mul (f32.load (i32.add (local.get $row) (local.get $j))) (local.get $inverse)))
            (local.set $j (i32.add (local.get $j) (i32.const 4)))
            (br $scale_tail)))
        (memory.fill (i32.add (local.get $row) (i32.shl (local.get $count) (i32.const 2))) (i32.const 0)
          (i32.shl (i32.sub (local.get $end) (local.get $count)) (i32.const 2)))
        (local.set $r (i32.add (local.get $r) (i32.const 1)))
        (br $next_row))))

;; Backward of softmax_rows (attention.ts causalSoftmaxBackward): with P a row's probabilities and dP its gradient,
  ;; dS = P · (dP − Σ P·dP) · scale over keys 0..lasts[r] (the sum in f64), zero from there up to `end`; dS replaces
  ;; dP in `grads`. Both operands' rows lie `stride` floats apart.
  (func (export "softmax_backward_rows") (param $probs i32) (param $grads i32) (param $stride i32) (param $rows i32) (param $lasts i32)
                                         (param $end i32) (param $scale f32)
    (local $r i32) (local $p i32) (local $g i32) (local $count i32) (local $full i32) (local $j i32)
    (local $x v128) (local $lo v128) (local $hi v128) (local $weighted f64) (local $w v128) (local $s v128) (local $wf f32)
    (local.set $s (f32x4.splat (local.get $scale)))
    (block $rows_done
      (loop $next_row
        (br_if $rows_done (i32.ge_u (local.get $r) (local.get $rows)))
        (local.set $p (i32.add (local.get $probs) (i32.shl (i32.mul (local.get $r) (local.get $stride)) (i32.const 2))))
        (local.set $g (i32.add (local.get $grads) (i32.shl (i32.mul (local.get $r) (local.get $stride)) (i32.const 2))))
        (local.set $count (i32.add (i32.load (i32.add (local.get $lasts) (i32.shl (local.get $r) (i32.const 2)))) (i32.const 1)))
        (local.set $full (i32.shl (i32.shr_u (local.get $count) (i32.const 2)) (i32.const 4)))
        ;; Σ P·dP: f32 products are exact in f64, summed in two f64x2 accumulators
        (local.set $lo (v128.const f64x2 0 0))
        (local.set $hi (v128.const f64x2 0 0))
        (local.set $j (i32.const 0))
        (block $dot_done
          (loop $dot
            (br_if $dot_done (i32.ge_u (local.get $j) (local.get $full)))
            (local.set $x (v128.load (i32.add (local.get $p) (local.get $j))))
            (local.set $w (v128.load (i32.add (local.get $g) (local.get $j))))
            (local.set $lo (f64x2.add (local.get $lo)
              (f64x2.mul (f64x2.promote_low_f32x4 (local.get $x)) (f64x2.promote_low_f32x4 (local.get $w)))))
            (local.set $hi (f64x2.add (local.get $hi)
              (f64x2.mul (f64x2.promote_low_f32x4 (i8x16.shuffle 8 9 10 11 12 13 14 15 0 1 2 3 4 5 6 7 (local.get $x) (local.get $x)))
                         (f64x2.promote_low_f32x4 (i8x16.shuffle 8 9 10 11 12 13 14 15 0 1 2 3 4 5 6 7 (local.get $w) (local.get $w))))))
            (local.set $j (i32.add (local.get $j) (i32.const 16)))
            (br $dot)))
        (local.set $weighted (f64.add (f64.add (f64x2.extract_lane 0 (local.get $lo)) (f64x2.extract_lane 1 (local.get $lo)))
          (f64.add (f64x2.extract_lane 0 (local.get $hi)) (f64x2.extract_lane 1 (local.get $hi)))))
        (block $dot_tail_done
          (loop $dot_tail
            (br_if $dot_tail_done (i32.ge_u (local.get $j) (i32.shl (local.get $count) (i32.const 2))))
            (local.set $weighted (f64.add (local.get $weighted)
              (f64.mul (f64.promote_f32 (f32.load (i32.add (local.get $p) (local.get $j))))
                       (f64.promote_f32 (f32.load (i32.add (local.get $g) (local.get $j)))))))
            (local.set $j (i32.add (local.get $j) (i32.const 4)))
            (br $dot_tail)))
        (local.set $wf (f32.demote_f64 (local.get $weighted)))
        (local.set $w (f32x4.splat (local.get $wf)))
        (local.set $j (i32.const 0))
        (block $grad_done
          (loop $grad
            (br_if $grad_done (i32.ge_u (local.get $j) (local.get $full)))
            (v128.store (i32.add (local.get $g) (local.get $j))
              (f32x4.mul (f32x4.mul (v128.load (i32.add (local.get $p) (local.get $j)))
                (f32x4.sub (v128.load (i32.add (local.get $g) (local.get $j))) (local.get $w))) (local.get $s)))
            (local.set $j (i32.add (local.get $j) (i32.const 16)))
            (br $grad)))
        (block $grad_tail_done
          (loop $grad_tail
            (br_if $grad_tail_done (i32.ge_u (local.get $j) (i32.shl (local.get $count) (i32.const 2))))
            (f32.store (i32.add (local.get $g) (local.get $j))
              (f32.mul (f32.mul (f32.load (i32.add (local.get $p) (local.get $j)))
                (f32.sub (f32.load (i32.add (local.get $g) (local.get $j))) (local.get $wf))) (local.get $scale)))
            (local.set $j (i32.add (local.get $j) (i32.const 4)))
            (br $grad_tail)))
        (memory.fill (i32.add (local.get $g) (i32.shl (local.get $count) (i32.const 2))) (i32.const 0)
          (i32.shl (i32.sub (local.get $end) (local.get $count)) (i32.const 2)))
        (local.set $r (i32.add (local.get $r) (i32.const 1)))
        (br $next_row))))

    ;; One row of RMSNorm (kernels.ts rmsNormRows): out = weight · (x · s), s = 1 / sqrt(mean(x²) + eps) rounded to f32
  ;; (x² summed in f64, exactly as the reference's products), returning s. `d` is a multiple of 4; out may be x.
  (func $rms_norm_row (param $x i32) (param $weight i32) (param $out i32) (param $d i32) (param $eps f64) (result f32)
    (local $i i32) (local $end i32) (local $v v128) (local $lo v128) (local $hi v128) (local $p v128) (local $inverse f32)
    (local $s v128)
    (local.set $end (i32.shl (local.get $d) (i32.const 2)))
    (block $done
      (loop $next
        (br_if $done (i32.ge_u (local.get $i) (local.get $end)))
        (local.set $v (v128.load (i32.add (local.get $x) (local.get $i))))
        (local.set $p (f64x2.promote_low_f32x4 (local.get $v)))
        (local.set $lo (f64x2.add (local.get $lo) (f64x2.mul (local.get $p) (local.get $p))))
        (local.set $p (f64x2.promote_low_f32x4 (i8x16.shuffle 8 9 10 11 12 13 14 15 0 1 2 3 4 5 6 7 (local.get $v) (local.get $v))))
        (local.set $hi (f64x2.add (local.get $hi) (f64x2.mul (local.get $p) (local.get $p))))
        (local.set $i (i32.add (local.get $i) (i32.const 16)))
        (br $next)))
    (local.set $inverse (f32.demote_f64 (f64.div (f64.const 1) (f64.sqrt (f64.add (local.get $eps) (f64.promote_f32 (f32.demote_f64
      (f64.div (f64.add (f64.add (f64x2.extract_lane 0 (local.get $lo)) (f64x2.extract_lane 1 (local.get $lo)))
                        (f64.add (f64x2.extract_lane 0 (local.get $hi)) (f64x2.extract_lane 1 (local.get $hi))))
               (f64.convert_i32_u (local.get $d))))))))))
    (local.set $s (f32x4.splat (local.get $inverse)))
    (local.set $i (i32.const 0))
    (block $done2
      (loop $next2
        (br_if $done2 (i32.ge_u (local.get $i) (local.get $end)))
        (v128.store (i32.add (local.get $out) (local.get $i))
          (f32x4.mul (v128.load (i32.add (local.get $weight) (local.get $i)))
            (f32x4.mul (v128.load (i32.add (local.get $x) (local.get $i))) (local.get $s))))
        (local.set $i (i32.add (local.get $i) (i32.const 16)))
        (br $next2)))
    (local.get $inverse))

  ;; RMSNorm of `rows` rows of `d`; with `keep`, each row's s goes to rstd[row]. With `b` non-zero, x = a + b is
  ;; written to `sum` first (the residual add before the MLP's norm).
  (func (export "rms_norm") (param $a i32) (param $b i32) (param $sum i32) (param $weight i32) (param $out i32)
                            (param $rstd i32) (param $keep i32) (param $rows i32) (param $d i32) (param $eps f64)
    (local $r i32) (local $offset i32) (local $i i32) (local $inverse f32)
    (block $done
      (loop $next
        (br_if $done (i32.ge_u (local.get $r) (local.get $rows)))
        (local.set $offset (i32.shl (i32.mul (local.get $r) (local.get $d)) (i32.const 2)))
        (if (local.get $b)
          (then
            (local.set $i (i32.const 0))
            (block $add_done
              (loop $add
                (br_if $add_done (i32.ge_u (local.get $i) (i32.shl (local.get $d) (i32.const 2))))
                (v128.store (i32.add (local.get $sum) (i32.add (local.get $offset) (local.get $i)))
                  (f32x4.add (v128.load (i32.add (local.get $a) (i32.add (local.get $offset) (local.get $i))))
                    (v128.load (i32.add (local.get $b) (i32.add (local.get $offset) (local.get $i))))))
                (local.set $i (i32.add (local.get $i) (i32.const 16)))
                (br $add)))))
        (local.set $inverse (call $rms_norm_row (i32.add (select (local.get $sum) (local.get $a) (local.get $b)) (local.get $offset))
          (local.get $weight) (i32.add (local.get $out) (local.get $offset)) (local.get $d) (local.get $eps)))
        (if (local.get $keep)
          (then (f32.store (i32.add (local.get $rstd) (i32.shl (local.get $r) (i32.const 2))) (local.get $inverse))))
        (local.set $r (i32.add (local.get $r) (i32.const 1)))
        (br $next))))

;; Backward of rms_norm (kernels.ts rmsNormRowsBackward) over `rows` rows of `d`: with s = rstd[row], x̂ = x·s and
  ;; g = dOut·w, dx += s·(g − x̂·mean(g·x̂)), the mean's sum in f64 as the reference takes it; with `keep`,
  ;; dWeight += Σ_rows dOut·x̂.
  (func (export "rms_norm_backward") (param $x i32) (param $dOut i32) (param $dx i32) (param $weight i32) (param $dWeight i32)
                                     (param $rstd i32) (param $keep i32) (param $rows i32) (param $d i32)
    (local $r i32) (local $i i32) (local $end i32) (local $offset i32) (local $v v128) (local $lo v128) (local $hi v128)
    (local $s v128) (local $c v128) (local $g v128) (local $xhat v128) (local $inverse f32)
    (local.set $end (i32.shl (local.get $d) (i32.const 2)))
    (block $done
      (loop $next
        (br_if $done (i32.ge_u (local.get $r) (local.get $rows)))
        (local.set $offset (i32.mul (local.get $r) (local.get $end)))
        (local.set $inverse (f32.load (i32.add (local.get $rstd) (i32.shl (local.get $r) (i32.const 2)))))
        ;; Σ dOut·w·x, in f64 lanes
        (local.set $lo (v128.const i32x4 0 0 0 0))
        (local.set $hi (v128.const i32x4 0 0 0 0))
        (local.set $i (i32.const 0))
        (block $dot_done
          (loop $dot
            (br_if $dot_done (i32.ge_u (local.get $i) (local.get $end)))
            (local.set $v (f32x4.mul (f32x4.mul (v128.load (i32.add (local.get $dOut) (i32.add (local.get $offset) (local.get $i))))
              (v128.load (i32.add (local.get $weight) (local.get $i)))) (v128.load (i32.add (local.get $x) (i32.add (local.get $offset) (local.get $i))))))
            (local.set $lo (f64x2.add (local.get $lo) (f64x2.promote_low_f32x4 (local.get $v))))
            (local.set $hi (f64x2.add (local.get $hi)
              (f64x2.promote_low_f32x4 (i8x16.shuffle 8 9 10 11 12 13 14 15 0 1 2 3 4 5 6 7 (local.get $v) (local.get $v)))))
            (local.set $i (i32.add (local.get $i) (i32.const 16)))
            (br $dot)))
        ;; c = mean(g·x̂) = s · Σ(dOut·w·x) / d
        (local.set $s (f32x4.splat (local.get $inverse)))
        (local.set $c (f32x4.splat (f32.demote_f64 (f64.div (f64.mul
          (f64.add (f64.add (f64x2.extract_lane 0 (local.get $lo)) (f64x2.extract_lane 1 (local.get $lo)))
                   (f64.add (f64x2.extract_lane 0 (local.get $hi)) (f64x2.extract_lane 1 (local.get $hi))))
          (f64.promote_f32 (local.get $inverse))) (f64.convert_i32_u (local.get $d))))))
        (local.set $i (i32.const 0))
        (block $row_done
          (loop $row
            (br_if $row_done (i32.ge_u (local.get $i) (local.get $end)))
            (local.set $g (v128.load (i32.add (local.get $dOut) (i32.add (local.get $offset) (local.get $i)))))
            (local.set $xhat (f32x4.mul (v128.load (i32.add (local.get $x) (i32.add (local.get $offset) (local.get $i)))) (local.get $s)))
            (v128.store (i32.add (local.get $dx) (i32.add (local.get $offset) (local.get $i)))
              (f32x4.add (v128.load (i32.add (local.get $dx) (i32.add (local.get $offset) (local.get $i))))
                (f32x4.mul (local.get $s) (f32x4.sub (f32x4.mul (local.get $g) (v128.load (i32.add (local.get $weight) (local.get $i))))
                  (f32x4.mul (local.get $xhat) (local.get $c))))))
            (if (local.get $keep)
              (then (v128.store (i32.add (local.get $dWeight) (local.get $i))
                (f32x4.add (v128.load (i32.add (local.get $dWeight) (local.get $i))) (f32x4.mul (local.get $g) (local.get $xhat))))))
            (local.set $i (i32.add (local.get $i) (i32.const 16)))
            (br $row)))
        (local.set $r (i32.add (local.get $r) (i32.const 1)))
        (br $next))))

  ;; Rotate-half RoPE in place (kernels.ts ropeRows) of `rows` rows of `width`, heads of 2·half: row r's table holds
  ;; cos then sign·sin of its `half` angles.
  (func (export "rope") (param $x i32) (param $table i32) (param $rows i32) (param $width i32) (param $half i32)
    (local $r i32) (local $head i32) (local $rowEnd i32) (local $j i32) (local $cos i32) (local $sin i32)
    (local $a v128) (local $b v128) (local $c v128) (local $s v128) (local $halfBytes i32)
    (local.set $halfBytes (i32.shl (local.get $half) (i32.const 2)))
    (block $done
      (loop $next
        (br_if $done (i32.ge_u (local.get $r) (local.get $rows)))
        (local.set $cos (i32.add (local.get $table) (i32.shl (i32.mul (local.get $r) (local.get $halfBytes)) (i32.const 1))))
        (local.set $sin (i32.add (local.get $cos) (local.get $halfBytes)))
        (local.set $head (i32.add (local.get $x) (i32.shl (i32.mul (local.get $r) (local.get $width)) (i32.const 2))))
        (local.set $rowEnd (i32.add (local.get $head) (i32.shl (local.get $width) (i32.const 2))))
        (block $heads_done
          (loop $heads
            (br_if $heads_done (i32.ge_u (local.get $head) (local.get $rowEnd)))
            (local.set $j (i32.const 0))
            (block $pairs_done
              (loop $pairs
                (br_if $pairs_done (i32.ge_u (local.get $j) (local.get $halfBytes)))
                (local.set $a (v128.load (i32.add (local.get $head) (local.get $j))))
                (local.set $b (v128.load (i32.add (local.get $head) (i32.add (local.get $halfBytes) (local.get $j)))))
                (local.set $c (v128.load (i32.add (local.get $cos) (local.get $j))))
                (local.set $s (v128.load (i32.add (local.get $sin) (local.get $j))))
                (v128.store (i32.add (local.get $head) (local.get $j))
                  (f32x4.sub (f32x4.mul (local.get $a) (local.get $c)) (f32x4.mul (local.get $b) (local.get $s))))
                (v128.store (i32.add (local.get $head) (i32.add (local.get $halfBytes) (local.get $j)))
                  (f32x4.add (f32x4.mul (local.get $b) (local.get $c)) (f32x4.mul (local.get $a) (local.get $s))))
                (local.set $j (i32.add (local.get $j) (i32.const 16)))
                (br $pairs)))
            (local.set $head (i32.add (local.get $head) (i32.shl (local.get $halfBytes) (i32.const 1))))
            (br $heads)))
        (local.set $r (i32.add (local.get $r) (i32.const 1)))
        (br $next))))
)
