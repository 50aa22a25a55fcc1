//! The inner loops of decoding: recombining byte planes into counts, and the
//! per-cell prefix sums of gaps into gene indices, with SSE2 and AVX2 builds
//! chosen at run time. Each takes and returns plain slices; the rules of the
//! format are checked by the caller from what they return.

/// Writes the counts whose low and high bytes are `lo` and `hi` into `out`;
/// returns whether any is zero. Uses an AVX2 build of the same loop where the
/// processor has it (detection is cached by std).
#[inline]
pub(super) fn recombine_counts(lo: &[u8], hi: &[u8], out: &mut [u32]) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the processor supports AVX2, checked just above.
            return unsafe { recombine_counts_avx2(lo, hi, out) };
        }
    }
    recombine_counts_portable(lo, hi, out)
}

/// [`recombine_counts`] with ordinary stores, for output that is read again
/// at once (a cell remapped or scaled right after it is written).
#[inline]
pub(super) fn recombine_counts_cached(lo: &[u8], hi: &[u8], out: &mut [u32]) -> bool {
    recombine_counts_portable(lo, hi, out)
}

#[inline(always)]
fn recombine_counts_portable(lo: &[u8], hi: &[u8], out: &mut [u32]) -> bool {
    let mut zero = false;
    for ((o, &l), &h) in out.iter_mut().zip(lo).zip(hi) {
        let v = u32::from(l) | u32::from(h) << 8;
        zero |= v == 0;
        *o = v;
    }
    zero
}

/// The same loop, 8 lanes wide, with streaming stores: a decoded tile is far
/// larger than the caches, so writing around them saves reading every output
/// line in before overwriting it (a third of the memory traffic). The caller
/// must call [`store_fence`] before the output is read by another thread.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn recombine_counts_avx2(lo: &[u8], hi: &[u8], out: &mut [u32]) -> bool {
    use std::arch::x86_64::*;
    let n = out.len().min(lo.len()).min(hi.len());
    // Up to the first 32-byte boundary of `out`, as the streaming store needs.
    let head = (out.as_ptr().align_offset(32)).min(n);
    let mut zero = recombine_counts_portable(&lo[..head], &hi[..head], &mut out[..head]);
    let blocks = (n - head) / 8;
    let zeros = _mm256_setzero_si256();
    let mut any = zeros;
    for b in 0..blocks {
        let at = head + 8 * b;
        // SAFETY: each load reads the 8 bytes at `at` of `lo` and `hi`, all
        // below n (at + 8 <= head + 8 * blocks <= n).
        let (l, h) = unsafe {
            (
                _mm_loadl_epi64(lo.as_ptr().add(at) as *const __m128i),
                _mm_loadl_epi64(hi.as_ptr().add(at) as *const __m128i),
            )
        };
        let x = _mm256_cvtepu16_epi32(_mm_unpacklo_epi8(l, h));
        any = _mm256_or_si256(any, _mm256_cmpeq_epi32(x, zeros));
        // SAFETY: the store writes the 8 u32 at `at` of `out`, below n, at a
        // 32-byte boundary (`head` is the first one, and 8 u32 are 32 bytes).
        unsafe { _mm256_stream_si256(out.as_mut_ptr().add(at) as *mut __m256i, x) };
    }
    zero |= _mm256_testz_si256(any, any) == 0;
    let t = head + 8 * blocks;
    zero |= recombine_counts_portable(&lo[t..n], &hi[t..n], &mut out[t..n]);
    zero
}

/// Orders the streaming stores of the kernels before later stores, so that
/// a thread that sees the work done sees its output (x86 streaming stores are
/// weakly ordered). Call once after the kernels, before handing the output on.
#[inline]
pub(super) fn store_fence() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: SSE is part of every x86_64 processor; the fence has no operands.
    unsafe {
        std::arch::x86_64::_mm_sfence()
    }
}

/// Asks the processor to bring `bytes` into its caches, a line at a time,
/// without waiting for them: a row about to be read from planes that were
/// decompressed a while ago (a shuffled batch reads a few rows from each of
/// dozens of chunks) then comes from cache, not from memory one miss after
/// another.
pub(super) fn prefetch(bytes: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    for line in bytes.chunks(64) {
        // SAFETY: SSE is part of every x86_64 processor; a prefetch only
        // hints, never faults, and the address is inside `bytes`.
        unsafe { std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(line.as_ptr().cast()) }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = bytes;
}

/// A function that writes the (wrapping) prefix sums of the gaps whose low and
/// high bytes are `lo` and `hi` into `out`, and returns the last sum and the
/// number of zero gaps.
pub(super) type GapsKernel = fn(&[u8], &[u8], &mut [u32]) -> (u32, u32);

/// The fastest gaps kernel this processor runs (detection is cached by std).
pub(super) fn select_gaps_kernel() -> GapsKernel {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx2") {
            return |lo, hi, out| {
                // SAFETY: the processor supports AVX2, checked above.
                unsafe { cell_gaps_avx2(lo, hi, out) }
            };
        }
        cell_gaps_sse2
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        |lo, hi, out| cell_gaps_scalar(lo, hi, out, 0)
    }
}

