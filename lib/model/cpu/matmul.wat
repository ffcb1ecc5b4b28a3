;; Four kernels on one shared memory: matmulNT, below, the portable linear layers' f32 product; linearBf16 and
;; linearF32, the system-BLAS backend's decoding products over bf16 and f32 weights; and matmulF64, at the end, every other portable product
;; with the JavaScript reference's bits (its own comment says how).
;;
;; matmulNT: out[n, m] = alpha · x[n, k] · w[m, k]ᵀ (+ out when accumulating), in f32 with 128-bit SIMD.
;;
;; Both operands are read along contiguous rows of k (W keeps the checkpoint's [out, in] layout), so each f32x4
;; accumulator holds four partial sums of one dot product, strided over k; the four lanes are added once at the end
;; and the k % 4 leftover products follow in scalar code. All pointers are byte offsets into this module's memory.
;;
;; Tiles (how many outputs one pass over k computes, i.e. how often each loaded vector is reused):
;;   4 rows × 2 columns  the main tile: 8 accumulators + 2 w vectors + the x vector in use = 11 of the 16 SIMD
;;                       registers x86-64 has, so nothing spills; each w vector feeds 4 rows, each x vector 2
;;                       columns. A 4 × 3 tile would need 12 + 3 + 1 = 16 and spill under V8's register allocator.
;;   1 row  × 4 columns  rows left over from the 4-row tiles (decoding 1-3 sequences is all leftover rows):
;;                       each x vector feeds 4 weights.
;;   1 row  × 1 column   whatever the two tiles above leave (an odd last column, the last m % 4 columns).
;; The 4-row tiles go through x in blocks of 32 rows, so a block of x stays in cache while W streams past it.

(module
  ;; Shared, so worker threads run this same code on the same memory (wasm-matmul.ts hands each a block of the output);
  ;; 65536 pages are the 4 GiB a 32-bit memory can address.
  (import "env" "memory" (memory 1 65536 shared))

  ;; Adds the four lanes of a dot product's accumulator.
  (func $sum_lanes (param $v v128) (result f32)
    (f32.add
      (f32.add (f32x4.extract_lane 0 (local.get $v)) (f32x4.extract_lane 1 (local.get $v)))
      (f32.add (f32x4.extract_lane 2 (local.get $v)) (f32x4.extract_lane 3 (local.get $v)))))

  ;; Σ x[j]·w[j] over the `count` (< 4) products the vector loop left, starting at byte offsets $x and $w.
  (func $tail_dot (param $x i32) (param $w i32) (param $count i32) (result f32)
    (local $sum f32)
    (block $done
      (loop $next
        (br_if $done (i32.eqz (local.get $count)))
        (local.set $sum (f32.add (local.get $sum)
          (f32.mul (f32.load (local.get $x)) (f32.load (local.get $w)))))
        (local.set $x (i32.add (local.get $x) (i32.const 4)))
        (local.set $w (i32.add (local.get $w) (i32.const 4)))
        (local.set $count (i32.sub (local.get $count) (i32.const 1)))
        (br $next)))
    (local.get $sum))

  ;; out = alpha·sum, or out + alpha·sum when accumulating.
  (func $store (param $out i32) (param $sum f32) (param $alpha f32) (param $accumulate i32)
    (local.set $sum (f32.mul (local.get $alpha) (local.get $sum)))
    (if (local.get $accumulate)
      (then (local.set $sum (f32.add (f32.load (local.get $out)) (local.get $sum)))))
    (f32.store (local.get $out) (local.get $sum)))

  ;; Rows x0..x3 (consecutive, $rowBytes apart) times weight rows w0, w1: the 4 × 2 outputs at $out
  ;; (rows $outRowBytes apart). $vectorBytes covers the k - k % 4 elements the vector loop takes.
  (func $tile_4x2 (param $x0 i32) (param $w0 i32) (param $out i32) (param $rowBytes i32) (param $vectorBytes i32)
                  (param $outRowBytes i32) (param $alpha f32) (param $accumulate i32)
    (local $x1 i32) (local $x2 i32) (local $x3 i32) (local $w1 i32) (local $j i32) (local $tail i32)
    (local $a v128) (local $b v128) (local $v v128)
    (local $s00 v128) (local $s01 v128) (local $s10 v128) (local $s11 v128)
    (local $s20 v128) (local $s21 v128) (local $s30 v128) (local $s31 v128)
    (local.set $x1 (i32.add (local.get $x0) (local.get $rowBytes)))
    (local.set $x2 (i32.add (local.get $x1) (local.get $rowBytes)))
    (local.set $x3 (i32.add (local.get $x2) (local.get $rowBytes)))
    (local.set $w1 (i32.add (local.get $w0) (local.get $rowBytes)))
    (block $done
      (loop $next
        (br_if $done (i32.ge_u (local.get $j) (local.get $vectorBytes)))
        (local.set $a (v128.load (i32.add (local.get $w0) (local.get $j))))
        (local.set $b (v128.load (i32.add (local.get $w1) (local.get $j))))
        (local.set $v (v128.load (i32.add (local.get $x0) (local.get $j))))
        (local.set $s00 (f32x4.add (local.get $s00) (f32x4.mul (local.get $v) (local.get $a))))
        (local.set $s01 (f32x4.add (local.get $s01) (f32x4.mul (local.get $v) (local.get $b))))
        (local.set $v (v128.load (i32.add (local.get $x1) (local.get $j))))
        (local.set $s10 (f32x4.add (local.get $s10) (f32x4.mul (local.get $v) (local.get $a))))
        (local.set $s11 (f32x4.add (local.get $s11) (f32x4.mul (local.get $v) (local.get $b))))
        (local.set $v (v128.load (i32.add (local.get $x2) (local.get $j))))
        (local.set $s20 (f32x4.add (local.get $s20) (f32x4.mul (local.get $v) (local.get $a))))
        (local.set $s21 (f32x4.add (local.get $s21) (f32x4.mul (local.get $v) (local.get $b))))
        (local.set $v (v128.load (i32.add (local.get $x3) (local.get $j))))
        (local.set $s30 (f32x4.add (local.get $s30) (f32x4.mul (local.get $v) (local.get $a))))
        (local.set $s31 (f32x4.add (local.get $s31) (f32x4.mul (local.get $v) (local.get $b))))
        (local.set $j (i32.add (local.get $j) (i32.const 16)))
        (br $next)))
    ;; The k % 4 leftover products, then the eight stores.
    (local.set $tail (i32.shr_u (i32.sub (local.get $rowBytes) (local.get $vectorBytes)) (i32.const 2)))
    (local.set $x0 (i32.add (local.get $x0) (local.get $j)))
    (local.set $x1 (i32.add (local.get $x1) (local.get $j)))
    (local.set $x2 (i32.add (local.get $x2) (local.get $j)))
    (local.set $x3 (i32.add (local.get $x3) (local.get $j)))
    (local.set $w0 (i32.add (local.get $w0) (local.get $j)))
    (local.set $w1 (i32.add (local.get $w1) (local.get $j)))
    (call $store (local.get $out)
      (f32.add (call $sum_lanes (local.get $s00)) (call $tail_dot (local.get $x0) (local.get $w0) (local.get $tail)))
      (local.get $alpha) (local.get $accumulate))
    (call $store (i32.add (local.get $out) (i32.const 4))
      (f32.add (call $sum_lanes (local.get $s01)) (call $tail_dot (local.get $x0) (local.get $w1) (local.get $tail)))
      (local.get $alpha) (local.get $accumulate))
    (local.set $out (i32.add (local.get $out) (local.get $outRowBytes)))
    (call $store (local.get $out)
      (f32.add (call $sum_lanes (local.get $s10)) (call $tail_dot (local.get $x1) (local.get $w0) (local.get $tail)))
      (local.get $alpha) (local.get $accumulate))
    (call $store (i32.add (local.get $out) (i32.const 4))
      (f32.add (call $sum_lanes (local.get $s11)) (call $tail_dot (local.get $x1) (local.get $w1) (local.get $tail)))
      (local.get $alpha) (local.get $accumulate))
    (local.set $out (i32.add (local.get $out) (local.get $outRowBytes)))
    (call $store (local.get $out)
      (f32.add (call $sum_lanes (local.get $s20)) (call $tail_dot (local.get $x2) (local.get $w0) (local.get $tail)))
      (local.get $alpha) (local.get $accumulate))
    (call $store (i32.add (local.get $out) (i32.const 4))
      (f32.add (call $sum_lanes (local.get $s21)) (call $tail_dot (local.get $x2) (local.get $w1) (local.get $tail)))
      (local.get $alpha) (local.get $accumulate))
    (local.set $out (i32.add (local.get $out) (local.get $outRowBytes)))
    (call $store (local.get $out)
      (f32.add (call $sum_lanes (local.get $s30)) (call $tail_dot (local.get $x3) (local.get $w0) (local.get $tail)))
      (local.get $alpha) (local.get $accumulate))
    (call $store (i32.add (local.get $out) (i32.const 4))
      (f32.add (call $sum_lanes (local.get $s31)) (call $tail_dot (local.get $x3) (local.get $w1) (local.get $tail)))
      (local.get $alpha) (local.get $accumulate)))

  ;; One row x0 times four consecutive weight rows: the 4 outputs at $out.
  (func $tile_1x4 (param $x0 i32) (param $w0 i32) (param $out i32) (param $rowBytes i32) (param $vectorBytes i32)
                  (param $alpha f32) (param $accumulate i32)
    (local $w1 i32) (local $w2 i32) (local $w3 i32) (local $j i32) (local $tail i32) (local $v v128)
    (local $s0 v128) (local $s1 v128) (local $s2 v128) (local $s3 v128)
    (local.set $w1 (i32.add (local.get $w0) (local.get $rowBytes)))
    (local.set $w2 (i32.add (local.get $w1) (local.get $rowBytes)))
    (local.set $w3 (i32.add (local.get $w2) (local.get $rowBytes)))
    (block $done
      (loop $next
        (br_if $done (i32.ge_u (local.get $j) (local.get $vectorBytes)))
        (local.set $v (v128.load (i32.add (local.get $x0) (local.get $j))))
        (local.set $s0 (f32x4.add (local.get $s0) (f32x4.mul (local.get $v) (v128.load (i32.add (local.get $w0) (local.get $j))))))
        (local.set $s1 (f32x4.add (local.get $s1) (f32x4.mul (local.get $v) (v128.load (i32.add (local.get $w1) (local.get $j))))))
        (local.set $s2 (f32x4.add (local.get $s2) (f32x4.mul (local.get $v) (v128.load (i32.add (local.get $w2) (local.get $j))))))
        (local.set $s3 (f32x4.add (local.get $s3) (f32x4.mul (local.get $v) (v128.load (i32.add (local.get $w3) (local.get $j))))))
        (local.set $j (i32.add (local.get $j) (i32.const 16)))
        (br $next)))
    (local.set $tail (i32.shr_u (i32.sub (local.get $rowBytes) (local.get $vectorBytes)) (i32.const 2)))
    (local.set $x0 (i32.add (local.get $x0) (local.get $j)))
    (call $store (local.get $out)
      (f32.add (call $sum_lanes (local.get $s0)) (call $tail_dot (local.get $x0) (i32.add (local.get $w0) (local.get $j)) (local.get $tail)))
      (local.get $alpha) (local.get $accumulate))
    (call $store (i32.add (local.get $out) (i32.const 4))
      (f32.add (call $sum_lanes (local.get $s1)) (call $tail_dot (local.get $x0) (i32.add (local.get $w1) (local.get $j)) (local.get $tail)))
      (local.get $alpha) (local.get $accumulate))
    (call $store (i32.add (local.get $out) (i32.const 8))
      (f32.add (call $sum_lanes (local.get $s2)) (call $tail_dot (local.get $x0) (i32.add (local.get $w2) (local.get $j)) (local.get $tail)))
      (local.get $alpha) (local.get $accumulate))
    (call $store (i32.add (local.get $out) (i32.const 12))
      (f32.add (call $sum_lanes (local.get $s3)) (call $tail_dot (local.get $x0) (i32.add (local.get $w3) (local.get $j)) (local.get $tail)))
      (local.get $alpha) (local.get $accumulate)))

  ;; One row times one weight row: the output at $out.
  (func $tile_1x1 (param $x0 i32) (param $w0 i32) (param $out i32) (param $rowBytes i32) (param $vectorBytes i32)
                  (param $alpha f32) (param $accumulate i32)
    (local $j i32) (local $s v128)
    (block $done
      (loop $next
        (br_if $done (i32.ge_u (local.get $j) (local.get $vectorBytes)))
        (local.set $s (f32x4.add (local.get $s)
          (f32x4.mul (v128.load (i32.add (local.get $x0) (local.get $j))) (v128.load (i32.add (local.get $w0) (local.get $j))))))
        (local.set $j (i32.add (local.get $j) (i32.const 16)))
        (br $next)))
    (call $store (local.get $out)
      (f32.add (call $sum_lanes (local.get $s))
        (call $tail_dot (i32.add (local.get $x0) (local.get $j)) (i32.add (local.get $w0) (local.get $j))
          (i32.shr_u (i32.sub (local.get $rowBytes) (local.get $vectorBytes)) (i32.const 2))))
      (local.get $alpha) (local.get $accumulate)))

  ;; The entry point: x at byte offset $x ([n, k] row-major), w at $w ([m, k]), out at $out ([n, m] in rows of $ldOut
  ;; elements, so a block of columns can be written into a wider output).
  (func (export "matmulNT") (param $x i32) (param $w i32) (param $out i32) (param $n i32) (param $k i32) (param $m i32)
                            (param $ldOut i32) (param $alpha f32) (param $accumulate i32)
    (local $rowBytes i32) (local $vectorBytes i32) (local $outRowBytes i32)
    (local $tiledRows i32) (local $blockStart i32) (local $blockEnd i32) (local $i i32) (local $c i32)
    (local.set $rowBytes (i32.shl (local.get $k) (i32.const 2)))
    (local.set $vectorBytes (i32.and (local.get $rowBytes) (i32.const -16)))
    (local.set $outRowBytes (i32.shl (local.get $ldOut) (i32.const 2)))
    (local.set $tiledRows (i32.and (local.get $n) (i32.const -4)))
    ;; Rows [0, tiledRows) in 4 × 2 tiles, 32 rows at a time; an odd last column row by row.
    (block $blocksDone
      (loop $nextBlock
        (br_if $blocksDone (i32.ge_u (local.get $blockStart) (local.get $tiledRows)))
        (local.set $blockEnd (select (local.get $tiledRows) (i32.add (local.get $blockStart) (i32.const 32))
          (i32.lt_u (local.get $tiledRows) (i32.add (local.get $blockStart) (i32.const 32)))))
        (local.set $c (i32.const 0))
        (block $columnsDone
          (loop $nextColumns
            (br_if $columnsDone (i32.ge_u (i32.add (local.get $c) (i32.const 1)) (local.get $m)))
            (local.set $i (local.get $blockStart))
            (block $rowsDone
              (loop $nextRows
                (br_if $rowsDone (i32.ge_u (local.get $i) (local.get $blockEnd)))
                (call $tile_4x2
                  (i32.add (local.get $x) (i32.mul (local.get $i) (local.get $rowBytes)))
                  (i32.add (local.get $w) (i32.mul (local.get $c) (local.get $rowBytes)))
                  (i32.add (local.get $out) (i32.shl (i32.add (i32.mul (local.get $i) (local.get $ldOut)) (local.get $c)) (i32.const 2)))
                  (local.get $rowBytes) (local.get $vectorBytes) (local.get $outRowBytes) (local.get $alpha) (local.get $accumulate))
                (local.set $i (i32.add (local.get $i) (i32.const 4)))
                (br $nextRows)))
            (local.set $c (i32.add (local.get $c) (i32.const 2)))
            (br $nextColumns)))
        (if (i32.lt_u (local.get $c) (local.get $m))
          (then
            (local.set $i (local.get $blockStart))
            (block $rowsDone
              (loop $nextRow
                (br_if $rowsDone (i32.ge_u (local.get $i) (local.get $blockEnd)))
                (call $tile_1x1
                  (i32.add (local.get $x) (i32.mul (local.get $i) (local.get $rowBytes)))
                  (i32.add (local.get $w) (i32.mul (local.get $c) (local.get $rowBytes)))
                  (i32.add (local.get $out) (i32.shl (i32.add (i32.mul (local.get $i) (local.get $ldOut)) (local.get $c)) (i32.const 2)))
                  (local.get $rowBytes) (local.get $vectorBytes) (local.get $alpha) (local.get $accumulate))
                (local.set $i (i32.add (local.get $i) (i32.const 1)))
                (br $nextRow)))))
        (local.set $blockStart (local.get $blockEnd))
        (br $nextBlock)))
    ;; Rows [tiledRows, n) one at a time: 1 × 4 tiles, then the last m % 4 columns one by one.
    (local.set $i (local.get $tiledRows))
    (block $rowsDone
      (loop $nextRow
        (br_if $rowsDone (i32.ge_u (local.get $i) (local.get $n)))
        (local.set $c (i32.const 0))
        (block $columnsDone
          (loop $nextColumns
            (br_if $columnsDone (i32.ge_u (i32.add (local.get $c) (i32.const 3)) (local.get $m)))
            (call $tile_1x4
              (i32.add (local.get $x) (i32.mul (local.get $i) (local.get $rowBytes)))
              (i32.add (local.get $w) (i32.mul (local.get $c) (local.get $rowBytes)))
              (i32.add (local.get $out) (i32.shl (i32.add (i32.mul (local.get $i) (local.get $ldOut)) (local.get $c)) (i32.const 2)))
              (local.get $rowBytes) (local.get $vectorBytes) (local.get $alpha) (local.get $accumulate))
            (local.set $c (i32.add (local.get $c) (i32.const 4)))
            (br $nextColumns)))
        (block $lastDone
          (loop $nextLast
            (br_if $lastDone (i32.ge_u (local.get $c) (local.get $m)))
            (call $tile_1x1
              (i32.add (local.get $x) (i32.mul (local.get $i) (local.get $rowBytes)))
              (i32.add (local.get $w) (i32.mul (local.get $c) (local.get $rowBytes)))
              (i32.add (local.get $out) (i32.shl (i32.add (i32.mul (local.get $i) (local.get $ldOut)) (local.get $c)) (i32.const 2)))
              (local.get $rowBytes) (local.get $vectorBytes) (local.get $alpha) (local.get $accumulate))
            (local.set $c (i32.add (local.get $c) (i32.const 1)))
            (br $nextLast)))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $nextRow))))

  ;; ---- out(i, j) = alpha · Σ_p a(i, p) · b(p, j) (+ out(i, j)), each sum in float64: the JavaScript products' bits ----
  ;; matmul.ts's products (matmulNT, matmulNNAccumulate, matmulTNAccumulate) sum each output in float64 over p in
  ;; order, then store alpha·sum (or out + alpha·sum) rounded to f32; matmulNNAccumulate and matmulTNAccumulate instead
  ;; add each product of their leftover rows (the last n % 4) straight into the f32 output, skipping zero factors
  ;; ("stepwise" below). Every lane here does exactly one output's arithmetic (f64x2 across neighbouring columns j,
  ;; never across the sum), so the results are the reference's bits whatever the tile, band or thread.
  ;; The sums use relaxed SIMD's fused multiply-add where the runtime has it (scripts/build-wasm.ts also assembles the
  ;; module with each written as a product then a sum): a product of two f32 values is exact in float64, so rounding
  ;; once after the add gives the same bits as the reference's separate multiply and add.
  ;; a(i, p) sits at a + i·aRow + p·aCol and out(i, j) at out + i·outRow + j·outCol (byte strides), so one body serves
  ;; x·Wᵀ (a = x; b = W transposed, or a = W and b = x transposed, writing out transposed), dOut·W and aᵀ·b; b's
  ;; rows (p) are $bRow bytes apart and contiguous along j, which is what the pairs load.

  ;; A float64 pair from the two f32 at $at.
  (func $pair (param $at i32) (result v128)
    (f64x2.promote_low_f32x4 (v128.load64_zero (local.get $at))))

  ;; The f32 at $at as a float64 in both lanes.
  (func $splat (param $at i32) (result v128)
    (f64x2.splat (f64.promote_f32 (f32.load (local.get $at)))))

  ;; The reference's store: alpha·sum, or out + alpha·sum when accumulating, rounded to f32 at $at.
  (func $store_sum (param $at i32) (param $sum f64) (param $alpha f64) (param $accumulate i32)
    (local.set $sum (f64.mul (local.get $alpha) (local.get $sum)))
    (if (local.get $accumulate)
      (then (local.set $sum (f64.add (f64.promote_f32 (f32.load (local.get $at))) (local.get $sum)))))
    (f32.store (local.get $at) (f32.demote_f64 (local.get $sum))))

  ;; A pair of sums: lane 0 at $at, lane 1 $step bytes further.
  (func $store_pair (param $at i32) (param $step i32) (param $sums v128) (param $alpha f64) (param $accumulate i32)
    (call $store_sum (local.get $at) (f64x2.extract_lane 0 (local.get $sums)) (local.get $alpha) (local.get $accumulate))
    (call $store_sum (i32.add (local.get $at) (local.get $step)) (f64x2.extract_lane 1 (local.get $sums))
      (local.get $alpha) (local.get $accumulate)))

  ;; Rows a0..a3 ($aRow bytes apart) times columns j..j+3 of b (from $b0): 16 sums over $k values of p.
  (func $sums_4x4 (param $a0 i32) (param $aRow i32) (param $aCol i32) (param $b0 i32) (param $bRow i32) (param $k i32)
                  (param $out i32) (param $outRow i32) (param $outCol i32) (param $alpha f64) (param $accumulate i32)
    (local $a1 i32) (local $a2 i32) (local $a3 i32) (local $p i32) (local $lo v128) (local $hi v128) (local $x v128)
    (local $s0l v128) (local $s0h v128) (local $s1l v128) (local $s1h v128)
    (local $s2l v128) (local $s2h v128) (local $s3l v128) (local $s3h v128)
    (local.set $a1 (i32.add (local.get $a0) (local.get $aRow)))
    (local.set $a2 (i32.add (local.get $a1) (local.get $aRow)))
    (local.set $a3 (i32.add (local.get $a2) (local.get $aRow)))
    (block $done
      (loop $next
        (br_if $done (i32.ge_u (local.get $p) (local.get $k)))
        (local.set $lo (call $pair (local.get $b0)))
        (local.set $hi (call $pair (i32.add (local.get $b0) (i32.const 8))))
        (local.set $x (call $splat (local.get $a0)))
        (local.set $s0l (f64x2.relaxed_madd (local.get $x) (local.get $lo) (local.get $s0l)))
        (local.set $s0h (f64x2.relaxed_madd (local.get $x) (local.get $hi) (local.get $s0h)))
        (local.set $x (call $splat (local.get $a1)))
        (local.set $s1l (f64x2.relaxed_madd (local.get $x) (local.get $lo) (local.get $s1l)))
        (local.set $s1h (f64x2.relaxed_madd (local.get $x) (local.get $hi) (local.get $s1h)))
        (local.set $x (call $splat (local.get $a2)))
        (local.set $s2l (f64x2.relaxed_madd (local.get $x) (local.get $lo) (local.get $s2l)))
        (local.set $s2h (f64x2.relaxed_madd (local.get $x) (local.get $hi) (local.get $s2h)))
        (local.set $x (call $splat (local.get $a3)))
        (local.set $s3l (f64x2.relaxed_madd (local.get $x) (local.get $lo) (local.get $s3l)))
        (local.set $s3h (f64x2.relaxed_madd (local.get $x) (local.get $hi) (local.get $s3h)))
        (local.set $a0 (i32.add (local.get $a0) (local.get $aCol)))
        (local.set $a1 (i32.add (local.get $a1) (local.get $aCol)))
        (local.set $a2 (i32.add (local.get $a2) (local.get $aCol)))
        (local.set $a3 (i32.add (local.get $a3) (local.get $aCol)))
        (local.set $b0 (i32.add (local.get $b0) (local.get $bRow)))
        (local.set $p (i32.add (local.get $p) (i32.const 1)))
        (br $next)))
    (call $store_pair (local.get $out) (local.get $outCol) (local.get $s0l) (local.get $alpha) (local.get $accumulate))
    (call $store_pair (i32.add (local.get $out) (i32.shl (local.get $outCol) (i32.const 1))) (local.get $outCol) (local.get $s0h)
      (local.get $alpha) (local.get $accumulate))
    (local.set $out (i32.add (local.get $out) (local.get $outRow)))
    (call $store_pair (local.get $out) (local.get $outCol) (local.get $s1l) (local.get $alpha) (local.get $accumulate))
    (call $store_pair (i32.add (local.get $out) (i32.shl (local.get $outCol) (i32.const 1))) (local.get $outCol) (local.get $s1h)
      (local.get $alpha) (local.get $accumulate))
    (local.set $out (i32.add (local.get $out) (local.get $outRow)))
    (call $store_pair (local.get $out) (local.get $outCol) (local.get $s2l) (local.get $alpha) (local.get $accumulate))
    (call $store_pair (i32.add (local.get $out) (i32.shl (local.get $outCol) (i32.const 1))) (local.get $outCol) (local.get $s2h)
      (local.get $alpha) (local.get $accumulate))
    (local.set $out (i32.add (local.get $out) (local.get $outRow)))
    (call $store_pair (local.get $out) (local.get $outCol) (local.get $s3l) (local.get $alpha) (local.get $accumulate))
    (call $store_pair (i32.add (local.get $out) (i32.shl (local.get $outCol) (i32.const 1))) (local.get $outCol) (local.get $s3h)
      (local.get $alpha) (local.get $accumulate)))

  ;; Rows a0..a3 times one column of b: 4 sums (rows a0, a1 in one pair, a2, a3 in the other).
  (func $sums_4x1 (param $a0 i32) (param $aRow i32) (param $aCol i32) (param $b0 i32) (param $bRow i32) (param $k i32)
                  (param $out i32) (param $outRow i32) (param $alpha f64) (param $accumulate i32)
    (local $a1 i32) (local $a2 i32) (local $a3 i32) (local $p i32) (local $b v128) (local $s01 v128) (local $s23 v128)
    (local.set $a1 (i32.add (local.get $a0) (local.get $aRow)))
    (local.set $a2 (i32.add (local.get $a1) (local.get $aRow)))
    (local.set $a3 (i32.add (local.get $a2) (local.get $aRow)))
    (block $done
      (loop $next
        (br_if $done (i32.ge_u (local.get $p) (local.get $k)))
        (local.set $b (call $splat (local.get $b0)))
        (local.set $s01 (f64x2.relaxed_madd (local.get $b)
          (f64x2.replace_lane 1 (call $splat (local.get $a0)) (f64.promote_f32 (f32.load (local.get $a1)))) (local.get $s01)))
        (local.set $s23 (f64x2.relaxed_madd (local.get $b)
          (f64x2.replace_lane 1 (call $splat (local.get $a2)) (f64.promote_f32 (f32.load (local.get $a3)))) (local.get $s23)))
        (local.set $a0 (i32.add (local.get $a0) (local.get $aCol)))
        (local.set $a1 (i32.add (local.get $a1) (local.get $aCol)))
        (local.set $a2 (i32.add (local.get $a2) (local.get $aCol)))
        (local.set $a3 (i32.add (local.get $a3) (local.get $aCol)))
        (local.set $b0 (i32.add (local.get $b0) (local.get $bRow)))
        (local.set $p (i32.add (local.get $p) (i32.const 1)))
        (br $next)))
    (call $store_pair (local.get $out) (local.get $outRow) (local.get $s01) (local.get $alpha) (local.get $accumulate))
    (call $store_pair (i32.add (local.get $out) (i32.shl (local.get $outRow) (i32.const 1))) (local.get $outRow) (local.get $s23)
      (local.get $alpha) (local.get $accumulate)))

  ;; One row a0 times columns j..j+1 of b: 2 sums in one pair.
  (func $sums_1x2 (param $a0 i32) (param $aCol i32) (param $b0 i32) (param $bRow i32) (param $k i32)
                  (param $out i32) (param $outCol i32) (param $alpha f64) (param $accumulate i32)
    (local $p i32) (local $s v128)
    (block $done
      (loop $next
        (br_if $done (i32.ge_u (local.get $p) (local.get $k)))
        (local.set $s (f64x2.relaxed_madd (call $splat (local.get $a0)) (call $pair (local.get $b0)) (local.get $s)))
        (local.set $a0 (i32.add (local.get $a0) (local.get $aCol)))
        (local.set $b0 (i32.add (local.get $b0) (local.get $bRow)))
        (local.set $p (i32.add (local.get $p) (i32.const 1)))
        (br $next)))
    (call $store_pair (local.get $out) (local.get $outCol) (local.get $s) (local.get $alpha) (local.get $accumulate)))

  ;; One row a0 times columns j..j+7 of b: 8 sums in four pairs.
  (func $sums_1x8 (param $a0 i32) (param $aCol i32) (param $b0 i32) (param $bRow i32) (param $k i32)
                  (param $out i32) (param $outCol i32) (param $alpha f64) (param $accumulate i32)
    (local $p i32) (local $x v128) (local $s0 v128) (local $s1 v128) (local $s2 v128) (local $s3 v128)
    (block $done
      (loop $next
        (br_if $done (i32.ge_u (local.get $p) (local.get $k)))
        (local.set $x (call $splat (local.get $a0)))
        (local.set $s0 (f64x2.relaxed_madd (local.get $x) (call $pair (local.get $b0)) (local.get $s0)))
        (local.set $s1 (f64x2.relaxed_madd (local.get $x) (call $pair (i32.add (local.get $b0) (i32.const 8))) (local.get $s1)))
        (local.set $s2 (f64x2.relaxed_madd (local.get $x) (call $pair (i32.add (local.get $b0) (i32.const 16))) (local.get $s2)))
        (local.set $s3 (f64x2.relaxed_madd (local.get $x) (call $pair (i32.add (local.get $b0) (i32.const 24))) (local.get $s3)))
        (local.set $a0 (i32.add (local.get $a0) (local.get $aCol)))
        (local.set $b0 (i32.add (local.get $b0) (local.get $bRow)))
        (local.set $p (i32.add (local.get $p) (i32.const 1)))
        (br $next)))
    (call $store_pair (local.get $out) (local.get $outCol) (local.get $s0) (local.get $alpha) (local.get $accumulate))
    (local.set $out (i32.add (local.get $out) (i32.shl (local.get $outCol) (i32.const 1))))
    (call $store_pair (local.get $out) (local.get $outCol) (local.get $s1) (local.get $alpha) (local.get $accumulate))
    (local.set $out (i32.add (local.get $out) (i32.shl (local.get $outCol) (i32.const 1))))
    (call $store_pair (local.get $out) (local.get $outCol) (local.get $s2) (local.get $alpha) (local.get $accumulate))
    (local.set $out (i32.add (local.get $out) (i32.shl (local.get $outCol) (i32.const 1))))
    (call $store_pair (local.get $out) (local.get $outCol) (local.get $s3) (local.get $alpha) (local.get $accumulate)))

  ;; One row a0 times one column of b: 1 sum.
  (func $sums_1x1 (param $a0 i32) (param $aCol i32) (param $b0 i32) (param $bRow i32) (param $k i32)
                  (param $out i32) (param $alpha f64) (param $accumulate i32)
    (local $p i32) (local $s f64)
    (block $done
      (loop $next
        (br_if $done (i32.ge_u (local.get $p) (local.get $k)))
        (local.set $s (f64.add (local.get $s)
          (f64.mul (f64.promote_f32 (f32.load (local.get $a0))) (f64.promote_f32 (f32.load (local.get $b0))))))
        (local.set $a0 (i32.add (local.get $a0) (local.get $aCol)))
        (local.set $b0 (i32.add (local.get $b0) (local.get $bRow)))
        (local.set $p (i32.add (local.get $p) (i32.const 1)))
        (br $next)))
    (call $store_sum (local.get $out) (local.get $s) (local.get $alpha) (local.get $accumulate)))

  ;; The f32 pair at $at plus the float64 pair $sum, rounded to f32 and stored back.
  (func $add_pair (param $at i32) (param $sum v128)
    (v128.store64_lane 0 (local.get $at)
      (f32x4.demote_f64x2_zero (f64x2.add (call $pair (local.get $at)) (local.get $sum)))))

  ;; One stepwise row: for each p, out[j] += x · b[p, j] straight into f32 (x = 0 skipped), as the reference's leftover
  ;; rows do; out contiguous along j.
  (func $stepwise_row (param $a0 i32) (param $aCol i32) (param $b0 i32) (param $bRow i32) (param $k i32) (param $m i32)
                      (param $out i32)
    (local $p i32) (local $x f32) (local $xx v128) (local $j i32) (local $pairs i32)
    (local.set $pairs (i32.shl (i32.and (local.get $m) (i32.const -2)) (i32.const 2)))
    (block $done
      (loop $next
        (br_if $done (i32.ge_u (local.get $p) (local.get $k)))
        (local.set $x (f32.load (local.get $a0)))
        (if (f32.ne (local.get $x) (f32.const 0))
          (then
            (local.set $xx (f64x2.splat (f64.promote_f32 (local.get $x))))
            (local.set $j (i32.const 0))
            (block $pairsDone
              (loop $nextPair
                (br_if $pairsDone (i32.ge_u (local.get $j) (local.get $pairs)))
                (call $add_pair (i32.add (local.get $out) (local.get $j))
                  (f64x2.mul (local.get $xx) (call $pair (i32.add (local.get $b0) (local.get $j)))))
                (local.set $j (i32.add (local.get $j) (i32.const 8)))
                (br $nextPair)))
            (if (i32.and (local.get $m) (i32.const 1))
              (then
                (call $store_sum (i32.add (local.get $out) (local.get $j))
                  (f64.mul (f64.promote_f32 (local.get $x)) (f64.promote_f32 (f32.load (i32.add (local.get $b0) (local.get $j)))))
                  (f64.const 1) (i32.const 1))))))
        (local.set $a0 (i32.add (local.get $a0) (local.get $aCol)))
        (local.set $b0 (i32.add (local.get $b0) (local.get $bRow)))
        (local.set $p (i32.add (local.get $p) (i32.const 1)))
        (br $next))))

  ;; linearF32 and linearBf16: out[r·m + j] = Σ_i x[r·k + i] · w[j·k + i] for the n ≤ 4 rows of x, w in f32 or in bf16
  ;; (each u16 the high half of the f32 it stands for), k a multiple of 8: the system-BLAS backend's decoding products.
  ;; Decoding multiplies a few rows by every weight once per token, so it is bound by reading the weights, and
  ;; OpenBLAS's sgemm/sgemv read them at only 7-11 GB/s on one core of these machines (they pack or tile for larger
  ;; products). Each step takes 32 bytes of x's rows (8 values) against 8 weights: two f32x4 loads, or one 16-byte
  ;; load of bf16 widened to two f32x4 by shifting each into the high half of a lane (half the bytes). Each row sums
  ;; into two accumulators (two independent chains of relaxed multiply-adds hide their latency), whose lanes are added
  ;; at the end. 1 or 2 rows take a loop of 2 rows, 3 or 4 one of 4; rows past n read row 0 again and are not stored.
  ;; Measured for f32 on the 20M model's layers, one core: 1-2 rows ~29 GB/s, 3 ~24, 4 ~17, against sgemm's 7-11; a
  ;; loop of 4 rows serving 1 does 4 rows' multiply-adds for the bytes of one (4 → 2.3 ms a pass), and 8 accumulators
  ;; over 2 weight rows ran at half the speed under V8's register allocator.
  (func (export "linearF32") (param $x i32) (param $w i32) (param $out i32) (param $n i32) (param $k i32) (param $m i32)
    (if (i32.le_u (local.get $n) (i32.const 2))
      (then (call $linear_f32_rows2 (local.get $x) (local.get $w) (local.get $out) (local.get $n) (local.get $k) (local.get $m)))
      (else (call $linear_f32_rows4 (local.get $x) (local.get $w) (local.get $out) (local.get $n) (local.get $k) (local.get $m)))))

  (func (export "linearBf16") (param $x i32) (param $w i32) (param $out i32) (param $n i32) (param $k i32) (param $m i32)
    (if (i32.le_u (local.get $n) (i32.const 2))
      (then (call $linear_bf16_rows2 (local.get $x) (local.get $w) (local.get $out) (local.get $n) (local.get $k) (local.get $m)))
      (else (call $linear_bf16_rows4 (local.get $x) (local.get $w) (local.get $out) (local.get $n) (local.get $k) (local.get $m)))))

  (func $linear_f32_rows2 (param $x i32) (param $w i32) (param $out i32) (param $n i32) (param $k i32) (param $m i32)
    (local $j i32) (local $i i32) (local $rowBytes i32) (local $x0 i32) (local $x1 i32) (local $lo v128) (local $hi v128)
    (local $a0 v128) (local $b0 v128) (local $a1 v128) (local $b1 v128)
    (local.set $rowBytes (i32.shl (local.get $k) (i32.const 2)))
    (local.set $x0 (local.get $x))
    (local.set $x1 (select (i32.add (local.get $x0) (local.get $rowBytes)) (local.get $x) (i32.gt_u (local.get $n) (i32.const 1))))
    (block $doneColumns
      (loop $nextColumn
        (br_if $doneColumns (i32.ge_u (local.get $j) (local.get $m)))
        (local.set $a0 (v128.const i32x4 0 0 0 0)) (local.set $b0 (v128.const i32x4 0 0 0 0))
        (local.set $a1 (v128.const i32x4 0 0 0 0)) (local.set $b1 (v128.const i32x4 0 0 0 0))
        (local.set $i (i32.const 0))
        (block $doneSum
          (loop $nextVector
            (br_if $doneSum (i32.ge_u (local.get $i) (local.get $rowBytes)))
            (local.set $lo (v128.load (i32.add (local.get $w) (local.get $i))))
            (local.set $hi (v128.load offset=16 (i32.add (local.get $w) (local.get $i))))
            (local.set $a0 (f32x4.relaxed_madd (local.get $lo) (v128.load (i32.add (local.get $x0) (local.get $i))) (local.get $a0)))
            (local.set $b0 (f32x4.relaxed_madd (local.get $hi) (v128.load offset=16 (i32.add (local.get $x0) (local.get $i))) (local.get $b0)))
            (local.set $a1 (f32x4.relaxed_madd (local.get $lo) (v128.load (i32.add (local.get $x1) (local.get $i))) (local.get $a1)))
            (local.set $b1 (f32x4.relaxed_madd (local.get $hi) (v128.load offset=16 (i32.add (local.get $x1) (local.get $i))) (local.get $b1)))
            (local.set $i (i32.add (local.get $i) (i32.const 32)))
            (br $nextVector)))
        (f32.store (i32.add (local.get $out) (i32.shl (local.get $j) (i32.const 2)))
          (call $sum_lanes (f32x4.add (local.get $a0) (local.get $b0))))
        (if (i32.gt_u (local.get $n) (i32.const 1)) (then
          (f32.store (i32.add (local.get $out) (i32.shl (i32.add (i32.mul (local.get $m) (i32.const 1)) (local.get $j)) (i32.const 2)))
            (call $sum_lanes (f32x4.add (local.get $a1) (local.get $b1))))))
        (local.set $w (i32.add (local.get $w) (local.get $rowBytes)))
        (local.set $j (i32.add (local.get $j) (i32.const 1)))
        (br $nextColumn))))

  (func $linear_f32_rows4 (param $x i32) (param $w i32) (param $out i32) (param $n i32) (param $k i32) (param $m i32)
    (local $j i32) (local $i i32) (local $rowBytes i32) (local $x0 i32) (local $x1 i32) (local $x2 i32) (local $x3 i32) (local $lo v128) (local $hi v128)
    (local $a0 v128) (local $b0 v128) (local $a1 v128) (local $b1 v128) (local $a2 v128) (local $b2 v128) (local $a3 v128) (local $b3 v128)
    (local.set $rowBytes (i32.shl (local.get $k) (i32.const 2)))
    (local.set $x0 (local.get $x))
    (local.set $x1 (select (i32.add (local.get $x0) (local.get $rowBytes)) (local.get $x) (i32.gt_u (local.get $n) (i32.const 1))))
    (local.set $x2 (select (i32.add (local.get $x1) (local.get $rowBytes)) (local.get $x) (i32.gt_u (local.get $n) (i32.const 2))))
    (local.set $x3 (select (i32.add (local.get $x2) (local.get $rowBytes)) (local.get $x) (i32.gt_u (local.get $n) (i32.const 3))))
    (block $doneColumns
      (loop $nextColumn
        (br_if $doneColumns (i32.ge_u (local.get $j) (local.get $m)))
        (local.set $a0 (v128.const i32x4 0 0 0 0)) (local.set $b0 (v128.const i32x4 0 0 0 0))
        (local.set $a1 (v128.const i32x4 0 0 0 0)) (local.set $b1 (v128.const i32x4 0 0 0 0))
        (local.set $a2 (v128.const i32x4 0 0 0 0)) (local.set $b2 (v128.const i32x4 0 0 0 0))
        (local.set $a3 (v128.const i32x4 0 0 0 0)) (local.set $b3 (v128.const i32x4 0 0 0 0))
        (local.set $i (i32.const 0))
        (block $doneSum
          (loop $nextVector
            (br_if $doneSum (i32.ge_u (local.get $i) (local.get $rowBytes)))
            (local.set $lo (v128.load (i32.add (local.get $w) (local.get $i))))
            (local.set $hi (v128.load offset=16 (i32.add (local.get $w) (local.get $i))))
            (local.set $a0 (f32x4.relaxed_madd (local.get $lo) (v128.load (i32.add (local.get $x0) (local.get $i))) (local.get $a0)))
            (local.set $b0 (f32x4.relaxed_madd (local.get $hi) (v128.load offset=16 (i32.add (local.get $x0) (local.get $i))) (local.get $b0)))
            (local.set $a1 (f32x4.relaxed_madd (local.get $lo) (v128.load (i32.add (local.get $x1) (local.get $i))) (local.get $a1)))
            (local.set $b1 (f32x4.relaxed_madd (local.get $hi) (v128.load offset=16 (i32.add (local.get $x1) (local.get $i))) (local.get $b1)))
            (local.set $a2 (f32x4.relaxed_madd (local.get $lo) (v128.load (i32.add (local.get $x2) (local.get $i))) (local.get $a2)))
            (local.set $b2 (f32x4.relaxed_madd (local.get $hi) (v128.load offset=16 (i32.add (local.get $x2) (local.get $i))) (local.get $b2)))
            (local.set $a3 (f32x4.relaxed_madd (local.get $lo) (v128.load (i32.add (local.get $x3) (local.get $i))) (local.get $a3)))
            (local.set $b3 (f32x4.relaxed_madd (local.get $hi) (v128.load offset=16 (i32.add (local.get $x3) (local.get $i))) (local.get $b3)))
            (local.set $i (i32.add (local.get $i) (i32.const 32)))
            (br $nextVector)))
        (f32.store (i32.add (local.get $out) (i32.shl (local.get $j) (i32.const 2)))
          (call $sum_lanes (f32x4.add (local.get $a0) (local.get $b0))))
        (if (i32.gt_u (local.get $n) (i32.const 1)) (then
          (f32.store (i32.add (local.get $out) (i32.shl (i32.add (i32.mul (local.get $m) (i32.const 1)) (local.get $j)) (i32.const 2)))
            (call $sum_lanes (f32x4.add (local.get $a1) (local.get $b1))))))
        (if (i32.gt_u (local.get $n) (i32.const 2)) (then
          (f32.store (i32.add (local.get $out) (i32.shl (i32.add (i32.mul (local.get $m) (i32.const 2)) (local.get $j)) (i32.const 2)))
            (call $sum_lanes (f32x4.add (local.get $a2) (local.get $b2))))))
        (if (i32.gt_u (local.get $n) (i32.const 3)) (then
          (f32.store (i32.add (local.get $out) (i32.shl (i32.add (i32.mul (local.get $m) (i32.const 3)) (local.get $j)) (i32.const 2)))
            (call $sum_lanes (f32x4.add (local.get $a3) (local.get $b3))))))
        (local.set $w (i32.add (local.get $w) (local.get $rowBytes)))
        (local.set $j (i32.add (local.get $j) (i32.const 1)))
        (br $nextColumn))))

  (func $linear_bf16_rows2 (param $x i32) (param $w i32) (param $out i32) (param $n i32) (param $k i32) (param $m i32)
    (local $j i32) (local $i i32) (local $rowBytes i32) (local $x0 i32) (local $x1 i32) (local $v v128) (local $lo v128) (local $hi v128)
    (local $a0 v128) (local $b0 v128) (local $a1 v128) (local $b1 v128)
    (local.set $rowBytes (i32.shl (local.get $k) (i32.const 2)))
    (local.set $x0 (local.get $x))
    (local.set $x1 (select (i32.add (local.get $x0) (local.get $rowBytes)) (local.get $x) (i32.gt_u (local.get $n) (i32.const 1))))
    (block $doneColumns
      (loop $nextColumn
        (br_if $doneColumns (i32.ge_u (local.get $j) (local.get $m)))
        (local.set $a0 (v128.const i32x4 0 0 0 0)) (local.set $b0 (v128.const i32x4 0 0 0 0))
        (local.set $a1 (v128.const i32x4 0 0 0 0)) (local.set $b1 (v128.const i32x4 0 0 0 0))
        (local.set $i (i32.const 0))
        (block $doneSum
          (loop $nextVector
            (br_if $doneSum (i32.ge_u (local.get $i) (local.get $rowBytes)))
            ;; $i walks x's bytes (4 a value); the weights' bytes are half as far in
            (local.set $v (v128.load (i32.add (local.get $w) (i32.shr_u (local.get $i) (i32.const 1)))))
            (local.set $lo (i32x4.shl (i32x4.extend_low_i16x8_u (local.get $v)) (i32.const 16)))
            (local.set $hi (i32x4.shl (i32x4.extend_high_i16x8_u (local.get $v)) (i32.const 16)))
            (local.set $a0 (f32x4.relaxed_madd (local.get $lo) (v128.load (i32.add (local.get $x0) (local.get $i))) (local.get $a0)))
            (local.set $b0 (f32x4.relaxed_madd (local.get $hi) (v128.load offset=16 (i32.add (local.get $x0) (local.get $i))) (local.get $b0)))
            (local.set $a1 (f32x4.relaxed_madd (local.get $lo) (v128.load (i32.add (local.get $x1) (local.get $i))) (local.get $a1)))
            (local.set $b1 (f32x4.relaxed_madd (local.get $hi) (v128.load offset=16 (i32.add (local.get $x1) (local.get $i))) (local.get $b1)))
            (local.set $i (i32.add (local.get $i) (i32.const 32)))
            (br $nextVector)))
        (f32.store (i32.add (local.get $out) (i32.shl (local.get $j) (i32.const 2)))
          (call $sum_lanes (f32x4.add (local.get $a0) (local.get $b0))))
        (if (i32.gt_u (local.get $n) (i32.const 1)) (then
          (f32.store (i32.add (local.get $out) (i32.shl (i32.add (i32.mul (local.get $m) (i32.const 1)) (local.get $j)) (i32.const 2)))
            (call $sum_lanes (f32x4.add (local.get $a1) (local.get $b1))))))
        (local.set $w (i32.add (local.get $w) (i32.shr_u (local.get $rowBytes) (i32.const 1))))
        (local.set $j (i32.add (local.get $j) (i32.const 1)))
        (br $nextColumn))))

  (func $linear_bf16_rows4 (param $x i32) (param $w i32) (param $out i32) (param $n i32) (param $k i32) (param $m i32)
    (local $j i32) (local $i i32) (local $rowBytes i32) (local $x0 i32) (local $x1 i32) (local $x2 i32) (local $x3 i32) (local $v v128) (local $lo v128) (local $hi v128)
    (local $a0 v128) (local $b0 v128) (local $a1 v128) (local $b1 v128) (local $a2 v128) (local $b2 v128) (local $a3 v128) (local $b3 v128)
    (local.set $rowBytes (i32.shl (local.get $k) (i32.const 2)))
    (local.set $x0 (local.get $x))
    (local.set $x1 (select (i32.add (local.get $x0) (local.get $rowBytes)) (local.get $x) (i32.gt_u (local.get $n) (i32.const 1))))
    (local.set $x2 (select (i32.add (local.get $x1) (local.get $rowBytes)) (local.get $x) (i32.gt_u (local.get $n) (i32.const 2))))
    (local.set $x3 (select (i32.add (local.get $x2) (local.get $rowBytes)) (local.get $x) (i32.gt_u (local.get $n) (i32.const 3))))
    (block $doneColumns
      (loop $nextColumn
        (br_if $doneColumns (i32.ge_u (local.get $j) (local.get $m)))
        (local.set $a0 (v128.const i32x4 0 0 0 0)) (local.set $b0 (v128.const i32x4 0 0 0 0))
        (local.set $a1 (v128.const i32x4 0 0 0 0)) (local.set $b1 (v128.const i32x4 0 0 0 0))
        (local.set $a2 (v128.const i32x4 0 0 0 0)) (local.set $b2 (v128.const i32x4 0 0 0 0))
        (local.set $a3 (v128.const i32x4 0 0 0 0)) (local.set $b3 (v128.const i32x4 0 0 0 0))
        (local.set $i (i32.const 0))
        (block $doneSum
          (loop $nextVector
            (br_if $doneSum (i32.ge_u (local.get $i) (local.get $rowBytes)))
            ;; $i walks x's bytes (4 a value); the weights' bytes are half as far in
            (local.set $v (v128.load (i32.add (local.get $w) (i32.shr_u (local.get $i) (i32.const 1)))))
            (local.set $lo (i32x4.shl (i32x4.extend_low_i16x8_u (local.get $v)) (i32.const 16)))
            (local.set $hi (i32x4.shl (i32x4.extend_high_i16x8_u (local.get $v)) (i32.const 16)))
            (local.set $a0 (f32x4.relaxed_madd (local.get $lo) (v128.load (i32.add (local.get $x0) (local.get $i))) (local.get $a0)))
            (local.set $b0 (f32x4.relaxed_madd (local.get $hi) (v128.load offset=16 (i32.add (local.get $x0) (local.get $i))) (local.get $b0)))
            (local.set $a1 (f32x4.relaxed_madd (local.get $lo) (v128.load (i32.add (local.get $x1) (local.get $i))) (local.get $a1)))
            (local.set $b1 (f32x4.relaxed_madd (local.get $hi) (v128.load offset=16 (i32.add (local.get $x1) (local.get $i))) (local.get $b1)))
            (local.set $a2 (f32x4.relaxed_madd (local.get $lo) (v128.load (i32.add (local.get $x2) (local.get $i))) (local.get $a2)))
            (local.set $b2 (f32x4.relaxed_madd (local.get $hi) (v128.load offset=16 (i32.add (local.get $x2) (local.get $i))) (local.get $b2)))
            (local.set $a3 (f32x4.relaxed_madd (local.get $lo) (v128.load (i32.add (local.get $x3) (local.get $i))) (local.get $a3)))
            (local.set $b3 (f32x4.relaxed_madd (local.get $hi) (v128.load offset=16 (i32.add (local.get $x3) (local.get $i))) (local.get $b3)))
            (local.set $i (i32.add (local.get $i) (i32.const 32)))
            (br $nextVector)))
        (f32.store (i32.add (local.get $out) (i32.shl (local.get $j) (i32.const 2)))
          (call $sum_lanes (f32x4.add (local.get $a0) (local.get $b0))))
        (if (i32.gt_u (local.get $n) (i32.const 1)) (then
          (f32.store (i32.add (local.get $out) (i32.shl (i32.add (i32.mul (local.get $m) (i32.const 1)) (local.get $j)) (i32.const 2)))
            (call $sum_lanes (f32x4.add (local.get $a1) (local.get $b1))))))
        (if (i32.gt_u (local.get $n) (i32.const 2)) (then
          (f32.store (i32.add (local.get $out) (i32.shl (i32.add (i32.mul (local.get $m) (i32.const 2)) (local.get $j)) (i32.const 2)))
            (call $sum_lanes (f32x4.add (local.get $a2) (local.get $b2))))))
        (if (i32.gt_u (local.get $n) (i32.const 3)) (then
          (f32.store (i32.add (local.get $out) (i32.shl (i32.add (i32.mul (local.get $m) (i32.const 3)) (local.get $j)) (i32.const 2)))
            (call $sum_lanes (f32x4.add (local.get $a3) (local.get $b3))))))
        (local.set $w (i32.add (local.get $w) (i32.shr_u (local.get $rowBytes) (i32.const 1))))
        (local.set $j (i32.add (local.get $j) (i32.const 1)))
        (br $nextColumn))))

  ;; The entry point: out(i, j) for i < n, j < m over p < k, strides in elements. $flags: 1 accumulate, 2 stepwise
  ;; leftover rows (which the reference only has with alpha 1 and accumulation, and out contiguous along j).
  (func (export "matmulF64") (param $a i32) (param $b i32) (param $out i32) (param $n i32) (param $k i32) (param $m i32)
                             (param $aRow i32) (param $aCol i32) (param $bRow i32) (param $outRow i32) (param $outCol i32)
                             (param $alpha f64) (param $flags i32)
    (local $accumulate i32) (local $i i32) (local $j i32) (local $rowA i32) (local $rowOut i32)
    (local.set $accumulate (i32.and (local.get $flags) (i32.const 1)))
    (local.set $aRow (i32.shl (local.get $aRow) (i32.const 2)))
    (local.set $aCol (i32.shl (local.get $aCol) (i32.const 2)))
    (local.set $bRow (i32.shl (local.get $bRow) (i32.const 2)))
    (local.set $outRow (i32.shl (local.get $outRow) (i32.const 2)))
    (local.set $outCol (i32.shl (local.get $outCol) (i32.const 2)))
    ;; Rows in fours: 4 × 4 tiles, then the last m % 4 columns one by one.
    (block $tilesDone
      (loop $nextRows
        (br_if $tilesDone (i32.ge_u (i32.add (local.get $i) (i32.const 3)) (local.get $n)))
        (local.set $rowA (i32.add (local.get $a) (i32.mul (local.get $i) (local.get $aRow))))
        (local.set $rowOut (i32.add (local.get $out) (i32.mul (local.get $i) (local.get $outRow))))
        (local.set $j (i32.const 0))
        (block $columnsDone
          (loop $nextColumns
            (br_if $columnsDone (i32.ge_u (i32.add (local.get $j) (i32.const 3)) (local.get $m)))
            (call $sums_4x4 (local.get $rowA) (local.get $aRow) (local.get $aCol)
              (i32.add (local.get $b) (i32.shl (local.get $j) (i32.const 2))) (local.get $bRow) (local.get $k)
              (i32.add (local.get $rowOut) (i32.mul (local.get $j) (local.get $outCol))) (local.get $outRow) (local.get $outCol)
              (local.get $alpha) (local.get $accumulate))
            (local.set $j (i32.add (local.get $j) (i32.const 4)))
            (br $nextColumns)))
        (block $lastDone
          (loop $nextLast
            (br_if $lastDone (i32.ge_u (local.get $j) (local.get $m)))
            (call $sums_4x1 (local.get $rowA) (local.get $aRow) (local.get $aCol)
              (i32.add (local.get $b) (i32.shl (local.get $j) (i32.const 2))) (local.get $bRow) (local.get $k)
              (i32.add (local.get $rowOut) (i32.mul (local.get $j) (local.get $outCol))) (local.get $outRow)
              (local.get $alpha) (local.get $accumulate))
            (local.set $j (i32.add (local.get $j) (i32.const 1)))
            (br $nextLast)))
        (local.set $i (i32.add (local.get $i) (i32.const 4)))
        (br $nextRows)))
    ;; The last n % 4 rows: stepwise, or sums eight columns at a time, then in pairs, then a last odd column.
    (block $rowsDone
      (loop $nextRow
        (br_if $rowsDone (i32.ge_u (local.get $i) (local.get $n)))
        (local.set $rowA (i32.add (local.get $a) (i32.mul (local.get $i) (local.get $aRow))))
        (local.set $rowOut (i32.add (local.get $out) (i32.mul (local.get $i) (local.get $outRow))))
        (if (i32.and (local.get $flags) (i32.const 2))
          (then
            (call $stepwise_row (local.get $rowA) (local.get $aCol) (local.get $b) (local.get $bRow) (local.get $k) (local.get $m)
              (local.get $rowOut)))
          (else
            (local.set $j (i32.const 0))
            (block $eightsDone
              (loop $nextEight
                (br_if $eightsDone (i32.ge_u (i32.add (local.get $j) (i32.const 7)) (local.get $m)))
                (call $sums_1x8 (local.get $rowA) (local.get $aCol) (i32.add (local.get $b) (i32.shl (local.get $j) (i32.const 2)))
                  (local.get $bRow) (local.get $k) (i32.add (local.get $rowOut) (i32.mul (local.get $j) (local.get $outCol)))
                  (local.get $outCol) (local.get $alpha) (local.get $accumulate))
                (local.set $j (i32.add (local.get $j) (i32.const 8)))
                (br $nextEight)))
            (block $pairsDone
              (loop $nextPair
                (br_if $pairsDone (i32.ge_u (i32.add (local.get $j) (i32.const 1)) (local.get $m)))
                (call $sums_1x2 (local.get $rowA) (local.get $aCol) (i32.add (local.get $b) (i32.shl (local.get $j) (i32.const 2)))
                  (local.get $bRow) (local.get $k) (i32.add (local.get $rowOut) (i32.mul (local.get $j) (local.get $outCol)))
                  (local.get $outCol) (local.get $alpha) (local.get $accumulate))
                (local.set $j (i32.add (local.get $j) (i32.const 2)))
                (br $nextPair)))
            (if (i32.lt_u (local.get $j) (local.get $m))
              (then
                (call $sums_1x1 (local.get $rowA) (local.get $aCol) (i32.add (local.get $b) (i32.shl (local.get $j) (i32.const 2)))
                  (local.get $bRow) (local.get $k) (i32.add (local.get $rowOut) (i32.mul (local.get $j) (local.get $outCol)))
                  (local.get $alpha) (local.get $accumulate))))))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $nextRow))))
)
