//! The router's arithmetic on the host, in f64: softmax, top-k selection with the
//! selection bias and deterministic tie-breaking, renormalised gates, and the backward
//! through gates and softmax.

/// Where one micro-batch's tokens go: per token its `k` experts and gates, and per expert
/// the tokens it serves (ascending) with the slot (`token · k + r`) of each.
#[derive(Clone, Debug)]
pub struct Routing {
    /// Tokens routed.
    pub tokens: usize,
    /// Experts.
    pub experts: usize,
    /// Experts per token.
    pub top_k: usize,
    /// Softmax of the router logits, `tokens · experts`, row-major.
    pub probs: Vec<f64>,
    /// The chosen experts, `tokens · top_k` (per token in descending biased score).
    pub chosen: Vec<usize>,
    /// The gates of the chosen experts (each token's sum to one), `tokens · top_k`.
    pub gates: Vec<f64>,
    /// Per expert: the tokens it serves, ascending.
    pub rows: Vec<Vec<u32>>,
    /// Per expert: the slot of each of its rows in `chosen` / `gates`.
    pub slots: Vec<Vec<usize>>,
}

/// Row-wise softmax of `logits` (`rows · cols`), computed stably in f64.
pub fn softmax_rows(logits: &[f64], cols: usize) -> Vec<f64> {
    let mut out = Vec::with_capacity(logits.len());
    for row in logits.chunks(cols) {
        let max = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let start = out.len();
        let mut sum = 0.0;
        for &v in row {
            let e = (v - max).exp();
            sum += e;
            out.push(e);
        }
        for v in &mut out[start..] {
            *v /= sum;
        }
    }
    out
}

/// The `k` highest `scores` by index, highest first; equal scores: the lower index wins.
/// (A NaN score ranks below every number.)
pub fn top_k(scores: &[f64], k: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..scores.len()).collect();
    order.sort_by(|&a, &b| {
        let (sa, sb) = (scores[a], scores[b]);
        sb.partial_cmp(&sa)
            .unwrap_or_else(|| sa.is_nan().cmp(&sb.is_nan()))
            .then(a.cmp(&b))
    });
    order.truncate(k);
    order
}

/// Routes `tokens` rows of router `logits` (`tokens · experts`): softmax probabilities,
/// selection by top-k of `probability + bias` (the bias steers selection only), gates the
/// chosen probabilities renormalised to sum to one.
pub fn route(logits: &[f64], experts: usize, top_k_count: usize, bias: &[f64]) -> Routing {
    let tokens = logits.len() / experts;
    let probs = softmax_rows(logits, experts);
    let mut chosen = Vec::with_capacity(tokens * top_k_count);
    let mut gates = Vec::with_capacity(tokens * top_k_count);
    let mut rows = vec![Vec::new(); experts];
    let mut slots = vec![Vec::new(); experts];
    let mut scores = vec![0.0; experts];
    for t in 0..tokens {
        let p = &probs[t * experts..(t + 1) * experts];
        for (s, (pj, bj)) in scores.iter_mut().zip(p.iter().zip(bias)) {
            *s = pj + bj;
        }
        let pick = top_k(&scores, top_k_count);
        let total: f64 = pick.iter().map(|&j| p[j]).sum();
        for (r, &j) in pick.iter().enumerate() {
            chosen.push(j);
            gates.push(p[j] / total);
            rows[j].push(t as u32);
            slots[j].push(t * top_k_count + r);
        }
    }
    Routing {
        tokens,
        experts,
        top_k: top_k_count,
        probs,
        chosen,
        gates,
        rows,
        slots,
    }
}

impl Routing {
    /// Tokens per expert.
    pub fn counts(&self) -> Vec<u64> {
        self.rows.iter().map(|r| r.len() as u64).collect()
    }

    /// The standard auxiliary balance loss `coef · E · Σⱼ fⱼ · P̄ⱼ`, with `fⱼ` the share of
    /// the token-expert assignments that went to `j` (a constant) and `P̄ⱼ` the mean
    /// probability of `j`; 1·coef when perfectly balanced.
    pub fn aux_loss(&self, coef: f64) -> f64 {
        let (n, e) = (self.tokens as f64, self.experts);
        let assigned = n * self.top_k as f64;
        (0..e)
            .map(|j| {
                let f = self.rows[j].len() as f64 / assigned;
                let mean_p = (0..self.tokens).map(|t| self.probs[t * e + j]).sum::<f64>() / n;
                f * mean_p
            })
            .sum::<f64>()
            * coef
            * e as f64
    }

