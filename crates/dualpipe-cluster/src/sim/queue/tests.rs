//! The indexed queue against the plain list it replaces: a vector in rank order, walked whole.

use proptest::prelude::*;

use super::*;

/// The model: the waiting jobs with their positions, walked in order.
struct Plain {
    waiting: Vec<(usize, usize)>, // (position, job)
}

impl Plain {
    fn next(&self, from: usize, fits: impl Fn(usize) -> bool) -> Option<(usize, usize)> {
        let mut sorted = self.waiting.clone();
        sorted.sort_unstable();
        sorted.into_iter().find(|&(p, j)| p >= from && fits(j))
    }
}

fn job(row: usize, arrival_s: f64, gpus: usize, min_gpus: usize) -> Job {
    Job {
        name: format!("j{row}"),
        arrival_s,
        gpus,
        duration_s: 1.0,
        min_gpus,
        max_gpus: gpus,
        profile: None,
        user: None,
    }
}

/// Jobs with arrivals that tie (the row breaks ties), 1 to 12 devices, `min_gpus` at most `gpus`.
fn jobs(specs: &[(u8, u8, u8)]) -> Vec<Job> {
    specs
        .iter()
        .enumerate()
        .map(|(row, &(arrival, gpus, least))| {
            let gpus = 1 + gpus as usize % 12;
            job(row, f64::from(arrival % 8), gpus, 1 + least as usize % gpus)
        })
        .collect()
}

proptest! {
    #[test]
    fn finds_what_a_walk_of_the_whole_queue_finds(
        specs in proptest::collection::vec((any::<u8>(), any::<u8>(), any::<u8>()), 1..40),
        ops in proptest::collection::vec((0u8..6, any::<u16>(), any::<u16>(), 0u16..2000), 1..120),
        thresholds in proptest::collection::vec(0u16..2000, 0..3),
    ) {
        let jobs = jobs(&specs);
        let (devices, largest) = (10, 4);
        let mut queue = Queue::new(&jobs, devices, largest);
        let mut service = vec![0.0; jobs.len()];
        let mut plain = Plain { waiting: Vec::new() };
        let ranked: Vec<f64> = thresholds.iter().map(|&t| f64::from(t)).collect();
        let mut ranked_yet = false;
        for (op, a, b, s) in ops {
            let j = a as usize % jobs.len();
            let from = b as usize % (2 * jobs.len() * (ranked.len() + 1));
            let cap = b as usize % 14;
            match op {
                0 | 1 => {
                    // Join (a waiting job has its service fixed; others attain more).
                    if !queue.contains(j) {
                        service[j] += f64::from(s);
                        queue.push(j, service[j]);
                        plain.waiting.push((queue.position_of(j, service[j]), j));
                    }
                }
                2 => {
                    let was = plain.waiting.iter().position(|w| w.1 == j);
                    prop_assert_eq!(queue.remove(j), was.is_some());
                    if let Some(i) = was {
                        plain.waiting.remove(i);
                    }
                }
                3 => {
                    let least = |j: usize| jobs[j].min_gpus.min(devices) <= cap;
                    prop_assert_eq!(queue.next_fitting(from, Need::Least, cap), plain.next(from, least));
                    let in_node = |j: usize| jobs[j].gpus <= largest && jobs[j].gpus <= cap;
                    prop_assert_eq!(queue.next_fitting(from, Need::InNode, cap), plain.next(from, in_node));
                    let wide = |j: usize| jobs[j].gpus > largest && jobs[j].gpus <= cap;
                    prop_assert_eq!(queue.next_fitting(from, Need::Wide, cap), plain.next(from, wide));
                    let any = |j: usize| jobs[j].gpus <= cap;
                    prop_assert_eq!(queue.next_asking_at_most(from, cap), plain.next(from, any));
                }
                4 => {
                    let mut sorted = plain.waiting.clone();
                    sorted.sort_unstable();
                    let order: Vec<usize> = sorted.iter().map(|w| w.1).collect();
                    prop_assert_eq!(queue.iter().collect::<Vec<_>>(), order.clone());
                    prop_assert_eq!(queue.first(), order.first().copied());
                    prop_assert_eq!((queue.len(), queue.is_empty()), (order.len(), order.is_empty()));
                }
                _ => {
                    // Rank by service (once; again is a no-op), re-placing those waiting.
                    let twice = ranked_yet;
                    let before: Vec<usize> = queue.iter().collect();
                    queue.rank_by(&ranked, |j| service[j]);
                    ranked_yet = true;
                    for w in &mut plain.waiting {
                        w.0 = queue.position_of(w.1, service[w.1]);
                    }
                    if twice {
                        prop_assert_eq!(queue.iter().collect::<Vec<_>>(), before);
                    }
                }
            }
        }
    }
}

#[test]
fn ranks_by_class_then_arrival_then_row() {
    // Rows 0 and 2 arrive together; row 1 first.
    let jobs = vec![job(0, 5.0, 1, 1), job(1, 2.0, 1, 1), job(2, 5.0, 1, 1)];
    let mut queue = Queue::new(&jobs, 8, 8);
    for j in [2, 0, 1] {
        queue.push(j, 0.0);
    }
    assert_eq!(queue.iter().collect::<Vec<_>>(), [1, 0, 2]);
    // Row 1 attained past the threshold: it drops behind the others.
    let service = [0.0, 50.0, 0.0];
    queue.rank_by(&[10.0], |j| service[j]);
    assert_eq!(queue.iter().collect::<Vec<_>>(), [0, 2, 1]);
    assert_eq!(queue.first(), Some(0));
    assert!(queue.remove(0) && !queue.remove(0));
    assert_eq!(queue.iter().collect::<Vec<_>>(), [2, 1]);
}
