//! Who started this process: rank and world size from the launcher's environment variables.
//!
//! A multi-process run is started by a launcher that tells every process its rank and the
//! number of processes through environment variables. [`LaunchInfo::from_env`] reads those of
//! Open MPI (`mpirun`), MPICH / Intel MPI (Hydra's PMI), Slurm (`srun`) and PyTorch's
//! `torchrun`, so a run can check before any message moves that it got the world it expects
//! ([`LaunchInfo::check_world`]) and report it. torchrun's `MASTER_ADDR` / `MASTER_PORT` /
//! `LOCAL_RANK` are read and reported for transports that rendezvous over TCP (NCCL).
//!
//! When several launchers' variables are present the most specific wins: an MPI launcher's
//! own variables first (Open MPI, then PMI), then torchrun's, then Slurm's, because `mpirun`
//! inside a Slurm allocation inherits the batch shell's `SLURM_PROCID=0` for every process.

use std::fmt;

/// The launcher whose variables gave the rank and the world size.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Launcher {
    /// Open MPI's `mpirun` / `mpiexec` (`OMPI_COMM_WORLD_RANK`, `OMPI_COMM_WORLD_SIZE`).
    OpenMpi,
    /// MPICH, Intel MPI or any PMI launcher such as Hydra's `mpiexec` (`PMI_RANK`, `PMI_SIZE`).
    Pmi,
    /// PyTorch's `torchrun` (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR`, `MASTER_PORT`).
    Torchrun,
    /// Slurm's `srun` (`SLURM_PROCID`, `SLURM_NTASKS`).
    Slurm,
    /// No launcher variables: a process started by hand.
    None,
}

impl Launcher {
    /// A short human name: `Open MPI`, `MPICH/PMI`, `torchrun`, `Slurm`, `none`.
    pub fn name(self) -> &'static str {
        match self {
            Launcher::OpenMpi => "Open MPI",
            Launcher::Pmi => "MPICH/PMI",
            Launcher::Torchrun => "torchrun",
            Launcher::Slurm => "Slurm",
            Launcher::None => "none",
        }
    }
}

impl fmt::Display for Launcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Why the launch environment cannot be used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LaunchError {
    /// A variable is set but is not a number in range.
    #[error("environment variable {name}={value:?} is not {expected}; it is set by the launcher ({launcher}), so check how the processes were started")]
    BadVariable {
        /// The variable.
        name: String,
        /// Its value.
        value: String,
        /// What it should be, e.g. `a rank below the world size 4`.
        expected: String,
        /// The launcher it belongs to.
        launcher: Launcher,
    },
    /// The process was not started by a launcher.
    #[error(
        "no launcher: none of OMPI_COMM_WORLD_RANK, PMI_RANK, RANK or SLURM_PROCID is set, so \
         this process was not started by mpirun, mpiexec or srun; start {ranks} processes \
         with `mpirun -n {ranks} ...` or `srun -n {ranks} ...`"
    )]
    NoLauncher {
        /// The ranks the run asked for.
        ranks: usize,
    },
    /// The launcher started a different number of processes than the run asked for.
    #[error(
        "{launcher} started {world_size} processes but the run asks for `ranks` {ranks}: \
         start it with `-n {ranks}` or give `ranks` {world_size} (one process per pipeline rank)"
    )]
    WorldSizeMismatch {
        /// The launcher.
        launcher: Launcher,
        /// Processes the launcher started.
        world_size: usize,
        /// Ranks the run asks for.
        ranks: usize,
    },
    /// The launcher's variables and the communication library disagree.
    #[error(
        "the launcher ({launcher}) says rank {env_rank} of {env_size} but MPI says rank \
         {mpi_rank} of {mpi_size}: the binary was probably built against another MPI than the \
         `mpirun` that started it; use the launcher of the MPI it was built with"
    )]
    Disagree {
        /// The launcher.
        launcher: Launcher,
        /// Rank from the environment.
        env_rank: usize,
        /// World size from the environment.
        env_size: usize,
        /// Rank from MPI.
        mpi_rank: usize,
        /// World size from MPI.
        mpi_size: usize,
    },
}

