//! Jobs and the trace CSV they come in.
//!
//! One job per row: `job,arrival_s,gpus,duration_s[,min_gpus,max_gpus[,profile[,user]]]`. `duration_s`
//! is the job's run time on `gpus` devices of speed 1 placed as compactly as possible; an
//! elastic job gives `min_gpus` and `max_gpus` (both, or neither: a rigid job); `profile`
//! names a cost profile (JSON of `dualpipe plan`) whose simulated throughput replaces the
//! scaling curve; `user` names who submitted it (the policies predict a job's run time from the
//! same user's finished jobs, never from its own `duration_s`). A first row starting with `job,` is a header; empty lines and lines starting
//! with `#` are skipped.

use dualpipe_sim::topology::shown;
use serde::Serialize;

use crate::cluster::Cluster;
use crate::error::ClusterError;

/// The most jobs a trace may hold.
pub const MAX_JOBS: usize = 1_000_000;
/// The latest arrival and the longest run time of a job, in seconds (about 317 years): longer
/// is a unit mistake, and would overflow the simulated times.
pub const MAX_SECONDS: f64 = 1e10;

/// One training job.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Job {
    /// Its name (unique in the trace).
    pub name: String,
    /// When it is submitted, in seconds.
    pub arrival_s: f64,
    /// Devices it asks for.
    pub gpus: usize,
    /// Run time on `gpus` devices, in seconds.
    pub duration_s: f64,
    /// Fewest devices it can run on (`gpus` for a rigid job).
    pub min_gpus: usize,
    /// Most devices it can use (`gpus` for a rigid job).
    pub max_gpus: usize,
    /// Its cost profile's name, if any.
    pub profile: Option<String>,
    /// Who submitted it, if the trace says.
    pub user: Option<String>,
}

impl Job {
    /// Whether the job can run on other device counts than it asked for.
    pub fn elastic(&self) -> bool {
        self.min_gpus != self.max_gpus
    }
}

/// Parses a trace (a UTF-8 byte-order mark at the start is skipped). Errors name the line, the
/// column and the fix.
pub fn parse_trace(text: &str) -> Result<Vec<Job>, ClusterError> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut jobs = Vec::new();
    let mut names = std::collections::BTreeSet::new();
    for (i, line) in text.lines().enumerate() {
        let line_no = i + 1;
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if jobs.is_empty() && line.starts_with("job,") {
            continue;
        }
        if jobs.len() == MAX_JOBS {
            return Err(ClusterError::Trace(format!(
                "line {line_no}: more than {MAX_JOBS} jobs; split the trace"
            )));
        }
        let job = parse_row(line, line_no)?;
        if !names.insert(job.name.clone()) {
            return Err(ClusterError::Trace(format!(
                "line {line_no}: job {} appears twice; give each job its own name",
                job.name
            )));
        }
        jobs.push(job);
    }
    if jobs.is_empty() {
        return Err(ClusterError::Trace(
            "no jobs; give rows job,arrival_s,gpus,duration_s[,min_gpus,max_gpus,profile[,user]]"
                .into(),
        ));
    }
    Ok(jobs)
}

