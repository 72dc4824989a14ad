//! The mixture-of-experts flags of `dualpipe train` ([`MoeArgs`]) and the [`MoeSettings`]
//! they ask for.

use std::path::Path;

use dualpipe_nn::gpt::{GptConfig, WeightsError};

use super::count;
use dualpipe_train::{MoeSettings, TrainError};

/// The defaults.
const M: MoeSettings = MoeSettings::DEFAULT;

/// The GPT's mixture of experts (off unless --experts is given).
#[derive(clap::Args, Debug, Default)]
pub struct MoeArgs {
    /// Make the GPT's feed-forward a mixture of E routed experts (dropless top-k routing;
    /// see docs/models.md) [default: dense, or --init-from's].
    #[arg(long, value_name = "E", value_parser = count, allow_negative_numbers = true)]
    pub experts: Option<usize>,
    /// Experts each token is routed to [default: 2].
    #[arg(long, value_name = "K", value_parser = count, allow_negative_numbers = true)]
    pub top_k: Option<usize>,
    /// Hidden width of each expert [default: 4 x d-model / top-k].
    #[arg(long, value_name = "H", value_parser = count, allow_negative_numbers = true)]
    pub expert_hidden: Option<usize>,
    /// Shared experts every token also passes through [default: 0].
    #[arg(long, value_name = "S", value_parser = count, allow_negative_numbers = true)]
    pub shared_experts: Option<usize>,
    /// Every N-th block is an MoE block (blocks N-1, 2N-1, ...) [default: 1, every block].
    #[arg(long, value_name = "N", value_parser = count, allow_negative_numbers = true)]
    pub moe_every: Option<usize>,
    /// Coefficient of the standard auxiliary balance loss [default: 0, off].
    #[arg(long, value_name = "COEF", allow_negative_numbers = true)]
    pub aux_loss: Option<f64>,
    /// γ of the auxiliary-loss-free balancing: after each step every expert's selection
    /// bias moves by ±γ towards the mean load [default: 0.001; 0 turns it off].
    #[arg(long, value_name = "GAMMA", allow_negative_numbers = true)]
    pub bias_update_rate: Option<f64>,
    /// Spread the routed experts over the --data-parallel group: each worker computes E/D
    /// experts for every worker's tokens, reached by all-to-all dispatch and combine
    /// (docs/moe.md).
    #[arg(long)]
    pub expert_parallel: bool,
    /// Extra expert slots per MoE block for EPLB's replicas (with --expert-parallel;
    /// experts + R a multiple of --data-parallel) [default: 0].
    #[arg(long, value_name = "R", value_parser = count, allow_negative_numbers = true)]
    pub redundant_experts: Option<usize>,
    /// Re-place the experts by EPLB from the router's counts every N steps (with
    /// --expert-parallel) [default: 0, never].
    #[arg(long, value_name = "N", value_parser = count, allow_negative_numbers = true)]
    pub eplb_every: Option<usize>,
    /// Emulate a slower link for the expert all-to-alls: every message becomes visible to
    /// its receiver SECONDS later (plus its bytes over --link-bandwidth) (with
    /// --expert-parallel) [default: 0, no emulation].
    #[arg(long, value_name = "SECONDS", allow_negative_numbers = true)]
    pub link_latency: Option<f64>,
    /// Bytes per second of the emulated expert all-to-all link (with --expert-parallel)
    /// [default: unlimited].
    #[arg(long, value_name = "BYTES_PER_S", allow_negative_numbers = true)]
    pub link_bandwidth: Option<f64>,
    /// Run DualPipe's FB pair as a forward, then a backward, instead of overlapping the two
    /// chunks (one computes while the other waits on an expert all-to-all) (with
    /// --expert-parallel).
    #[arg(long)]
    pub no_moe_overlap: bool,
}