/// Rank, world size and rendezvous details, as the launcher gave them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LaunchInfo {
    /// Whose variables these are.
    pub launcher: Launcher,
    /// This process's rank (0 without a launcher).
    pub rank: usize,
    /// Number of processes (1 without a launcher).
    pub world_size: usize,
    /// Rank among the processes of this machine, when the launcher says.
    pub local_rank: Option<usize>,
    /// torchrun's rendezvous host (`MASTER_ADDR`), kept for TCP-based transports.
    pub master_addr: Option<String>,
    /// torchrun's rendezvous port (`MASTER_PORT`).
    pub master_port: Option<u16>,
}

/// (rank variable, size variable, local-rank variable) of each launcher, in precedence order.
const SOURCES: [(Launcher, &str, &str, &str); 4] = [
    (
        Launcher::OpenMpi,
        "OMPI_COMM_WORLD_RANK",
        "OMPI_COMM_WORLD_SIZE",
        "OMPI_COMM_WORLD_LOCAL_RANK",
    ),
    (Launcher::Pmi, "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"),
    (Launcher::Torchrun, "RANK", "WORLD_SIZE", "LOCAL_RANK"),
    (
        Launcher::Slurm,
        "SLURM_PROCID",
        "SLURM_NTASKS",
        "SLURM_LOCALID",
    ),
];

impl LaunchInfo {
    /// Reads the launcher variables of this process's environment.
    pub fn from_env() -> Result<Self, LaunchError> {
        Self::from_vars(|name| std::env::var(name).ok())
    }

    /// Reads the launcher variables through `var` (the environment, or a map in tests).
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Self, LaunchError> {
        let mut info = LaunchInfo {
            launcher: Launcher::None,
            rank: 0,
            world_size: 1,
            local_rank: None,
            master_addr: non_empty(var("MASTER_ADDR")),
            master_port: None,
        };
        if let Some(value) = non_empty(var("MASTER_PORT")) {
            info.master_port =
                Some(value.trim().parse().map_err(|_| LaunchError::BadVariable {
                    name: "MASTER_PORT".into(),
                    value: value.clone(),
                    expected: "a TCP port (0..=65535)".into(),
                    launcher: Launcher::Torchrun,
                })?);
        }
        for (launcher, rank_var, size_var, local_var) in SOURCES {
            let Some(rank_text) = non_empty(var(rank_var)) else {
                continue;
            };
            // Slurm's task count has an older spelling.
            let size_text = non_empty(var(size_var)).or_else(|| {
                (launcher == Launcher::Slurm)
                    .then(|| non_empty(var("SLURM_NPROCS")))
                    .flatten()
            });
            let Some(size_text) = size_text else {
                return Err(LaunchError::BadVariable {
                    name: size_var.into(),
                    value: String::new(),
                    expected: format!("set (the world size) when {rank_var} is set"),
                    launcher,
                });
            };
            let world_size = parse(size_var, &size_text, launcher, usize::MAX, "a world size")?;
            if world_size == 0 {
                return Err(LaunchError::BadVariable {
                    name: size_var.into(),
                    value: size_text,
                    expected: "a world size of at least 1".into(),
                    launcher,
                });
            }
            info.launcher = launcher;
            info.world_size = world_size;
            info.rank = parse(
                rank_var,
                &rank_text,
                launcher,
                world_size,
                &format!("a rank below the world size {world_size}"),
            )?;
            info.local_rank = match non_empty(var(local_var)) {
                Some(text) => Some(parse(
                    local_var,
                    &text,
                    launcher,
                    usize::MAX,
                    "a local rank",
                )?),
                None => None,
            };
            break;
        }
        Ok(info)
    }

