//! The job x slot assignment: Kuhn-Munkres (`pathfinding`) on a reward matrix, with "not now"
//! allowed for every job.
//!
//! `reward[j][s]` is what placing job `j` on slot `s` is worth; `None` forbids the pair. The
//! answer maximises the total reward over assignments in which each job takes at most one slot
//! and each slot at most one job, leaving a job unplaced when no allowed slot is left to it (or
//! when taking one would cost more to the others). Rewards must be `>= 0`.

use pathfinding::kuhn_munkres::kuhn_munkres;
use pathfinding::matrix::Matrix;

/// Each job's slot (or `None`) maximising the summed reward.
pub fn assign(reward: &[Vec<Option<i64>>]) -> Vec<Option<usize>> {
    let rows = reward.len();
    if rows == 0 {
        return Vec::new();
    }
    let slots = reward[0].len();
    // A forbidden pair weighs less than leaving every job unplaced could ever cost.
    let forbidden = -(reward
        .iter()
        .flatten()
        .flatten()
        .fold(0i64, |a, &r| a.saturating_add(r.max(0)))
        .saturating_add(1));
    // Columns: the slots, then one "not now" column per job (reward 0 for its own job only).
    let mut weights = Matrix::new(rows, slots + rows, forbidden);
    for (j, row) in reward.iter().enumerate() {
        assert_eq!(row.len(), slots, "every job rates every slot");
        for (s, r) in row.iter().enumerate() {
            if let Some(r) = r {
                weights[(j, s)] = *r;
            }
        }
        weights[(j, slots + j)] = 0;
    }
    let (_, column) = kuhn_munkres(&weights);
    column
        .into_iter()
        .map(|c| (c < slots).then_some(c))
        .collect()
}

/// The summed reward of an assignment (for tests and reports).
pub fn total(reward: &[Vec<Option<i64>>], answer: &[Option<usize>]) -> i64 {
    answer
        .iter()
        .enumerate()
        .filter_map(|(j, s)| s.map(|s| reward[j][s].expect("an allowed pair")))
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Brute force: every injective partial map of jobs to slots.
    fn best(reward: &[Vec<Option<i64>>], j: usize, used: &mut Vec<bool>) -> i64 {
        if j == reward.len() {
            return 0;
        }
        let mut b = best(reward, j + 1, used);
        for s in 0..used.len() {
            if let (false, Some(r)) = (used[s], reward[j][s]) {
                used[s] = true;
                b = b.max(r + best(reward, j + 1, used));
                used[s] = false;
            }
        }
        b
    }

    proptest! {
        #[test]
        fn matches_brute_force(
            rows in 1usize..5,
            slots in 1usize..5,
            cells in proptest::collection::vec(proptest::option::weighted(0.7, 0i64..1000), 25),
        ) {
            let reward: Vec<Vec<Option<i64>>> = (0..rows)
                .map(|j| (0..slots).map(|s| cells[j * 5 + s]).collect())
                .collect();
            let answer = assign(&reward);
            // Valid: allowed pairs only, no slot twice.
            let mut seen = vec![false; slots];
            for (j, s) in answer.iter().enumerate() {
                if let Some(s) = *s {
                    prop_assert!(reward[j][s].is_some());
                    prop_assert!(!seen[s]);
                    seen[s] = true;
                }
            }
            prop_assert_eq!(total(&reward, &answer), best(&reward, 0, &mut vec![false; slots]));
        }
    }

    #[test]
    fn leaves_a_job_out_when_nothing_is_allowed() {
        let reward = vec![vec![Some(5), None], vec![Some(7), None], vec![None, None]];
        let answer = assign(&reward);
        assert_eq!(answer[2], None);
        assert_eq!(total(&reward, &answer), 7);
    }
}
