//! One replica's ends of its data-parallel groups ([`ReplicaLinks`]), before its exchange
//! is built: per model stage, how the stage's group moves gradients ([`GroupLink`]).

use dualpipe_dp::{AllReduce, GradTransport};

/// A data-parallel group's transport, as one replica's end of it.
pub type GroupTransport = Box<dyn GradTransport + Send>;

/// How one model stage's group exchanges its gradients.
pub enum GroupLink {
    /// Our bucketed reduce-scatter and all-gather on point-to-point messages (every
    /// compression); the group is the stage's holder in every replica, which holds every copy
    /// of the stage (summed before they join it) or its only one.
    Messages(GroupTransport),
    /// A library's own sum (MPI's `MPI_Iallreduce`), uncompressed only, of `f32` or `f64`
    /// gradients (the run's type); the group holds **every copy** of the stage in every
    /// replica (DualPipe: `2 D` members, each adding its own copy), and the sum is divided by
    /// the replica count.
    SumF32(Box<dyn AllReduce<f32>>),
    /// As [`GroupLink::SumF32`], for `f64` runs.
    SumF64(Box<dyn AllReduce<f64>>),
    /// This process holds the lowest direction's copy of a stage whose other copies are in
    /// other processes of its replica (DualPipe, one rank per process): it sums the copies
    /// as they come over `copies` (the stage's copy holders in direction order, this one
    /// first) and exchanges the sum over `replicas` (the stage's lead in every replica), as a
    /// process holding every copy does ([`CopyLead`]).
    Lead {
        /// The stage's lead in every replica.
        replicas: GroupTransport,
        /// The stage's copy holders in this replica, in direction order (this one first).
        copies: GroupTransport,
    },
    /// This process holds another copy of such a stage: it sends its copy to the lead over
    /// the copy holders' group (in direction order) and takes the result back
    /// ([`CopyPartner`]).
    Partner(GroupTransport),
}

/// One replica's ends of its data-parallel groups, before the exchange is built.
pub struct ReplicaLinks {
    /// This replica's index, and the replica count.
    pub replica: usize,
    /// The replica count.
    pub replicas: usize,
    /// Per model stage this replica holds: the stage and its group.
    pub stages: Vec<(usize, GroupLink)>,
    /// The group of every replica, for the step's losses.
    pub losses: GroupTransport,
}

impl std::fmt::Debug for ReplicaLinks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplicaLinks")
            .field("replica", &self.replica)
            .field("replicas", &self.replicas)
            .field("stages", &self.stages.len())
            .finish()
    }
}
