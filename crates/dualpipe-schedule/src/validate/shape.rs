//! Phase 1, the shape: one program per rank, a placement over the schedule's ranks,
//! micro-batches that split evenly over the directions; and the [`Geometry`] (sizes, chunk
//! ids, who runs which stage, message peers) the later phases look things up in.

use super::{fail, Res, Rule, ValidationError, NONE};
use crate::ir::{Neighbour, Peers};
use crate::{Chunk, Op, Schedule};

/// Sizes and lookups shared by the checks.
pub(super) struct Geometry<'a> {
    pub(super) schedule: &'a Schedule,
    pub(super) dirs: usize,
    pub(super) stages: usize,
    pub(super) per_dir: usize,
    /// `rank_of[dir * stages + stage]`.
    pub(super) rank_of: Vec<usize>,
    /// Every stage's message peers.
    pub(super) peers: Peers,
}

impl Geometry<'_> {
    pub(super) fn in_range(&self, c: Chunk) -> bool {
        c.dir < self.dirs && c.stage < self.stages && c.mb < self.per_dir
    }

    pub(super) fn id(&self, c: Chunk) -> usize {
        (c.dir * self.stages + c.stage) * self.per_dir + c.mb
    }

    pub(super) fn chunk(&self, id: usize) -> Chunk {
        let ds = id / self.per_dir;
        Chunk::new(ds / self.stages, ds % self.stages, id % self.per_dir)
    }

    pub(super) fn rank(&self, dir: usize, stage: usize) -> usize {
        self.rank_of[dir * self.stages + stage]
    }

    /// The rank of the next stage when it exists and runs on another rank than `c`'s.
    #[inline]
    pub(super) fn remote_next(&self, c: Chunk) -> Option<usize> {
        self.peers.get(c, Neighbour::Next)
    }

    /// The rank of the previous stage when it exists and runs on another rank than `c`'s.
    #[inline]
    pub(super) fn remote_prev(&self, c: Chunk) -> Option<usize> {
        self.peers.get(c, Neighbour::Prev)
    }

    /// The id of a chunk in range on `rank`, or the error of the rule it breaks.
    #[inline(always)]
    pub(super) fn own(&self, c: Chunk, rank: usize, index: usize, op: &Op) -> Res<usize> {
        if c.dir < self.dirs && c.stage < self.stages && c.mb < self.per_dir {
            let ds = c.dir * self.stages + c.stage;
            if self.rank_of[ds] == rank {
                return Ok(ds * self.per_dir + c.mb);
            }
        }
        Err(self.not_own(c, rank, index, op))
    }

    #[cold]
    #[inline(never)]
    pub(super) fn not_own(
        &self,
        c: Chunk,
        rank: usize,
        index: usize,
        op: &Op,
    ) -> Box<ValidationError> {
        let at = Some((index, op));
        if !self.in_range(c) {
            return fail(
                rank,
                at,
                Rule::ChunkRange,
                &format!(
                    "chunk {c} is outside the schedule ({} direction(s), {} stages, {} \
                     micro-batches per direction)",
                    self.dirs, self.stages, self.per_dir
                ),
            );
        }
        fail(
            rank,
            at,
            Rule::Placement,
            &format!(
                "stage {} of direction {} runs on rank {}, not here",
                c.stage,
                c.dir,
                self.rank(c.dir, c.stage)
            ),
        )
    }

    pub(super) fn op(&self, rank: usize, index: u32) -> (usize, &Op) {
        (
            index as usize,
            &self.schedule.programs[rank][index as usize],
        )
    }
}

fn shape_err(rank: usize, detail: &str) -> Box<ValidationError> {
    fail(rank, None, Rule::Shape, detail)
}

pub(super) fn check_shape(schedule: &Schedule) -> Res<Geometry<'_>> {
    let ranks = schedule.ranks;
    let placement = &schedule.placement;
    if ranks == 0 {
        return Err(shape_err(0, "the schedule has no ranks; use at least 1"));
    }
    if schedule.programs.len() != ranks {
        return Err(shape_err(
            0,
            &format!(
                "the schedule has {ranks} ranks but {} programs; give one program per rank",
                schedule.programs.len()
            ),
        ));
    }
    if placement.ranks != ranks {
        return Err(shape_err(
            0,
            &format!(
                "the placement is for {} ranks but the schedule has {ranks}",
                placement.ranks
            ),
        ));
    }
    let dirs = placement.dirs();
    let stages = placement.stages();
    if dirs == 0 || stages == 0 {
        return Err(shape_err(0, "the placement holds no stages"));
    }
    for (dir, row) in placement.rank_of.iter().enumerate() {
        if row.len() != stages {
            return Err(shape_err(
                0,
                &format!(
                    "direction {dir} has {} stages but direction 0 has {stages}; every direction \
                     runs the same stages",
                    row.len()
                ),
            ));
        }
        if let Some((stage, &r)) = row.iter().enumerate().find(|(_, &r)| r >= ranks) {
            return Err(shape_err(
                0,
                &format!(
                    "the placement puts stage {stage} of direction {dir} on rank {r}, but there \
                     are only {ranks} ranks"
                ),
            ));
        }
    }
    if schedule.micro_batches == 0 || !schedule.micro_batches.is_multiple_of(dirs) {
        return Err(shape_err(
            0,
            &format!(
                "{} micro-batches do not split evenly over {dirs} direction(s); use a positive \
                 multiple of {dirs}",
                schedule.micro_batches
            ),
        ));
    }
    let per_dir = schedule.micro_batches / dirs;
    for (rank, program) in schedule.programs.iter().enumerate() {
        if program.len() >= NONE as usize {
            return Err(shape_err(rank, "the program holds more than 2^32 - 2 ops"));
        }
    }
    // Every chunk needs a forward: when the programs hold fewer ops than chunks, find a rank
    // short of forwards before allocating per-chunk tables (the sizes may come from an
    // untrusted file). Otherwise the tables are no bigger than the programs.
    let total_ops: usize = schedule.programs.iter().map(Vec::len).sum();
    let chunks = dirs
        .checked_mul(stages)
        .and_then(|x| x.checked_mul(per_dir));
    if chunks.is_none_or(|n| n > total_ops) {
        let stages_of = placement.parameter_copies();
        for (rank, program) in schedule.programs.iter().enumerate() {
            let forwards = program
                .iter()
                .filter(|op| matches!(op, Op::F(_) | Op::FB { .. }))
                .count();
            let needed = stages_of[rank].checked_mul(per_dir);
            if needed.is_none_or(|n| forwards < n) {
                return Err(fail(
                    rank,
                    None,
                    Rule::Missing,
                    &format!(
                        "the rank runs {forwards} forwards, but its {} stage(s) x {per_dir} \
                         micro-batches need one each; add the missing F ops",
                        stages_of[rank]
                    ),
                ));
            }
        }
    }
    Ok(Geometry {
        schedule,
        dirs,
        stages,
        per_dir,
        rank_of: placement.rank_of.iter().flatten().copied().collect(),
        peers: Peers::new(placement),
    })
}