fn parse_row(line: &str, line_no: usize) -> Result<Job, ClusterError> {
    let bad = |what: String| ClusterError::Trace(format!("line {line_no}: {what}"));
    let cols: Vec<&str> = line.split(',').map(str::trim).collect();
    if !(cols.len() == 4 || (6..=8).contains(&cols.len())) {
        return Err(bad(format!(
            "{} columns; give job,arrival_s,gpus,duration_s[,min_gpus,max_gpus[,profile[,user]]]",
            cols.len()
        )));
    }
    let name = cols[0];
    if name.is_empty() {
        return Err(bad("job: empty name; give each job a name".into()));
    }
    if let Err(why) = crate::names::check_name(name) {
        return Err(bad(format!("job: {why}")));
    }
    let number = |col: usize, field: &str| -> Result<f64, ClusterError> {
        cols[col]
            .parse::<f64>()
            .map_err(|_| bad(format!("{field} = {:?}: not a number", cols[col])))
    };
    let count = |col: usize, field: &str| -> Result<usize, ClusterError> {
        cols[col].parse::<usize>().map_err(|_| {
            bad(format!(
                "{field} = {:?}: give a whole number of devices >= 1",
                cols[col]
            ))
        })
    };
    let arrival_s = number(1, "arrival_s")?;
    if !(0.0..=MAX_SECONDS).contains(&arrival_s) {
        return Err(bad(format!(
            "arrival_s = {}: give a time in seconds from 0 to {MAX_SECONDS:e} (317 years)",
            shown(arrival_s)
        )));
    }
    let gpus = count(2, "gpus")?;
    if gpus == 0 {
        return Err(bad("gpus = 0: a job needs at least 1 device".into()));
    }
    let duration_s = number(3, "duration_s")?;
    if !(duration_s > 0.0 && duration_s <= MAX_SECONDS) {
        return Err(bad(format!(
            "duration_s = {}: give a run time in seconds > 0 and at most {MAX_SECONDS:e} \
             (317 years)",
            shown(duration_s)
        )));
    }
    let (mut min_gpus, mut max_gpus) = (gpus, gpus);
    if cols.len() >= 6 {
        match (cols[4].is_empty(), cols[5].is_empty()) {
            (true, true) => {}
            (false, false) => {
                min_gpus = count(4, "min_gpus")?;
                max_gpus = count(5, "max_gpus")?;
                if min_gpus == 0 || min_gpus > gpus || max_gpus < gpus {
                    return Err(bad(format!(
                        "min_gpus = {min_gpus}, gpus = {gpus}, max_gpus = {max_gpus}: give 1 <= min_gpus <= gpus <= max_gpus"
                    )));
                }
            }
            _ => {
                return Err(bad(
                    "give both min_gpus and max_gpus, or leave both empty for a rigid job".into(),
                ))
            }
        }
    }
    let profile = cols.get(6).filter(|p| !p.is_empty()).map(|p| p.to_string());
    let user = cols.get(7).filter(|u| !u.is_empty()).map(|u| u.to_string());
    if let Some(Err(why)) = user.as_deref().map(crate::names::check_name) {
        return Err(bad(format!("user: {why}")));
    }
    Ok(Job {
        name: name.to_string(),
        arrival_s,
        gpus,
        duration_s,
        min_gpus,
        max_gpus,
        profile,
        user,
    })
}

/// Checks that every job can run on `cluster`: its `gpus` and `min_gpus` are at most the
/// cluster's devices (a larger `max_gpus` is capped by the policies, not refused).
pub fn check_fits(jobs: &[Job], cluster: &Cluster) -> Result<(), ClusterError> {
    let devices = cluster.devices();
    for job in jobs {
        if job.gpus > devices {
            return Err(ClusterError::Trace(format!(
                "job {}: gpus = {} but the cluster has {devices} devices; ask for at most {devices} or give a larger cluster",
                job.name, job.gpus
            )));
        }
    }
    Ok(())
}

/// The load a trace offers a cluster of `devices`: requested device-seconds (`gpus x
/// duration_s`) over `devices` x the arrival window (first to last arrival); 0 for a trace
/// whose jobs all arrive at once.
pub fn offered_load(jobs: &[Job], devices: usize) -> f64 {
    let work = requested_work(jobs);
    let (first, last) = arrival_window(jobs);
    let window = last - first;
    if devices == 0 || window.is_nan() || window <= 0.0 {
        return 0.0;
    }
    work / (devices as f64 * window)
}

/// The jobs' requested device-seconds: each job's `gpus x duration_s`, its work at the count
/// it asked for.
pub(crate) fn requested_work(jobs: &[Job]) -> f64 {
    jobs.iter().map(|j| j.gpus as f64 * j.duration_s).sum()
}

/// The first and the last arrival, in seconds ((inf, -inf) for no jobs).
pub(crate) fn arrival_window(jobs: &[Job]) -> (f64, f64) {
    jobs.iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), j| {
            (lo.min(j.arrival_s), hi.max(j.arrival_s))
        })
}

