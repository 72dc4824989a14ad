//! EPLB inside training: an exponential moving average of the router's tokens per (block,
//! expert), and every [`MoeSettings::eplb_every`] steps a new placement from our
//! migration-aware planner ([`dualpipe_eplb::plan`] with the previous placement), taking effect
//! on every copy of every MoE block at once, stamped with its version (the step it took effect
//! from), after its transfers ([`crate::parallel::experts::shards::move_experts`]). Every replica computes
//! the same plan from the same group-wide counts, so no plan travels.

use dualpipe_eplb::moves::move_plan;
use dualpipe_eplb::{Layout, LoadMatrix, Planner, PreviousPlacement};
use dualpipe_nn::gpt::moe::parallel::ExpertPlacement;

use crate::error::TrainError;
use crate::parallel::experts::group::placement_of_slots;
use crate::parallel::experts::shards::Transfer;
use crate::parallel::experts::MoeSettings;

/// Weight of the history in the moving average of the counts (`ema = 0.9·ema + 0.1·counts`).
pub const EMA_DECAY: f64 = 0.9;

/// The rebalancer of one replica (see the [module](self) documentation).
#[derive(Debug)]
pub struct ExpertRebalancer {
    every: usize,
    workers: usize,
    experts: usize,
    slots: usize,
    /// The MoE blocks, ascending: row `i` of every matrix is block `layers[i]`.
    layers: Vec<usize>,
    ema: Option<Vec<Vec<f64>>>,
    phy2log: Vec<Vec<usize>>,
    rebalances: usize,
    moved: usize,
    moved_from_scratch: usize,
    bytes_moved: u64,
}

/// A re-placement planned by [`ExpertRebalancer::observe`].
#[derive(Clone, Debug, PartialEq)]
pub struct Replan {
    /// Per MoE block: its new placement.
    pub placements: Vec<(usize, ExpertPlacement)>,
    /// The transfers, round by round (each worker sends and receives at most one per round).
    pub rounds: Vec<Vec<Transfer>>,
    /// Expert replicas the planner moved (its move plan's transfers).
    pub moved: usize,
}

fn eplb_error(e: dualpipe_eplb::EplbError) -> TrainError {
    TrainError::Execution(format!("EPLB in training: {e}"))
}

impl ExpertRebalancer {
    /// The rebalancer of `layers` (every MoE block of the model this replica holds a copy
    /// of), starting from the slots of `initial` over `workers` workers.
    pub fn new(
        settings: &MoeSettings,
        workers: usize,
        layers: &[usize],
        initial: &ExpertPlacement,
    ) -> Self {
        let experts = settings.experts;
        let slots = experts + settings.redundant_experts;
        let row: Vec<usize> = if settings.redundant_experts == 0 {
            // One slot per expert, in the contiguous runs of the initial placement.
            let mut row: Vec<usize> = (0..experts).collect();
            row.sort_by_key(|&j| initial.replicas[j][0]);
            row
        } else {
            (0..slots).map(|p| p % experts).collect()
        };
        ExpertRebalancer {
            every: settings.eplb_every,
            workers,
            experts,
            slots,
            layers: layers.to_vec(),
            ema: None,
            phy2log: vec![row; layers.len()],
            rebalances: 0,
            moved: 0,
            moved_from_scratch: 0,
            bytes_moved: 0,
        }
    }