    /// Whether a launcher started this process.
    pub fn launched(&self) -> bool {
        self.launcher != Launcher::None
    }

    /// Checks that a launcher started exactly `ranks` processes (one per pipeline rank).
    pub fn check_world(&self, ranks: usize) -> Result<(), LaunchError> {
        if !self.launched() {
            return Err(LaunchError::NoLauncher { ranks });
        }
        if self.world_size != ranks {
            return Err(LaunchError::WorldSizeMismatch {
                launcher: self.launcher,
                world_size: self.world_size,
                ranks,
            });
        }
        Ok(())
    }

    /// Checks that the communication library sees the same rank and world size as the
    /// launcher's variables (they differ when the binary and `mpirun` come from two MPIs).
    /// Without launcher variables there is nothing to compare.
    pub fn check_agrees(&self, mpi_rank: usize, mpi_size: usize) -> Result<(), LaunchError> {
        if !self.launched() || (self.rank, self.world_size) == (mpi_rank, mpi_size) {
            return Ok(());
        }
        Err(LaunchError::Disagree {
            launcher: self.launcher,
            env_rank: self.rank,
            env_size: self.world_size,
            mpi_rank,
            mpi_size,
        })
    }
}

impl fmt::Display for LaunchInfo {
    /// `rank 2 of 4 (launcher Open MPI, local rank 2)`, plus torchrun's rendezvous if set.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "rank {} of {} (launcher {}",
            self.rank, self.world_size, self.launcher
        )?;
        if let Some(local) = self.local_rank {
            write!(f, ", local rank {local}")?;
        }
        if let Some(addr) = &self.master_addr {
            write!(f, ", master {addr}")?;
            if let Some(port) = self.master_port {
                write!(f, ":{port}")?;
            }
        }
        f.write_str(")")
    }
}

fn non_empty(value: Option<String>) -> Option<String> {
    value.filter(|v| !v.trim().is_empty())
}