impl MoeArgs {
    /// The MoE flags given.
    pub fn given(&self) -> Vec<&'static str> {
        [
            ("--experts", self.experts.is_some()),
            ("--top-k", self.top_k.is_some()),
            ("--expert-hidden", self.expert_hidden.is_some()),
            ("--shared-experts", self.shared_experts.is_some()),
            ("--moe-every", self.moe_every.is_some()),
            ("--aux-loss", self.aux_loss.is_some()),
            ("--bias-update-rate", self.bias_update_rate.is_some()),
            ("--expert-parallel", self.expert_parallel),
            ("--redundant-experts", self.redundant_experts.is_some()),
            ("--eplb-every", self.eplb_every.is_some()),
            ("--link-latency", self.link_latency.is_some()),
            ("--link-bandwidth", self.link_bandwidth.is_some()),
            ("--no-moe-overlap", self.no_moe_overlap),
        ]
        .into_iter()
        .filter(|(_, g)| *g)
        .map(|(f, _)| f)
        .collect()
    }

    /// The settings the flags ask for (`None`: dense); a tuning flag without --experts is an
    /// error.
    pub fn settings(&self) -> Result<Option<MoeSettings>, TrainError> {
        let Some(experts) = self.experts else {
            return match self.given().first() {
                Some(flag) => Err(TrainError::Config(format!(
                    "{flag} tunes the mixture of experts; add --experts E (such as --experts 4) \
                     or drop it"
                ))),
                None => Ok(None),
            };
        };
        Ok(Some(self.with_experts(experts)))
    }

    /// The settings of `experts` routed experts with every other flag as given (its default
    /// where absent).
    fn with_experts(&self, experts: usize) -> MoeSettings {
        MoeSettings {
            experts,
            top_k: self.top_k.unwrap_or(M.top_k),
            expert_hidden: self.expert_hidden,
            shared_experts: self.shared_experts.unwrap_or(M.shared_experts),
            every: self.moe_every.unwrap_or(M.every),
            aux_loss: self.aux_loss.unwrap_or(M.aux_loss),
            bias_update_rate: self.bias_update_rate.unwrap_or(M.bias_update_rate),
            expert_parallel: self.expert_parallel,
            redundant_experts: self.redundant_experts.unwrap_or(M.redundant_experts),
            eplb_every: self.eplb_every.unwrap_or(M.eplb_every),
            link_latency: self.link_latency.unwrap_or(M.link_latency),
            link_bandwidth: self.link_bandwidth,
            overlap: !self.no_moe_overlap,
        }
    }

    /// With --init-from: the file's experts, unless a flag given disagrees (an error naming
    /// both); the balancing flags apply as given.
    pub fn adopt(&self, file: &GptConfig, path: &Path) -> Result<Option<MoeSettings>, TrainError> {
        let check = |flag: &str, given: Option<usize>| check_file_flag(file, path, flag, given);
        check("experts", self.experts)?;
        let Some(m) = file.moe else {
            return self.settings();
        };
        check("top-k", self.top_k)?;
        check("expert-hidden", self.expert_hidden)?;
        check("shared-experts", self.shared_experts)?;
        check("moe-every", self.moe_every)?;
        // The architecture is the file's; the balancing and parallelism flags apply as given.
        Ok(Some(MoeSettings {
            top_k: m.top_k,
            expert_hidden: Some(m.expert_hidden),
            shared_experts: m.shared_experts,
            every: m.every,
            ..self.with_experts(m.experts)
        }))
    }
}

/// Checks `--{flag}` (given or not) against the architecture of the `--init-from` file at
/// `path`: an error in the flag's words when they disagree.
pub(super) fn check_file_flag(
    file: &GptConfig,
    path: &Path,
    flag: &str,
    given: Option<usize>,
) -> Result<(), TrainError> {
    let problem = match file.check_field(&flag.replace('-', "_"), given) {
        Ok(()) => return Ok(()),
        Err(WeightsError::Dense { given, .. }) => format!(
            "--{flag} is {given} but the weights file is a dense model (it has no experts); drop the flag"
        ),
        Err(WeightsError::Mismatch { field, file, given }) => format!(
            "--{flag} is {given} but the weights file has {field} = {file}; drop the flag or make it {file}"
        ),
        Err(e) => e.to_string(),
    };
    Err(TrainError::Config(format!(
        "--init-from {}: {problem}",
        path.display()
    )))
}