/// Eight gaps at a time: prefix sums within each 128-bit half, the first
/// half's total added to the second, then the running total of the blocks
/// before. The block's own total is broadcast from its local sums, so the only
/// dependency from one block to the next is one addition (the running total),
/// not the shuffle's latency.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
pub(super) unsafe fn cell_gaps_avx2(lo: &[u8], hi: &[u8], out: &mut [u32]) -> (u32, u32) {
    use std::arch::x86_64::*;
    let n = out.len().min(lo.len()).min(hi.len());
    let blocks = n / 8;
    let zero = _mm256_setzero_si256();
    let mut carry = zero;
    let mut zeros = zero;
    let last_of_first_half = _mm256_set1_epi32(3);
    let last = _mm256_set1_epi32(7);
    let upper_half = _mm256_set_epi32(-1, -1, -1, -1, 0, 0, 0, 0);
    for b in 0..blocks {
        // SAFETY: each load reads the 8 bytes at 8 * b of `lo` and `hi`, below
        // n (8 * b + 8 <= 8 * blocks <= n).
        let (l, h) = unsafe {
            (
                _mm_loadl_epi64(lo.as_ptr().add(8 * b) as *const __m128i),
                _mm_loadl_epi64(hi.as_ptr().add(8 * b) as *const __m128i),
            )
        };
        let mut x = _mm256_cvtepu16_epi32(_mm_unpacklo_epi8(l, h));
        zeros = _mm256_sub_epi32(zeros, _mm256_cmpeq_epi32(x, zero));
        x = _mm256_add_epi32(x, _mm256_slli_si256::<4>(x));
        x = _mm256_add_epi32(x, _mm256_slli_si256::<8>(x));
        let first_total = _mm256_and_si256(_mm256_permutevar8x32_epi32(x, last_of_first_half), upper_half);
        x = _mm256_add_epi32(x, first_total);
        let total = _mm256_permutevar8x32_epi32(x, last);
        // SAFETY: the store writes the 8 u32 at 8 * b of `out`, below n.
        unsafe { _mm256_storeu_si256(out.as_mut_ptr().add(8 * b) as *mut __m256i, _mm256_add_epi32(x, carry)) };
        carry = _mm256_add_epi32(carry, total);
    }
    let mut lanes = [0u32; 8];
    // SAFETY: `lanes` is 8 u32, the 32 bytes the store writes.
    unsafe { _mm256_storeu_si256(lanes.as_mut_ptr() as *mut __m256i, zeros) };
    let block_zeros = lanes.iter().fold(0u32, |a, &z| a.wrapping_add(z));
    let acc = _mm256_extract_epi32::<0>(carry) as u32;
    let t = 8 * blocks;
    let (last_sum, tail_zeros) = cell_gaps_scalar(&lo[t..n], &hi[t..n], &mut out[t..n], acc);
    (last_sum, block_zeros + tail_zeros)
}

#[inline]
pub(super) fn cell_gaps_scalar(lo: &[u8], hi: &[u8], out: &mut [u32], mut acc: u32) -> (u32, u32) {
    let mut zeros = 0u32;
    for ((o, &l), &h) in out.iter_mut().zip(lo).zip(hi) {
        let g = u32::from(l) | u32::from(h) << 8;
        zeros += u32::from(g == 0);
        acc = acc.wrapping_add(g);
        *o = acc;
    }
    (acc, zeros)
}

/// Four gaps at a time: interleaving the low and high bytes gives the uint16
/// values, widened to u32 lanes; two shifted adds give the prefix sums within
/// the register, and the running total of the previous block is added. SSE2
/// is part of every x86_64 processor, so no runtime detection is needed.
#[cfg(target_arch = "x86_64")]
#[inline]
pub(super) fn cell_gaps_sse2(lo: &[u8], hi: &[u8], out: &mut [u32]) -> (u32, u32) {
    use std::arch::x86_64::*;
    let n = out.len().min(lo.len()).min(hi.len());
    let blocks = n / 4;
    // SAFETY: SSE2 is always available on x86_64. Every load reads 4 bytes at
    // 4 * b of `lo` and `hi` and every store writes 4 u32 at 4 * b of `out`,
    // with b < n / 4, so all accesses stay inside the slices.
    unsafe {
        let zero = _mm_setzero_si128();
        let mut carry = zero;
        let mut zeros = zero;
        for b in 0..blocks {
            let l = _mm_cvtsi32_si128(i32::from_le_bytes(lo[4 * b..4 * b + 4].try_into().expect("4")));
            let h = _mm_cvtsi32_si128(i32::from_le_bytes(hi[4 * b..4 * b + 4].try_into().expect("4")));
            let mut x = _mm_unpacklo_epi16(_mm_unpacklo_epi8(l, h), zero);
            zeros = _mm_sub_epi32(zeros, _mm_cmpeq_epi32(x, zero));
            x = _mm_add_epi32(x, _mm_slli_si128::<4>(x));
            x = _mm_add_epi32(x, _mm_slli_si128::<8>(x));
            x = _mm_add_epi32(x, carry);
            _mm_storeu_si128(out.as_mut_ptr().add(4 * b) as *mut __m128i, x);
            carry = _mm_shuffle_epi32::<0xFF>(x);
        }
        let mut lanes = [0u32; 4];
        _mm_storeu_si128(lanes.as_mut_ptr() as *mut __m128i, zeros);
        let block_zeros = lanes.iter().fold(0u32, |a, &z| a.wrapping_add(z));
        let acc = _mm_cvtsi128_si32(carry) as u32;
        let t = 4 * blocks;
        let (last, tail_zeros) = cell_gaps_scalar(&lo[t..n], &hi[t..n], &mut out[t..n], acc);
        (last, block_zeros + tail_zeros)
    }
}
