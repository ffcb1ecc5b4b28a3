;; SwiGLU, its backward and softmax's exponentials, four f32 lanes at a time: the CPU backend's fast path (with a
;; system BLAS), where V8's Math.exp, about 13 ns a call, made SwiGLU a quarter of a short prefill and attention's
;; softmax a third of a long one. Pointers are byte offsets into this module's
;; memory; `vectors` counts groups of 4 floats (the caller pads the last group).
;;
;; The sigmoid takes e = exp(-|g|), never an exponential of a positive number, so nothing overflows:
;;   σ(g) = 1 / (1 + e) for g ≥ 0,  e / (1 + e) for g < 0, and 1 − σ(g) the other one.
;; exp on (-inf, 88] (Cephes' expf scheme): k = round(x / ln 2), r = x − k·ln 2 with ln 2 split in two so r keeps
;; its low bits, e^r by a degree-7 polynomial on |r| ≤ ln2/2 (relative error ~1e-7), then 2^k built in the exponent
;; field (−126 ≤ k ≤ 127 keeps it a normal number). Below −87.33 the result would be subnormal: it is flushed to 0.
;; A NaN stays NaN (it is not below the threshold, and every step keeps it).

(module
  (memory (export "memory") 1)

  (func $exp (param $x v128) (result v128)
    (local $k v128) (local $r v128) (local $p v128) (local $underflow v128)
    (local.set $underflow (f32x4.lt (local.get $x) (v128.const f32x4 -87.33 -87.33 -87.33 -87.33)))
    (local.set $x (f32x4.max (local.get $x) (v128.const f32x4 -87.33 -87.33 -87.33 -87.33)))
    (local.set $k (f32x4.nearest (f32x4.mul (local.get $x)
      (v128.const f32x4 1.44269504088896341 1.44269504088896341 1.44269504088896341 1.44269504088896341))))
    (local.set $r (f32x4.sub (local.get $x) (f32x4.mul (local.get $k)
      (v128.const f32x4 0.693359375 0.693359375 0.693359375 0.693359375))))
    (local.set $r (f32x4.sub (local.get $r) (f32x4.mul (local.get $k)
      (v128.const f32x4 -2.12194440e-4 -2.12194440e-4 -2.12194440e-4 -2.12194440e-4))))
    ;; e^r ≈ 1 + r + r²·(c2 + r·(c3 + r·(c4 + r·(c5 + r·(c6 + r·c7)))))
    (local.set $p (v128.const f32x4 1.9875691500e-4 1.9875691500e-4 1.9875691500e-4 1.9875691500e-4))
    (local.set $p (f32x4.add (f32x4.mul (local.get $p) (local.get $r))
      (v128.const f32x4 1.3981999507e-3 1.3981999507e-3 1.3981999507e-3 1.3981999507e-3)))
    (local.set $p (f32x4.add (f32x4.mul (local.get $p) (local.get $r))
      (v128.const f32x4 8.3334519073e-3 8.3334519073e-3 8.3334519073e-3 8.3334519073e-3)))
    (local.set $p (f32x4.add (f32x4.mul (local.get $p) (local.get $r))
      (v128.const f32x4 4.1665795894e-2 4.1665795894e-2 4.1665795894e-2 4.1665795894e-2)))
    (local.set $p (f32x4.add (f32x4.mul (local.get $p) (local.get $r))
      (v128.const f32x4 1.6666665459e-1 1.6666665459e-1 1.6666665459e-1 1.6666665459e-1)))
    (local.set $p (f32x4.add (f32x4.mul (local.get $p) (local.get $r))
      (v128.const f32x4 5.0000001201e-1 5.0000001201e-1 5.0000001201e-1 5.0000001201e-1)))
    (local.set $p (f32x4.add (f32x4.add (f32x4.mul (f32x4.mul (local.get $p) (local.get $r)) (local.get $r)) (local.get $r))
      (v128.const f32x4 1 1 1 1)))
    ;; × 2^k: (k + 127) << 23 is 2^k's bit pattern
    (local.set $p (f32x4.mul (local.get $p)
      (i32x4.shl (i32x4.add (i32x4.trunc_sat_f32x4_s (local.get $k)) (v128.const i32x4 127 127 127 127)) (i32.const 23))))
    (v128.andnot (local.get $p) (local.get $underflow)))

  ;; σ(g) and 1 − σ(g), each without cancellation: with e = exp(-|g|) and d = 1 / (1 + e) they are d and e·d, in the
  ;; order the sign of g says (1 − σ computed as a difference would lose its digits where σ is near 1).
  (func $sigmoid_and_complement (param $g v128) (result v128 v128)
    (local $e v128) (local $d v128) (local $ed v128) (local $nonnegative v128)
    (local.set $e (call $exp (f32x4.neg (f32x4.abs (local.get $g)))))
    (local.set $d (f32x4.div (v128.const f32x4 1 1 1 1) (f32x4.add (v128.const f32x4 1 1 1 1) (local.get $e))))
    (local.set $ed (f32x4.mul (local.get $e) (local.get $d)))
    (local.set $nonnegative (f32x4.ge (local.get $g) (v128.const f32x4 0 0 0 0)))
    (v128.bitselect (local.get $d) (local.get $ed) (local.get $nonnegative))
    (v128.bitselect (local.get $ed) (local.get $d) (local.get $nonnegative)))

  ;; out = exp(x − shift) for x − shift ≤ 88 (softmax terms: the shift is the row's max or its log-sum-exp)
  (func (export "exp_shifted") (param $x i32) (param $out i32) (param $vectors i32) (param $shift f32)
    (local $end i32) (local $s v128)
    (local.set $s (f32x4.splat (local.get $shift)))
    (local.set $end (i32.add (local.get $x) (i32.shl (local.get $vectors) (i32.const 4))))
    (block $done
      (loop $next
        (br_if $done (i32.ge_u (local.get $x) (local.get $end)))
        (v128.store (local.get $out) (call $exp (f32x4.sub (v128.load (local.get $x)) (local.get $s))))
        (local.set $x (i32.add (local.get $x) (i32.const 16)))
        (local.set $out (i32.add (local.get $out) (i32.const 16)))
        (br $next))))

  ;; out = g · σ(g) · up
  (func (export "swiglu") (param $gate i32) (param $up i32) (param $out i32) (param $vectors i32)
    (local $end i32) (local $g v128) (local $s v128)
    (local.set $end (i32.add (local.get $gate) (i32.shl (local.get $vectors) (i32.const 4))))
    (block $done
      (loop $next
        (br_if $done (i32.ge_u (local.get $gate) (local.get $end)))
        (local.set $g (v128.load (local.get $gate)))
        (call $sigmoid_and_complement (local.get $g))
        (drop)
        (local.set $s)
        (v128.store (local.get $out) (f32x4.mul (f32x4.mul (local.get $g) (local.get $s)) (v128.load (local.get $up))))
        (local.set $gate (i32.add (local.get $gate) (i32.const 16)))
        (local.set $up (i32.add (local.get $up) (i32.const 16)))
        (local.set $out (i32.add (local.get $out) (i32.const 16)))
        (br $next))))

  ;; dUp += dOut · g · σ(g);  dGate += dOut · up · σ(g) · (1 + g · (1 − σ(g)))
  (func (export "swiglu_backward") (param $gate i32) (param $up i32) (param $dOut i32) (param $dGate i32) (param $dUp i32)
                                   (param $vectors i32)
    (local $end i32) (local $g v128) (local $s v128) (local $c v128) (local $d v128)
    (local.set $end (i32.add (local.get $gate) (i32.shl (local.get $vectors) (i32.const 4))))
    (block $done
      (loop $next
        (br_if $done (i32.ge_u (local.get $gate) (local.get $end)))
        (local.set $g (v128.load (local.get $gate)))
        (call $sigmoid_and_complement (local.get $g))
        (local.set $c)
        (local.set $s)
        (local.set $d (v128.load (local.get $dOut)))
        (v128.store (local.get $dUp) (f32x4.add (v128.load (local.get $dUp))
          (f32x4.mul (f32x4.mul (local.get $d) (local.get $g)) (local.get $s))))
        (v128.store (local.get $dGate) (f32x4.add (v128.load (local.get $dGate))
          (f32x4.mul (f32x4.mul (f32x4.mul (local.get $d) (v128.load (local.get $up))) (local.get $s))
            (f32x4.add (v128.const f32x4 1 1 1 1)
              (f32x4.mul (local.get $g) (local.get $c))))))
        (local.set $gate (i32.add (local.get $gate) (i32.const 16)))
        (local.set $up (i32.add (local.get $up) (i32.const 16)))
        (local.set $dOut (i32.add (local.get $dOut) (i32.const 16)))
        (local.set $dGate (i32.add (local.get $dGate) (i32.const 16)))
        (local.set $dUp (i32.add (local.get $dUp) (i32.const 16)))
        (br $next))))
)
