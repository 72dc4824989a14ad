//! The unstable sort the reference gets from PyTorch on CPU, reproduced element for element.
//!
//! `torch.sort(descending=True)` on a CPU float tensor sorts (value, index) pairs with
//! `std::sort` from GNU libstdc++ (the C++ library PyTorch's Linux wheels are built with),
//! comparing values only. `std::sort` is not stable: with tied values the resulting index
//! order depends on the exact sequence of swaps of its introsort (median-of-three quicksort,
//! a heapsort fallback past `2 * floor(log2(n))` levels, then insertion sort over runs of 16).
//! To make the same choices as the reference on tied loads, [`sort_keys_like_libstdcxx`]
//! performs exactly those steps on packed integer keys; the generic step-by-step version it
//! is tested against, `sort_unstable_like_libstdcxx`, was checked against `torch.sort`
//! (PyTorch 2.15, CPU) on thousands of random tied inputs of 4 to 1152 elements; see
//! `docs/eplb.md`.
//!
//! This is an independent implementation written from the algorithm's description.

/// Elements at most this long are left to the final insertion sort.
const THRESHOLD: usize = 16;

#[cfg(test)]
/// Sorts `v` with the same sequence of comparisons and moves as libstdc++'s `std::sort`,
/// where `less(a, b)` is the strict weak order ("a goes before b").
pub fn sort_unstable_like_libstdcxx<T: Copy, F: Fn(&T, &T) -> bool>(v: &mut [T], less: F) {
    let n = v.len();
    if n < 2 {
        return;
    }
    introsort_loop(v, 0, n, depth_limit(n), &less);
    final_insertion_sort(v, &less);
}

/// libstdc++'s recursion budget before the heap-sort fallback: `2 * floor(log2(n))`.
fn depth_limit(n: usize) -> usize {
    2 * (usize::BITS - 1 - n.leading_zeros()) as usize
}

#[cfg(test)]
fn introsort_loop<T: Copy, F: Fn(&T, &T) -> bool>(
    v: &mut [T],
    first: usize,
    mut last: usize,
    mut depth: usize,
    less: &F,
) {
    while last - first > THRESHOLD {
        if depth == 0 {
            heap_sort(&mut v[first..last], less);
            return;
        }
        depth -= 1;
        let cut = partition_pivot(v, first, last, less);
        introsort_loop(v, cut, last, depth, less);
        last = cut;
    }
}

#[cfg(test)]
/// Moves the median of `v[a]`, `v[b]`, `v[c]` to `v[result]`.
fn move_median_to_first<T: Copy, F: Fn(&T, &T) -> bool>(
    v: &mut [T],
    result: usize,
    a: usize,
    b: usize,
    c: usize,
    less: &F,
) {
    let pick = if less(&v[a], &v[b]) {
        if less(&v[b], &v[c]) {
            b
        } else if less(&v[a], &v[c]) {
            c
        } else {
            a
        }
    } else if less(&v[a], &v[c]) {
        a
    } else if less(&v[b], &v[c]) {
        c
    } else {
        b
    };
    v.swap(result, pick);
}

#[cfg(test)]
fn partition_pivot<T: Copy, F: Fn(&T, &T) -> bool>(
    v: &mut [T],
    first: usize,
    last: usize,
    less: &F,
) -> usize {
    let mid = first + (last - first) / 2;
    move_median_to_first(v, first, first + 1, mid, last - 1, less);
    // Unguarded partition of [first + 1, last) around the pivot at `first`.
    let pivot = v[first];
    let mut lo = first + 1;
    let mut hi = last;
    loop {
        while less(&v[lo], &pivot) {
            lo += 1;
        }
        hi -= 1;
        while less(&pivot, &v[hi]) {
            hi -= 1;
        }
        if lo >= hi {
            return lo;
        }
        v.swap(lo, hi);
        lo += 1;
    }
}

#[cfg(test)]
fn final_insertion_sort<T: Copy, F: Fn(&T, &T) -> bool>(v: &mut [T], less: &F) {
    if v.len() > THRESHOLD {
        insertion_sort(&mut v[..THRESHOLD], less);
        for i in THRESHOLD..v.len() {
            unguarded_linear_insert(v, i, less);
        }
    } else {
        insertion_sort(v, less);
    }
}

#[cfg(test)]
fn insertion_sort<T: Copy, F: Fn(&T, &T) -> bool>(v: &mut [T], less: &F) {
    for i in 1..v.len() {
        if less(&v[i], &v[0]) {
            let val = v[i];
            v.copy_within(0..i, 1);
            v[0] = val;
        } else {
            unguarded_linear_insert(v, i, less);
        }
    }
}

