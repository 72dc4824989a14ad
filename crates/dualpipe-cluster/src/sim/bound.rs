//! The rigid clairvoyant bound on the makespan: no schedule that runs every job on its
//! requested devices for its run time (`duration_s`) ends sooner, whatever it knows.
//!
//! It is the larger of two, measured from the first arrival as the makespan is:
//!
//! * the latest `arrival_s + duration_s` over all jobs (a job cannot end before it arrived and
//!   ran);
//! * over each arrival time `t`: `t + W(t) / devices`, where `W(t)` is the device-seconds
//!   (`gpus x duration_s`) of the jobs arriving at `t` or later (that work cannot start before
//!   `t`, and the pool does at most `devices` device-seconds a second).
//!
//! A policy that grows jobs past their request, or runs them on devices faster than speed 1,
//! can end sooner than this bound; `bound_share` (bound over makespan) may then exceed 1.

use crate::trace::Job;

/// The bound in seconds from the first arrival (0 for no jobs); `devices > 0`.
pub fn makespan_bound(jobs: &[Job], devices: usize) -> f64 {
    let Some(first) = jobs.iter().map(|j| j.arrival_s).min_by(f64::total_cmp) else {
        return 0.0;
    };
    let longest = jobs
        .iter()
        .map(|j| j.arrival_s + j.duration_s)
        .fold(f64::NEG_INFINITY, f64::max);
    let mut by_arrival: Vec<&Job> = jobs.iter().collect();
    by_arrival.sort_by(|a, b| b.arrival_s.total_cmp(&a.arrival_s));
    // From the latest arrival back: the work arriving at t or later, summed once per time.
    let mut after = 0.0;
    let mut packed = f64::NEG_INFINITY;
    let mut i = 0;
    while i < by_arrival.len() {
        let t = by_arrival[i].arrival_s;
        while i < by_arrival.len() && by_arrival[i].arrival_s == t {
            after += by_arrival[i].gpus as f64 * by_arrival[i].duration_s;
            i += 1;
        }
        packed = packed.max(t + after / devices as f64);
    }
    longest.max(packed) - first
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::parse_trace;

    fn bound(csv: &str, devices: usize) -> f64 {
        let jobs = parse_trace(&format!("job,arrival_s,gpus,duration_s\n{csv}")).unwrap();
        makespan_bound(&jobs, devices)
    }

    #[test]
    fn the_longest_job_sets_it_on_a_light_trace() {
        // 8 devices, 3 jobs: work 1x100 + 2x50 + 1x300 = 500 device-s; from t=0, 500/8 = 62.5;
        // from t=10, (100 + 300)/8 + 10 = 60; from t=20, 300/8 + 20 = 57.5. The 1-device
        // job of 300 s arriving at 20 ends at 320 at the earliest.
        assert_eq!(bound("a,0,1,100\nb,10,2,50\nc,20,1,300\n", 8), 320.0);
    }

    #[test]
    fn the_work_after_an_arrival_sets_it_on_a_heavy_trace() {
        // 2 devices. Jobs: a (t=0, 2 x 100), b (t=50, 2 x 100), c (t=50, 1 x 100).
        // Longest: 50 + 100 = 150. From 0: 500/2 = 250. From 50: 50 + 300/2 = 200. So 250.
        assert_eq!(bound("a,0,2,100\nb,50,2,100\nc,50,1,100\n", 2), 250.0);
        // Starting the clock at the first arrival: the same trace shifted by 1000 s.
        assert_eq!(
            bound("a,1000,2,100\nb,1050,2,100\nc,1050,1,100\n", 2),
            250.0
        );
    }

    #[test]
    fn a_late_burst_sets_it_over_the_whole_trace() {
        // 4 devices. A small job at 0, then at t=100 four 4-device jobs of 50 s: from 100,
        // 100 + 800/4 = 300; from 0, (10 + 800)/4 = 202.5; the longest ends at 150.
        let csv = "a,0,1,10\nb,100,4,50\nc,100,4,50\nd,100,4,50\ne,100,4,50\n";
        assert_eq!(bound(csv, 4), 300.0);
    }

    #[test]
    fn no_jobs_no_bound() {
        assert_eq!(makespan_bound(&[], 4), 0.0);
    }
}
