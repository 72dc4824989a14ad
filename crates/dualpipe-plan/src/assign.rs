//! Stage-to-device placement: a bottleneck assignment, then Kuhn-Munkres among the assignments
//! that reach the bottleneck.
//!
//! Rows are ranks (each runs its stages), columns are devices. `time[r][d]` is how long rank
//! `r`'s compute takes on device `d` (`None`: it does not fit there). The slowest rank sets the
//! pace, so the first goal is the smallest bottleneck `T* = min over assignments of max time`;
//! it is found by binary search over the distinct times with a bipartite matching test. Among
//! the assignments within `T*`, [`pathfinding`]'s Kuhn-Munkres then maximises `keep` (layers a
//! device already holds, for re-placement) and, after that, minimises `extra` (the time of the
//! messages a rank sends from that device).

use pathfinding::kuhn_munkres::kuhn_munkres;
use pathfinding::matrix::Matrix;

/// The most rows or columns an assignment may have (the weights stay inside `i64`).
pub const MAX_SIDE: usize = 512;

/// Resolution of `extra` inside one integer weight.
const EXTRA_STEPS: i64 = 10_000;

/// An assignment of every row to its own column.
#[derive(Clone, Debug, PartialEq)]
pub struct Assignment {
    /// `column[r]`: the column of row `r`.
    pub column: Vec<usize>,
    /// The largest `time` of the assignment.
    pub bottleneck: f64,
    /// Sum of `keep` over the assignment.
    pub kept: u64,
}

/// Whether every row can get its own column using only the allowed cells (Kuhn's augmenting
/// paths).
fn perfect(allowed: &[Vec<bool>], columns: usize) -> bool {
    fn augment(r: usize, allowed: &[Vec<bool>], seen: &mut [bool], owner: &mut [usize]) -> bool {
        for d in 0..seen.len() {
            if allowed[r][d] && !seen[d] {
                seen[d] = true;
                if owner[d] == usize::MAX || augment(owner[d], allowed, seen, owner) {
                    owner[d] = r;
                    return true;
                }
            }
        }
        false
    }
    let mut owner = vec![usize::MAX; columns];
    (0..allowed.len()).all(|r| augment(r, allowed, &mut vec![false; columns], &mut owner))
}