#[cfg(test)]
/// Shifts `v[i]` left past every element it goes before; relies on a smaller-or-equal
/// element existing to its left.
fn unguarded_linear_insert<T: Copy, F: Fn(&T, &T) -> bool>(v: &mut [T], mut i: usize, less: &F) {
    let val = v[i];
    while less(&val, &v[i - 1]) {
        v[i] = v[i - 1];
        i -= 1;
    }
    v[i] = val;
}

fn heap_sort<T: Copy, F: Fn(&T, &T) -> bool>(v: &mut [T], less: &F) {
    let len = v.len();
    if len >= 2 {
        let mut parent = (len - 2) / 2;
        loop {
            let val = v[parent];
            adjust_heap(v, parent, len, val, less);
            if parent == 0 {
                break;
            }
            parent -= 1;
        }
    }
    let mut last = len;
    while last > 1 {
        last -= 1;
        let val = v[last];
        v[last] = v[0];
        adjust_heap(&mut v[..last], 0, last, val, less);
    }
}

fn adjust_heap<T: Copy, F: Fn(&T, &T) -> bool>(
    v: &mut [T],
    mut hole: usize,
    len: usize,
    val: T,
    less: &F,
) {
    let top = hole;
    let mut child = hole;
    while len >= 1 && child < (len - 1) / 2 {
        child = 2 * (child + 1);
        if less(&v[child], &v[child - 1]) {
            child -= 1;
        }
        v[hole] = v[child];
        hole = child;
    }
    if len.is_multiple_of(2) && len >= 2 && child == (len - 2) / 2 {
        child = 2 * (child + 1);
        v[hole] = v[child - 1];
        hole = child - 1;
    }
    // Push `val` up from `hole` towards `top`.
    while hole > top {
        let parent = (hole - 1) / 2;
        if !less(&v[parent], &val) {
            break;
        }
        v[hole] = v[parent];
        hole = parent;
    }
    v[hole] = val;
}

/// Low 32 bits of a packed key: the payload, ignored by the order.
const LOW: u64 = 0xFFFF_FFFF;
/// High 32 bits of a packed key: the sort value.
const HIGH: u64 = !LOW;

/// Whether key `a` goes before key `b`: their high halves compare, the low halves (payloads)
/// do not take part (`a < b & HIGH` holds exactly when `a`'s high half is the smaller).
#[inline(always)]
fn key_before(a: u64, b: u64) -> bool {
    a < (b & HIGH)
}

/// [`sort_unstable_like_libstdcxx`] specialised to packed keys: each element is
/// `value << 32 | payload`, ordered by `value` alone (smaller first) with the payload carried
/// along. Makes exactly the comparisons and moves of the generic version with
/// `less = |a, b| a >> 32 < b >> 32`, but each comparison is one integer compare against a
/// precomputed bound (`(p | LOW) < x` is "p before x", `x < (p & HIGH)` is "x before p").
pub fn sort_keys_like_libstdcxx(v: &mut [u64]) {
    let n = v.len();
    if n < 2 {
        return;
    }
    keys_introsort_loop(v, depth_limit(n));
}

/// The introsort loop, each leaf of at most [`THRESHOLD`] keys finished in place.
///
/// libstdc++ ends with one insertion sort over the whole array. That insertion sort only
/// moves a key past keys it strictly goes before, so it is a stable sort, and its result is
/// the array stably sorted. The loop leaves the array as consecutive ranges in order (every
/// key of a range is not after any key of a later range: quicksort's partitions), each
/// either heap-sorted or a leaf of at most 16 keys; the stable sort of such an array is each
/// leaf stably sorted on its own, which [`stable_sort_leaf`] does without branches.
fn keys_introsort_loop(mut v: &mut [u64], mut depth: usize) {
    while v.len() > THRESHOLD {
        if depth == 0 {
            heap_sort(v, &|a: &u64, b: &u64| key_before(*a, *b));
            return;
        }
        depth -= 1;
        let cut = keys_partition_pivot(v);
        let (left, right) = v.split_at_mut(cut);
        keys_introsort_loop(right, depth);
        v = left;
    }
    stable_sort_leaf(v);
}

