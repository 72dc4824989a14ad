//! The unstable sort the reference gets from PyTorch on CPU, reproduced element for element.
//!
//! `torch.sort(descending=True)` on a CPU float tensor sorts (value, index) pairs with
//! `std::sort` from GNU libstdc++ (the C++ library PyTorch's Linux wheels are built with),
//! comparing values only. `std::sort` is not stable: with tied values the resulting index
//! order depends on the exact sequence of swaps of its introsort (median-of-three quicksort,
//! a heapsort fallback past `2 * floor(log2(n))` levels, then insertion sort over runs of 16).
//! To make the same choices as the reference on tied loads, [`sort_unstable_like_libstdcxx`]
//! performs exactly those steps. We checked it against `torch.sort` (PyTorch 2.15, CPU)
//! on thousands of random tied inputs of 4 to 1152 elements; see `docs/eplb.md`.
//!
//! This is an independent implementation written from the algorithm's description.

/// Elements at most this long are left to the final insertion sort.
const THRESHOLD: usize = 16;

/// Sorts `v` with the same sequence of comparisons and moves as libstdc++'s `std::sort`,
/// where `less(a, b)` is the strict weak order ("a goes before b").
pub fn sort_unstable_like_libstdcxx<T: Copy, F: Fn(&T, &T) -> bool>(v: &mut [T], less: F) {
    let n = v.len();
    if n < 2 {
        return;
    }
    let depth = 2 * (usize::BITS - 1 - n.leading_zeros()) as usize;
    introsort_loop(v, 0, n, depth, &less);
    final_insertion_sort(v, &less);
}

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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn desc(a: &(f32, u32), b: &(f32, u32)) -> bool {
        a.0 > b.0
    }

    proptest! {
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