/// The bottleneck-optimal assignment of rows to columns that keeps the most (`keep`) and then
/// costs the least (`extra`); `None` when no assignment fits or the sides are too large
/// (more rows than columns, or over [`MAX_SIDE`]).
pub fn assign(
    time: &[Vec<Option<f64>>],
    keep: &[Vec<u32>],
    extra: &[Vec<f64>],
) -> Option<Assignment> {
    let rows = time.len();
    let columns = time.first().map_or(0, Vec::len);
    if rows == 0 || rows > columns || columns > MAX_SIDE {
        return None;
    }
    let mut values: Vec<f64> = time.iter().flatten().flatten().copied().collect();
    values.sort_by(f64::total_cmp);
    values.dedup();
    let within = |t: f64| -> Vec<Vec<bool>> {
        time.iter()
            .map(|row| row.iter().map(|c| c.is_some_and(|x| x <= t)).collect())
            .collect()
    };
    if values.is_empty() || !perfect(&within(*values.last()?), columns) {
        return None;
    }
    let (mut lo, mut hi) = (0, values.len() - 1);
    while lo < hi {
        let mid = (lo + hi) / 2;
        if perfect(&within(values[mid]), columns) {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    let bottleneck = values[lo];
    let allowed = within(bottleneck);
    let max_extra = extra
        .iter()
        .flatten()
        .copied()
        .filter(|x| x.is_finite())
        .fold(0.0f64, f64::max);
    let keep_weight = EXTRA_STEPS * rows as i64 + 1;
    let max_keep = keep.iter().flatten().copied().max().unwrap_or(0) as i64;
    let forbidden = -((max_keep * keep_weight + EXTRA_STEPS) * (rows as i64 + 1) + 1);
    let weights = Matrix::from_fn(rows, columns, |(r, d)| {
        if !allowed[r][d] {
            return forbidden;
        }
        let k = keep.get(r).and_then(|row| row.get(d)).copied().unwrap_or(0) as i64;
        let e = extra
            .get(r)
            .and_then(|row| row.get(d))
            .copied()
            .unwrap_or(0.0);
        let e = if max_extra > 0.0 && e.is_finite() {
            (e / max_extra * EXTRA_STEPS as f64).round() as i64
        } else {
            0
        };
        k * keep_weight - e
    });
    let (_, column) = kuhn_munkres(&weights);
    let kept = column
        .iter()
        .enumerate()
        .map(|(r, &d)| keep.get(r).and_then(|row| row.get(d)).copied().unwrap_or(0) as u64)
        .sum();
    Some(Assignment {
        column,
        bottleneck,
        kept,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn permutations(n: usize, k: usize) -> Vec<Vec<usize>> {
        fn rec(n: usize, k: usize, cur: &mut Vec<usize>, out: &mut Vec<Vec<usize>>) {
            if cur.len() == k {
                out.push(cur.clone());
                return;
            }
            for d in 0..n {
                if !cur.contains(&d) {
                    cur.push(d);
                    rec(n, k, cur, out);
                    cur.pop();
                }
            }
        }
        let mut out = Vec::new();
        rec(n, k, &mut Vec::new(), &mut out);
        out
    }

    fn next(seed: &mut u64) -> u64 {
        *seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        *seed >> 33
    }

    #[test]
    fn matches_brute_force() {
        let mut seed = 11;
        for case in 0..200 {
            let rows = 1 + case % 4;
            let columns = rows + (case / 4) % 3;
            let time: Vec<Vec<Option<f64>>> = (0..rows)
                .map(|_| {
                    (0..columns)
                        .map(|_| {
                            let v = next(&mut seed) % 10;
                            (v != 0).then_some(v as f64)
                        })
                        .collect()
                })
                .collect();
            let keep: Vec<Vec<u32>> = (0..rows)
                .map(|_| (0..columns).map(|_| (next(&mut seed) % 4) as u32).collect())
                .collect();
            let extra: Vec<Vec<f64>> = (0..rows)
                .map(|_| (0..columns).map(|_| (next(&mut seed) % 7) as f64).collect())
                .collect();
            // Brute force: lexicographic (bottleneck, -kept, extra).
            let mut best: Option<(f64, i64, f64)> = None;
            for p in permutations(columns, rows) {
                if p.iter().enumerate().any(|(r, &d)| time[r][d].is_none()) {
                    continue;
                }
                let b = p
                    .iter()
                    .enumerate()
                    .map(|(r, &d)| time[r][d].unwrap())
                    .fold(0.0, f64::max);
                let k: i64 = p.iter().enumerate().map(|(r, &d)| keep[r][d] as i64).sum();
                let e: f64 = p.iter().enumerate().map(|(r, &d)| extra[r][d]).sum();
                let key = (b, -k, e);
                if best.is_none_or(|x| key.partial_cmp(&x) == Some(std::cmp::Ordering::Less)) {
                    best = Some(key);
                }
            }
            let got = assign(&time, &keep, &extra);
            match (best, got) {
                (None, None) => {}
                (Some((b, k, e)), Some(a)) => {
                    let mut used = a.column.clone();
                    used.sort();
                    used.dedup();
                    assert_eq!(used.len(), rows, "case {case}: columns reused");
                    assert_eq!(a.bottleneck, b, "case {case}");
                    assert_eq!(a.kept as i64, -k, "case {case}");
                    let ge: f64 = a.column.iter().enumerate().map(|(r, &d)| extra[r][d]).sum();
                    assert_eq!(ge, e, "case {case}");
                }
                (b, g) => panic!("case {case}: brute force {b:?}, assign {g:?}"),
            }
        }
    }
}