/// Stably sorts at most [`THRESHOLD`] keys by their high halves: each key goes to its rank,
/// the number of keys before it that are not after it plus the number after it that go
/// before it, counted without branches.
fn stable_sort_leaf(v: &mut [u64]) {
    let m = v.len();
    debug_assert!(m <= THRESHOLD);
    let mut copy = [0u64; THRESHOLD];
    copy[..m].copy_from_slice(v);
    for i in 0..m {
        let x = copy[i];
        let not_after = x | LOW; // y <= not_after: y is not after x
        let before = x & HIGH; // y < before: y goes before x
        let mut rank = 0;
        for &y in &copy[..i] {
            rank += usize::from(y <= not_after);
        }
        for &y in &copy[i + 1..m] {
            rank += usize::from(y < before);
        }
        v[rank] = x;
    }
}

fn keys_partition_pivot(v: &mut [u64]) -> usize {
    let last = v.len();
    let mid = last / 2;
    // Median of v[1], v[mid], v[last - 1] to v[0], with the generic version's comparisons.
    let (a, b, c) = (v[1], v[mid], v[last - 1]);
    let pick = if key_before(a, b) {
        if key_before(b, c) {
            mid
        } else if key_before(a, c) {
            last - 1
        } else {
            1
        }
    } else if key_before(a, c) {
        1
    } else if key_before(b, c) {
        last - 1
    } else {
        mid
    };
    v.swap(0, pick);
    keys_partition(v)
}

/// Elements per block in the branch-free first phase of [`keys_partition`].
const BLOCK: usize = 16;