/// Writes jobs as trace CSV (with a header); `parse_trace` reads it back unchanged.
pub fn write_trace(jobs: &[Job]) -> String {
    let users = jobs.iter().any(|j| j.user.is_some());
    let mut out = String::from("job,arrival_s,gpus,duration_s,min_gpus,max_gpus,profile");
    out.push_str(if users { ",user\n" } else { "\n" });
    for j in jobs {
        let (min, max) = if j.elastic() {
            (j.min_gpus.to_string(), j.max_gpus.to_string())
        } else {
            (String::new(), String::new())
        };
        out.push_str(&format!(
            "{},{},{},{},{},{},{}\n",
            j.name,
            j.arrival_s,
            j.gpus,
            j.duration_s,
            min,
            max,
            j.profile.as_deref().unwrap_or("")
        ));
        if users {
            out.pop();
            out.push_str(&format!(",{}\n", j.user.as_deref().unwrap_or("")));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_rigid_and_elastic_rows() {
        let jobs = parse_trace(
            "job,arrival_s,gpus,duration_s,min_gpus,max_gpus,profile\n\
             # a comment\n\
             a,0,1,60\n\
             b,5.5,8,3600,4,16,\n\
             c,7,2,10,,,gpt.json\n",
        )
        .unwrap();
        assert_eq!(jobs.len(), 3);
        assert!(!jobs[0].elastic());
        assert_eq!((jobs[1].min_gpus, jobs[1].max_gpus), (4, 16));
        assert_eq!(jobs[2].profile.as_deref(), Some("gpt.json"));
        assert_eq!(parse_trace(&write_trace(&jobs)).unwrap(), jobs);
    }

    #[test]
    fn the_user_column_is_optional_and_written_only_when_given() {
        let jobs = parse_trace(
            "job,arrival_s,gpus,duration_s,min_gpus,max_gpus,profile,user\n\
             a,0,1,60,,,,alice\n\
             b,1,1,60,,,\n\
             c,2,1,60,,,,\n",
        )
        .unwrap();
        let users: Vec<Option<&str>> = jobs.iter().map(|j| j.user.as_deref()).collect();
        assert_eq!(users, [Some("alice"), None, None]);
        let text = write_trace(&jobs);
        assert!(text.starts_with("job,arrival_s,gpus,duration_s,min_gpus,max_gpus,profile,user\n"));
        assert!(text.contains("\na,0,1,60,,,,alice\n"), "{text}");
        assert_eq!(parse_trace(&text).unwrap(), jobs);
        // Without users, the seven columns as before.
        let rigid = parse_trace("a,0,1,60\n").unwrap();
        assert_eq!(
            write_trace(&rigid),
            "job,arrival_s,gpus,duration_s,min_gpus,max_gpus,profile\na,0,1,60,,,\n"
        );
        let err = parse_trace("a,0,1,60,,,,../x\n").unwrap_err().to_string();
        assert!(
            err.contains("line 1: user: ") && err.contains("../x"),
            "{err}"
        );
        let err = parse_trace("a,0,1,60,,,,u,9\n").unwrap_err().to_string();
        assert!(
            err.contains("9 columns") && err.contains("[,user]"),
            "{err}"
        );
    }

    #[test]
    fn refuses_bad_rows_in_one_line() {
        for (row, want) in [
            ("a,0,0,60", "line 1: gpus = 0"),
            ("a,-1,1,60", "line 1: arrival_s = -1"),
            ("a,0,1,-5", "line 1: duration_s = -5"),
            ("a,0,1,nan", "duration_s = NaN"),
            // Times past 317 years: a unit mistake, which overflowed the simulated times.
            ("a,1e308,1,60", "line 1: arrival_s = 1e308"),
            ("a,0,1,1e11", "line 1: duration_s = 1e11"),
            ("a,0,x,60", "gpus = \"x\""),
            ("a,0,4,60,8,16", "min_gpus = 8"),
            ("a,0,4,60,2,", "give both"),
            ("a,0,4", "3 columns"),
            ("a,0,1,1\na,1,1,1", "line 2: job a appears twice"),
            ("", "no jobs"),
        ] {
            let err = parse_trace(row).unwrap_err().to_string();
            assert!(err.contains(want), "{row}: {err}");
            assert!(!err.contains('\n'), "{err}");
        }
        let cluster = Cluster::uniform(2, 8).unwrap();
        let jobs = parse_trace("big,0,17,60").unwrap();
        let err = check_fits(&jobs, &cluster).unwrap_err().to_string();
        assert!(
            err.contains("gpus = 17 but the cluster has 16 devices"),
            "{err}"
        );
    }
}