    /// Folds step `step`'s group-wide `totals` (per block) into the average; when a
    /// rebalance is due after this step, plans and returns the re-placement (version
    /// `step + 1`) for [`crate::parallel::experts::shards::move_experts`] to carry out.
    pub fn observe(
        &mut self,
        step: usize,
        totals: &[(usize, Vec<u64>)],
    ) -> Result<Option<Replan>, TrainError> {
        let rows: Vec<Vec<f64>> = self
            .layers
            .iter()
            .map(|l| {
                totals
                    .iter()
                    .find(|(b, _)| b == l)
                    .map(|(_, c)| c.iter().map(|&v| v as f64).collect())
                    .unwrap_or_else(|| vec![0.0; self.experts])
            })
            .collect();
        let ema = match self.ema.take() {
            None => rows,
            Some(old) => old
                .iter()
                .zip(&rows)
                .map(|(o, n)| {
                    o.iter()
                        .zip(n)
                        .map(|(a, b)| EMA_DECAY * a + (1.0 - EMA_DECAY) * b)
                        .collect()
                })
                .collect(),
        };
        self.ema = Some(ema);
        if self.every == 0 || !(step + 1).is_multiple_of(self.every) || self.layers.is_empty() {
            return Ok(None);
        }
        let ema = self.ema.clone().unwrap_or_default();
        // A load of zero everywhere would plan nothing useful: one token each keeps the plan
        // defined (and changes no expert's order).
        let loads = LoadMatrix::from_rows(
            ema.iter()
                .map(|r| r.iter().map(|v| v + 1.0).collect())
                .collect(),
        )
        .map_err(eplb_error)?;
        let layout = Layout::new(self.experts, self.slots, 1, 1, self.workers);
        let previous = PreviousPlacement::from_rows(self.phy2log.clone());
        let planner = Planner::default();
        let outcome = dualpipe_eplb::plan(&loads, &layout, &planner, Some(&previous), 0)
            .map_err(eplb_error)?;
        let new = outcome
            .plan
            .phy2log_rows()
            .ok_or_else(|| TrainError::Execution("EPLB in training: no placement".into()))?;
        let moved = outcome.moves.as_ref().map_or(0, |m| m.moves.len());
        let scratch =
            dualpipe_eplb::plan(&loads, &layout, &planner, None, 0).map_err(eplb_error)?;
        if let Some(rows) = scratch.plan.phy2log_rows() {
            self.moved_from_scratch += move_plan(&self.phy2log, &rows, self.workers, 1, 0)
                .moves
                .len();
        }
        let version = step as u64 + 1;
        let placements = self
            .layers
            .iter()
            .zip(&new)
            .map(|(&l, row)| (l, placement_of_slots(row, self.workers, version)))
            .collect();
        // The plan's transfers by round, one per (block, expert, receiver): a worker that
        // gains two slots of one expert receives it once.
        let mut rounds = Vec::new();
        let mut seen = std::collections::HashSet::new();
        if let Some(plan) = &outcome.moves {
            for round in &plan.rounds {
                let transfers: Vec<Transfer> = round
                    .moves
                    .iter()
                    .filter_map(|&k| plan.moves.get(k))
                    .filter_map(|m| {
                        let t = Transfer {
                            layer: *self.layers.get(m.layer)?,
                            expert: m.expert,
                            from: m.src_gpu,
                            to: m.dst_gpu,
                        };
                        seen.insert((t.layer, t.expert, t.to)).then_some(t)
                    })
                    .collect();
                if !transfers.is_empty() {
                    rounds.push(transfers);
                }
            }
        }
        self.phy2log = new;
        self.rebalances += 1;
        self.moved += moved;
        Ok(Some(Replan {
            placements,
            rounds,
            moved,
        }))
    }

    /// Counts `bytes` as moved by the last re-placement's transfers.
    pub fn add_bytes_moved(&mut self, bytes: u64) {
        self.bytes_moved += bytes;
    }

    /// Bytes of expert weights and optimizer state this replica sent in the re-placements.
    pub fn bytes_moved(&self) -> u64 {
        self.bytes_moved
    }

    /// Rebalances so far, expert replicas moved in them, and the replicas the same plans
    /// re-made from scratch (without the previous placement) would have moved.
    pub fn totals(&self) -> (usize, usize, u64) {
        (self.rebalances, self.moved, self.moved_from_scratch as u64)
    }

    /// The slots in force: per MoE block, the logical expert of each physical slot.
    pub fn phy2log(&self) -> &[Vec<usize>] {
        &self.phy2log
    }

    /// The MoE blocks, ascending (row `i` of [`ExpertRebalancer::phy2log`] and of the average is
    /// block `layers()[i]`).
    pub fn layers(&self) -> &[usize] {
        &self.layers
    }

    /// The moving average of the counts (`None` before the first step).
    pub fn ema(&self) -> Option<&[Vec<f64>]> {
        self.ema.as_deref()
    }

    /// Continues from a saved state (a checkpoint's): the slots in force and the average, per
    /// block in the order of [`ExpertRebalancer::layers`]; refused when their sizes differ.
    pub fn resume(
        &mut self,
        phy2log: Vec<Vec<usize>>,
        ema: Option<Vec<Vec<f64>>>,
    ) -> Result<(), TrainError> {
        let fits = phy2log.len() == self.layers.len()
            && phy2log
                .iter()
                .all(|r| r.len() == self.slots && r.iter().all(|&j| j < self.experts))
            && ema.as_ref().is_none_or(|e| {
                e.len() == self.layers.len() && e.iter().all(|r| r.len() == self.experts)
            });
        if !fits {
            return Err(TrainError::Execution(
                "EPLB in training: a saved placement of another shape".into(),
            ));
        }
        self.phy2log = phy2log;
        self.ema = ema;
        Ok(())
    }
}