/// libstdc++'s unguarded partition of `v[1..]` around the pivot `v[0]`, with the same swaps
/// in the same order, returning the same cut.
///
/// The scalar loop moves `lo` up to the next element not before the pivot (a "left stop"),
/// `hi` down to the next element the pivot is not before (a "right stop"), and swaps them
/// while `lo < hi`. While both scans are still in untouched elements, the `k`-th swap
/// exchanges the `k`-th left stop with the `k`-th right stop of the original contents. So the
/// first phase finds the stops a block of [`BLOCK`] elements at a time, without branches
/// (as in Edelkamp and Weiss' BlockQuicksort), and swaps them pairwise while the unscanned
/// middle is at least two blocks wide; the scalar loop then resumes from the last swapped
/// pair and finds the same cut as if it had run from the start.
fn keys_partition(v: &mut [u64]) -> usize {
    let last = v.len();
    let pivot = v[0];
    let below = pivot & HIGH; // x < below: x goes before the pivot
    let above = pivot | LOW; // above < x: the pivot goes before x
                             // The scalar loop's state after the swaps made so far.
    let mut lo = 1;
    let mut hi = last;
    // Unscanned elements: v[l..r].
    let mut l = 1;
    let mut r = last;
    let mut left = [0u8; BLOCK];
    let mut right = [0u8; BLOCK];
    let (mut left_base, mut left_start, mut left_len) = (0, 0, 0);
    let (mut right_base, mut right_start, mut right_len) = (0, 0, 0);
    while r - l >= 2 * BLOCK {
        if left_len == 0 {
            left_base = l;
            left_start = 0;
            for (i, &x) in v[l..l + BLOCK].iter().enumerate() {
                left[left_len] = i as u8;
                left_len += usize::from(x >= below);
            }
            l += BLOCK;
        }
        if right_len == 0 {
            right_base = r - 1;
            right_start = 0;
            for (i, &x) in v[r - BLOCK..r].iter().rev().enumerate() {
                right[right_len] = i as u8;
                right_len += usize::from(x <= above);
            }
            r -= BLOCK;
        }
        let pairs = left_len.min(right_len);
        for k in 0..pairs {
            let a = left_base + usize::from(left[left_start + k]);
            let b = right_base - usize::from(right[right_start + k]);
            v.swap(a, b);
        }
        if pairs > 0 {
            lo = left_base + usize::from(left[left_start + pairs - 1]) + 1;
            hi = right_base - usize::from(right[right_start + pairs - 1]);
        }
        left_start += pairs;
        left_len -= pairs;
        right_start += pairs;
        right_len -= pairs;
    }
    // The median of three leaves an element not before the pivot and one the pivot is not
    // before in v[1..], so neither scan runs off the slice (and a swapped pair guards every
    // later scan).
    loop {
        while v[lo] < below {
            lo += 1;
        }
        hi -= 1;
        while above < v[hi] {
            hi -= 1;
        }
        if lo >= hi {
            return lo;
        }
        v.swap(lo, hi);
        lo += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn desc(a: &(f32, u32), b: &(f32, u32)) -> bool {
        a.0 > b.0
    }

    /// Packed keys `value << 32 | position` from small values (many ties).
    fn packed(vals: &[u32]) -> Vec<u64> {
        vals.iter()
            .enumerate()
            .map(|(i, &x)| (u64::from(x) << 32) | i as u64)
            .collect()
    }

    /// The generic replay on packed keys, with a given recursion budget.
    fn generic(v: &mut [u64], depth: usize) {
        let less = |a: &u64, b: &u64| a >> 32 < b >> 32;
        let n = v.len();
        if n >= 2 {
            introsort_loop(v, 0, n, depth, &less);
            final_insertion_sort(v, &less);
        }
    }

    /// Input shapes that stress partitioning: random, sorted, reversed, organ pipe, sawtooth.
    fn shaped(vals: Vec<u32>, shape: u8) -> Vec<u32> {
        let n = vals.len() as u32;
        match shape {
            0 => vals,
            1 => (0..n).map(|i| i / 3).collect(),
            2 => (0..n).map(|i| (n - i) / 2).collect(),
            3 => (0..n).map(|i| i.min(n - i)).collect(),
            _ => (0..n).map(|i| i % 7).collect(),
        }
    }

    proptest! {
        #[test]
        fn packed_keys_replay_the_generic_sort(
            vals in proptest::collection::vec(0u32..6, 0..700),
            shape in 0u8..5,
        ) {
            let vals = shaped(vals, shape);
            let mut fast = packed(&vals);
            let mut slow = fast.clone();
            sort_keys_like_libstdcxx(&mut fast);
            generic(&mut slow, depth_limit(vals.len().max(1)));
            prop_assert_eq!(fast, slow);
        }

        #[test]
        fn packed_keys_replay_the_heap_sort_fallback(
            vals in proptest::collection::vec(0u32..1000, 17..400),
            depth in 0usize..4,
        ) {
            let mut fast = packed(&vals);
            let mut slow = fast.clone();
            keys_introsort_loop(&mut fast, depth);
            generic(&mut slow, depth);
            prop_assert_eq!(fast, slow);
        }

        #[test]
        fn sorts_like_a_sort(vals in proptest::collection::vec(0u8..4, 0..300)) {
            let mut v: Vec<(f32, u32)> =
                vals.iter().enumerate().map(|(i, &x)| (f32::from(x), i as u32)).collect();
            sort_unstable_like_libstdcxx(&mut v, desc);
            prop_assert!(v.windows(2).all(|w| w[0].0 >= w[1].0));
            let mut idx: Vec<u32> = v.iter().map(|p| p.1).collect();
            idx.sort_unstable();
            prop_assert_eq!(idx, (0..vals.len() as u32).collect::<Vec<_>>());
        }

        #[test]
        fn heap_sort_sorts(vals in proptest::collection::vec(0u8..10, 0..100)) {
            let mut v: Vec<(f32, u32)> =
                vals.iter().enumerate().map(|(i, &x)| (f32::from(x), i as u32)).collect();
            heap_sort(&mut v, &desc);
            prop_assert!(v.windows(2).all(|w| w[0].0 >= w[1].0));
        }
    }

    #[test]
    fn short_inputs_are_stable() {
        // Up to 16 elements libstdc++ only runs insertion sort, which keeps ties in order.
        let mut v: Vec<(f32, u32)> = (0..16).map(|i| ((i % 3) as f32, i)).collect();
        sort_unstable_like_libstdcxx(&mut v, desc);
        let idx: Vec<u32> = v.iter().map(|p| p.1).collect();
        assert_eq!(
            idx,
            vec![2, 5, 8, 11, 14, 1, 4, 7, 10, 13, 0, 3, 6, 9, 12, 15]
        );
    }

    #[test]
    fn long_ties_follow_libstdcxx() {
        // 20 equal values: torch.sort(descending=True).indices on CPU gives this order
        // (recorded from PyTorch 2.15; the oracle is torch, not this implementation).
        let mut v: Vec<(f32, u32)> = (0..20).map(|i| (1.0, i)).collect();
        sort_unstable_like_libstdcxx(&mut v, desc);
        let idx: Vec<u32> = v.iter().map(|p| p.1).collect();
        assert_eq!(idx, TORCH_20_TIES.to_vec());
    }

    const TORCH_20_TIES: [u32; 20] = [
        10, 19, 18, 17, 16, 15, 14, 13, 12, 11, 0, 9, 8, 7, 6, 5, 4, 3, 2, 1,
    ];
}