/// Parses `text` as a number below `limit`.
fn parse(
    name: &str,
    text: &str,
    launcher: Launcher,
    limit: usize,
    expected: &str,
) -> Result<usize, LaunchError> {
    match text.trim().parse::<usize>() {
        Ok(value) if value < limit => Ok(value),
        _ => Err(LaunchError::BadVariable {
            name: name.into(),
            value: text.into(),
            expected: expected.into(),
            launcher,
        }),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn info(vars: &[(&str, &str)]) -> Result<LaunchInfo, LaunchError> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        LaunchInfo::from_vars(|name| map.get(name).cloned())
    }

    #[test]
    fn no_variables_means_no_launcher() {
        let got = info(&[]).unwrap();
        assert_eq!(got.launcher, Launcher::None);
        assert_eq!((got.rank, got.world_size), (0, 1));
        assert!(!got.launched());
        let err = got.check_world(4).unwrap_err();
        assert_eq!(err, LaunchError::NoLauncher { ranks: 4 });
        assert!(err.to_string().contains("mpirun -n 4"), "{err}");
    }

    /// (variables, launcher, rank, world size, local rank)
    type Case<'a> = (
        &'a [(&'a str, &'a str)],
        Launcher,
        usize,
        usize,
        Option<usize>,
    );

    #[test]
    fn each_launcher_is_read() {
        let cases: [Case; 5] = [
            (
                &[
                    ("OMPI_COMM_WORLD_RANK", "2"),
                    ("OMPI_COMM_WORLD_SIZE", "4"),
                    ("OMPI_COMM_WORLD_LOCAL_RANK", "0"),
                ],
                Launcher::OpenMpi,
                2,
                4,
                Some(0),
            ),
            (
                &[
                    ("PMI_RANK", "3"),
                    ("PMI_SIZE", "4"),
                    ("MPI_LOCALRANKID", "3"),
                ],
                Launcher::Pmi,
                3,
                4,
                Some(3),
            ),
            (
                &[
                    ("SLURM_PROCID", "1"),
                    ("SLURM_NTASKS", "8"),
                    ("SLURM_LOCALID", "1"),
                ],
                Launcher::Slurm,
                1,
                8,
                Some(1),
            ),
            (
                &[("SLURM_PROCID", "5"), ("SLURM_NPROCS", "6")],
                Launcher::Slurm,
                5,
                6,
                None,
            ),
            (
                &[("RANK", "0"), ("WORLD_SIZE", "2"), ("LOCAL_RANK", "0")],
                Launcher::Torchrun,
                0,
                2,
                Some(0),
            ),
        ];
        for (vars, launcher, rank, size, local) in cases {
            let got = info(vars).unwrap();
            assert_eq!(got.launcher, launcher, "{vars:?}");
            assert_eq!(
                (got.rank, got.world_size, got.local_rank),
                (rank, size, local)
            );
            got.check_world(size).unwrap();
        }
    }

    #[test]
    fn mpi_launchers_win_over_an_enclosing_slurm_allocation() {
        // mpirun inside an sbatch script: every process inherits SLURM_PROCID=0.
        let got = info(&[
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "4"),
            ("PMI_RANK", "2"),
            ("PMI_SIZE", "4"),
        ])
        .unwrap();
        assert_eq!((got.launcher, got.rank), (Launcher::Pmi, 2));
        let got = info(&[
            ("PMI_RANK", "1"),
            ("PMI_SIZE", "4"),
            ("OMPI_COMM_WORLD_RANK", "3"),
            ("OMPI_COMM_WORLD_SIZE", "4"),
        ])
        .unwrap();
        assert_eq!((got.launcher, got.rank), (Launcher::OpenMpi, 3));
    }

    #[test]
    fn torchrun_rendezvous_is_reported() {
        let got = info(&[
            ("RANK", "1"),
            ("WORLD_SIZE", "2"),
            ("LOCAL_RANK", "1"),
            ("MASTER_ADDR", "node07"),
            ("MASTER_PORT", "29500"),
        ])
        .unwrap();
        assert_eq!(got.master_addr.as_deref(), Some("node07"));
        assert_eq!(got.master_port, Some(29500));
        assert_eq!(
            got.to_string(),
            "rank 1 of 2 (launcher torchrun, local rank 1, master node07:29500)"
        );
    }

    #[test]
    fn world_size_mismatch_names_both_numbers() {
        let got = info(&[("PMI_RANK", "0"), ("PMI_SIZE", "3")]).unwrap();
        let err = got.check_world(4).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("started 3 processes"), "{text}");
        assert!(text.contains("`ranks` 4"), "{text}");
        assert!(text.contains("-n 4"), "{text}");
    }

    #[test]
    fn bad_values_name_the_variable() {
        let cases: [&[(&str, &str)]; 5] = [
            &[("PMI_RANK", "x"), ("PMI_SIZE", "4")],
            &[("PMI_RANK", "4"), ("PMI_SIZE", "4")],
            &[("PMI_RANK", "0"), ("PMI_SIZE", "0")],
            &[("OMPI_COMM_WORLD_RANK", "0")],
            &[("MASTER_PORT", "99999")],
        ];
        for vars in cases {
            let err = info(vars).unwrap_err();
            let LaunchError::BadVariable { name, .. } = &err else {
                panic!("{vars:?}: {err:?}");
            };
            assert!(err.to_string().contains(name.as_str()));
        }
    }

    #[test]
    fn launcher_and_mpi_must_agree() {
        let got = info(&[("OMPI_COMM_WORLD_RANK", "1"), ("OMPI_COMM_WORLD_SIZE", "2")]).unwrap();
        got.check_agrees(1, 2).unwrap();
        let err = got.check_agrees(0, 1).unwrap_err();
        assert!(
            err.to_string().contains("built against another MPI"),
            "{err}"
        );
        LaunchInfo::from_vars(|_| None)
            .unwrap()
            .check_agrees(0, 1)
            .unwrap();
    }
}
