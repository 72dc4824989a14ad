//! [`RunSummary::table`]: the human summary.

use super::RunSummary;

fn ms(seconds: Option<f64>) -> String {
    seconds.map_or("-".into(), |s| format!("{:.3}", s * 1e3))
}

impl RunSummary {
    /// The human summary: a few loss lines (unless `quiet`), then the figures.
    pub fn table(&self, quiet: bool) -> String {
        let mut out = self.heading();
        if !quiet {
            self.loss_lines(&mut out);
        }
        out.push('\n');
        for (name, value) in self.rows() {
            out.push_str(&format!("  {name:<24}{value}\n"));
        }
        self.notes(&mut out);
        out
    }

    /// The first line: the model, its data, the schedule and the optimizer.
    fn heading(&self) -> String {
        let s = self;
        let blocks = match &s.partition {
            Some(p) => {
                let split: Vec<String> = p.iter().map(usize::to_string).collect();
                format!(
                    "{} blocks, split {}",
                    p.iter().sum::<usize>(),
                    split.join(",")
                )
            }
            None => format!(
                "{} blocks, {} per stage",
                s.layers_per_stage * s.model_stages,
                s.layers_per_stage
            ),
        };
        let blocks = match &s.recompute {
            Some(r) => format!("{blocks}, recompute {r}"),
            None => blocks,
        };
        let dtype = if s.half_projections {
            format!("{} (attention projections too)", s.dtype)
        } else {
            s.dtype.clone()
        };
        let lr = match &s.lr_schedule {
            Some(words) => format!("{} ({words})", s.lr),
            None => s.lr.to_string(),
        };
        match (s.d_model, s.heads, s.seq_len, &s.data) {
            (Some(d), Some(heads), Some(seq), Some(data)) => format!(
                "dualpipe train: gpt (d_model {d}, {heads} heads, {blocks}, seq {seq}) on \
                 {data}; {} on {} ranks ({} model stages), {} micro-batches x {} sequences, {} \
                 lr {}, {}, seed {}\n",
                s.schedule,
                s.ranks,
                s.model_stages,
                s.micro_batches,
                s.micro_batch_size,
                s.optimizer,
                lr,
                dtype,
                s.seed
            ),
            _ => format!(
                "dualpipe train: {} on {} ranks ({} model stages), {} micro-batches x {} rows, \
                 hidden {}, {} blocks/stage, {} lr {}, {}, seed {}\n",
                s.schedule,
                s.ranks,
                s.model_stages,
                s.micro_batches,
                s.micro_batch_size,
                s.hidden,
                s.layers_per_stage,
                s.optimizer,
                lr,
                dtype,
                s.seed
            ),
        }
    }

    /// A few loss lines, and the validations.
    fn loss_lines(&self, out: &mut String) {
        let s = self;
        if !s.losses.is_empty() {
            out.push_str("\n  step  loss\n");
            let n = s.losses.len();
            let every = n.div_ceil(10).max(1);
            for (i, loss) in s.losses.iter().enumerate() {
                if i % every == 0 || i + 1 == n {
                    out.push_str(&format!("  {:>4}  {loss:.6}\n", s.first_step + i));
                }
            }
        }
        if !s.evaluations.is_empty() {
            let score = match (s.best_loss, s.accuracy) {
                (Some(_), _) => "gap to best",
                (None, Some(_)) => "accuracy",
                (None, None) => "",
            };
            out.push_str(&format!("\n  step  validation loss  bits/byte  {score}\n"));
            for e in &s.evaluations {
                let score = match (e.best_loss, e.accuracy) {
                    (Some(best), _) => format!("{:.4}", e.loss - best),
                    (None, Some(a)) => format!("{:.1}%", 100.0 * a),
                    (None, None) => String::new(),
                };
                let line = if e.held_out {
                    format!(
                        "  {:>4}  {:<15.6}  {:<9.4}  {score}",
                        e.step, e.loss, e.bits_per_byte
                    )
                } else {
                    format!("  {:>4}  {:<15}  {:<9}  {score}", e.step, "none", "-")
                };
                out.push_str(line.trim_end());
                out.push('\n');
            }
        }
    }