    /// The gradient of the router logits (`tokens · experts`) from the gradient of each
    /// slot's gate (`gate_grads`, `tokens · top_k`) plus `aux` times the auxiliary loss's
    /// (`aux` = its coefficient times the loss's scale; 0 for none). Non-chosen experts get
    /// gradient only through the softmax's normalisation (selection is piecewise constant).
    pub fn logit_grads(&self, gate_grads: &[f64], aux: f64) -> Vec<f64> {
        let (e, k) = (self.experts, self.top_k);
        let n = self.tokens as f64;
        let assigned = n * k as f64;
        let aux_dp: Vec<f64> = (0..e)
            .map(|j| aux * e as f64 * (self.rows[j].len() as f64 / assigned) / n)
            .collect();
        let mut out = vec![0.0; self.tokens * e];
        let mut dp = vec![0.0; e];
        for t in 0..self.tokens {
            let p = &self.probs[t * e..(t + 1) * e];
            dp.copy_from_slice(&aux_dp);
            let slots = t * k..(t + 1) * k;
            let chosen = &self.chosen[slots.clone()];
            let g = &self.gates[slots.clone()];
            let dg = &gate_grads[slots];
            let total: f64 = chosen.iter().map(|&j| p[j]).sum();
            let mean: f64 = g.iter().zip(dg).map(|(a, b)| a * b).sum();
            for (&j, &d) in chosen.iter().zip(dg) {
                dp[j] += (d - mean) / total;
            }
            let dot: f64 = p.iter().zip(&dp).map(|(a, b)| a * b).sum();
            for ((o, &pj), &dpj) in out[t * e..(t + 1) * e].iter_mut().zip(p).zip(&dp) {
                *o = pj * (dpj - dot);
            }
        }
        out
    }
}

/// DeepSeek-V3's auxiliary-loss-free update of the selection bias: each expert's bias moves
/// by `rate` towards balance, `bⱼ += rate · sign(mean load − loadⱼ)` (no move at the mean).
pub fn update_bias(bias: &mut [f64], loads: &[u64], rate: f64) {
    if loads.is_empty() {
        return;
    }
    let mean = loads.iter().sum::<u64>() as f64 / loads.len() as f64;
    for (b, &l) in bias.iter_mut().zip(loads) {
        let diff = mean - l as f64;
        if diff > 0.0 {
            *b += rate;
        } else if diff < 0.0 {
            *b -= rate;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ties_go_to_the_lower_index() {
        assert_eq!(top_k(&[0.5, 0.5, 0.5, 0.1], 2), vec![0, 1]);
        assert_eq!(top_k(&[0.1, 0.3, 0.3, 0.2], 2), vec![1, 2]);
        assert_eq!(top_k(&[f64::NAN, 0.0, 0.2], 2), vec![2, 1]);
    }

    #[test]
    fn gates_sum_to_one_and_the_bias_steers_selection_only() {
        let logits = [2.0, 1.0, 0.0, -1.0, 0.0, 0.0, 3.0, 0.0];
        let r = route(&logits, 4, 2, &[0.0; 4]);
        assert_eq!(r.chosen, vec![0, 1, 2, 0]);
        for t in 0..2 {
            assert!((r.gates[2 * t] + r.gates[2 * t + 1] - 1.0).abs() < 1e-15);
        }
        let biased = route(&logits, 4, 2, &[0.0, 0.0, 0.0, 1.0]);
        assert_eq!(biased.chosen, vec![3, 0, 3, 2]);
        assert_eq!(
            biased.probs, r.probs,
            "the bias does not change the probabilities"
        );
        let p = &r.probs[..4];
        assert!((biased.gates[0] - p[3] / (p[3] + p[0])).abs() < 1e-15);
        assert_eq!(r.counts(), vec![2, 1, 1, 0]);
    }

    #[test]
    fn the_bias_moves_towards_balance() {
        let mut b = vec![0.0; 4];
        update_bias(&mut b, &[10, 2, 4, 4], 0.5);
        assert_eq!(b, vec![-0.5, 0.5, 0.5, 0.5]);
        update_bias(&mut b, &[5, 5, 5, 5], 0.5);
        assert_eq!(b, vec![-0.5, 0.5, 0.5, 0.5]);
    }
}