    /// The figures, one row each: the name and the value.
    fn rows(&self) -> Vec<(&'static str, String)> {
        let s = self;
        let pct = |x: f64| format!("{:.1}%", 100.0 * x);
        let op = &s.op_seconds;
        let throughput = match s.tokens_per_second {
            Some(tokens) => format!(
                "{tokens:.0} tokens/s ({:.1} sequences/s)",
                s.samples_per_second
            ),
            None => format!("{:.0} samples/s", s.samples_per_second),
        };
        let mut rows = vec![("final loss", format!("{:.6}", s.final_loss))];
        if let (Some(scale), Some(skipped)) = (s.loss_scale, s.skipped_steps) {
            rows.push((
                "loss scale",
                format!("{scale} (last step), {skipped} steps skipped on f16 overflow"),
            ));
        }
        rows.extend([
            ("throughput", throughput),
            (
                "step time (median)",
                format!("{:.2} ms", 1e3 * s.step_seconds_median),
            ),
            (
                "pipeline time (median)",
                format!(
                    "{:.2} ms measured, {} simulated from measured op times",
                    1e3 * s.pipeline_seconds_median,
                    s.simulated_pipeline_seconds
                        .map_or("-".into(), |x| format!("{:.2} ms", 1e3 * x))
                ),
            ),
            (
                "bubble ratio",
                format!(
                    "{} measured (message waits), {} simulated",
                    pct(s.bubble_ratio),
                    s.simulated_bubble_ratio.map_or("-".into(), pct)
                ),
            ),
            (
                "core contention",
                format!(
                    "{} of rank time waiting for a core ({} rank threads on {} cores)",
                    pct(s.core_wait_ratio),
                    s.rank_threads,
                    s.cores
                ),
            ),
            (
                "comm wait",
                format!("{:.2} ms per rank per step", 1e3 * s.comm_wait_seconds),
            ),
            (
                "op times (ms)",
                format!(
                    "F {} · B {} · I {} · W {} · FB {}",
                    ms(op.f),
                    ms(op.b),
                    ms(op.i),
                    ms(op.w),
                    ms(op.fb)
                ),
            ),
            (
                "total",
                format!("{} steps in {:.2} s", s.steps, s.total_seconds),
            ),
        ]);
        self.parallelism_rows(&mut rows);
        if let Some(e) = s.evaluations.last() {
            let accuracy = match (e.best_loss, e.accuracy) {
                (Some(best), _) => format!(", best possible {best:.6} (gap {:.4})", e.loss - best),
                (None, Some(a)) => format!(", accuracy {:.1}%", 100.0 * a),
                (None, None) => String::new(),
            };
            let loss = if e.held_out {
                format!("loss {:.6} ({:.4} bits/byte)", e.loss, e.bits_per_byte)
            } else {
                "loss none (nothing held out: validation fraction 0)".to_string()
            };
            rows.insert(1, ("validation", format!("{loss}{accuracy}")));
        }
        rows
    }

    /// The rows of the parallelisms: data parallelism, the experts' load, EPLB.
    fn parallelism_rows(&self, rows: &mut Vec<(&'static str, String)>) {
        let s = self;
        let pct = |x: f64| format!("{:.1}%", 100.0 * x);
        if s.data_parallel > 1 {
            let saved = if s.grad_bytes_uncompressed > 0 {
                format!(
                    " ({:.1}% of uncompressed {})",
                    100.0 * s.grad_bytes_sent as f64 / s.grad_bytes_uncompressed as f64,
                    s.grad_bytes_uncompressed
                )
            } else {
                String::new()
            };
            rows.push((
                "data parallel",
                format!(
                    "{} replicas, gradients {}{}: {} bytes sent{saved}",
                    s.data_parallel,
                    s.gradient_compression,
                    match s.grad_exchange.as_deref() {
                        Some(m) if m != "point-to-point" => format!(" over {m}"),
                        _ => String::new(),
                    },
                    s.grad_bytes_sent
                ),
            ));
            rows.push((
                "communication overhead",
                format!(
                    "{} of the run in gradient exchange",
                    pct(s.communication_overhead)
                ),
            ));
        }
        if let (Some(first), Some(last)) = (
            s.expert_load_imbalance.first(),
            s.expert_load_imbalance.last(),
        ) {
            rows.push((
                "expert load",
                format!(
                    "max/mean tokens per expert {:.3} in the first step, {:.3} in the last \
                     (worst block)",
                    first.max_over_mean, last.max_over_mean
                ),
            ));
            if let (Some(a), Some(b)) = (first.worker_max_over_mean, last.worker_max_over_mean) {
                rows.push((
                    "expert parallelism",
                    format!(
                        "max/mean rows per worker {a:.3} in the first step, {b:.3} in the last"
                    ),
                ));
            }
        }
        if let Some(n) = s.eplb_rebalances {
            rows.push((
                "eplb",
                format!(
                    "{n} re-placements, {} expert replicas moved ({} had each plan been made \
                     from scratch)",
                    s.experts_moved.unwrap_or(0),
                    s.experts_moved_from_scratch.unwrap_or(0)
                ),
            ));
        }
    }

    /// The note on shared cores, and the samples.
    fn notes(&self, out: &mut String) {
        let s = self;
        let pct = |x: f64| format!("{:.1}%", 100.0 * x);
        if s.rank_threads > s.cores {
            out.push_str(&format!(
                "\n  note: {} busy rank threads share {} cores, so ranks also wait for a core;\n  \
                 the bubble counts only waits for a message ({} of rank time was idle\n  \
                 between compute ops on the timeline)\n",
                s.rank_threads,
                s.cores,
                pct(s.timeline_idle_ratio)
            ));
        }
        if !s.samples.is_empty() {
            out.push_str("\n  samples by the final model\n");
            for sample in &s.samples {
                let how = match sample.temperature {
                    0.0 => "greedy".to_string(),
                    t => format!("T={t}"),
                };
                out.push_str(&format!(
                    "    {how:<7}{:?} -> {:?}\n",
                    sample.prompt, sample.completion
                ));
            }
        }
    }
}
