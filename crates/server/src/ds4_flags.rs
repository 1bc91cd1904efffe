//! The C engine's `ds4-server` flags that are not ours by another name (spec §3 and §5.1), so a ds4
//! user's command line parses unchanged. Flags of features this build does not have are accepted by the
//! parser and then refused with exit 2 and one line that says what to use instead (`not_built`).
use clap::Args;
use std::path::PathBuf;

#[derive(Args, Debug, Clone, Default)]
pub struct Ds4Flags {
    /// Change to DIR before anything else (relative paths such as -m resolve from there).
    #[arg(long = "chdir", value_name = "DIR")]
    pub chdir: Option<PathBuf>,
    /// Backend shorthands as in ds4: --cpu is --backend cpu, --cuda is --backend cuda.
    #[arg(long = "cpu", conflicts_with_all = ["cuda", "metal", "vulkan", "rocm"])]
    pub cpu: bool,
    #[arg(long = "cuda", conflicts_with_all = ["metal", "vulkan", "rocm"])]
    pub cuda: bool,
    /// --backend metal (Apple GPUs through wgpu; built with --features wgpu).
    #[arg(long = "metal", conflicts_with_all = ["vulkan", "rocm"])]
    pub metal: bool,
    /// --backend vulkan (GPUs through wgpu; built with --features wgpu).
    #[arg(long = "vulkan", conflicts_with = "rocm")]
    pub vulkan: bool,
    #[arg(long = "rocm", hide = true)]
    pub rocm: bool,
    /// Exact kernels (f32 activations) instead of the fast int8-activation mat-vecs.
    #[arg(long = "quality")]
    pub quality: bool,
    /// Diagnostic: the FP8/FP4 simulation of the official model (KV rows, indexer) on or off. `off`
    /// departs from the shipped numerics.
    #[arg(long = "qat", value_name = "on|off", default_value = "on", value_parser = ["on", "off"])]
    pub qat: String,

    /// MTP drafter GGUF: speculative decoding on the CPU backend (greedy output unchanged, sampling keeps
    /// its distribution; requests asking for logprobs decode without drafts).
    #[arg(long = "mtp", value_name = "FILE")]
    pub mtp: Option<PathBuf>,
    /// Tokens drafted per step, 1..4 [default: 1].
    #[arg(long = "mtp-draft", value_name = "N")]
    pub mtp_draft: Option<usize>,
    /// Draft only while the drafter's top logit leads its second by at least F [default: 3.0].
    #[arg(long = "mtp-margin", value_name = "F", allow_negative_numbers = true)]
    pub mtp_margin: Option<f32>,

    // Features not built yet (refused by `not_built`).
    #[arg(long = "mtp-model", value_name = "FILE", hide = true)]
    pub mtp_model: Option<String>,
    #[arg(long = "mtp-exact-sampling", hide = true)]
    pub mtp_exact_sampling: bool,
    #[arg(long = "mtp-timing", hide = true)]
    pub mtp_timing: bool,
    #[arg(long = "dspark", hide = true)]
    pub dspark: bool,
    #[arg(long = "dspark-confidence", value_name = "F", hide = true)]
    pub dspark_confidence: Option<String>,
    #[arg(long = "dspark-strict", hide = true)]
    pub dspark_strict: bool,
    /// Directional steering (CPU, Vulkan, Metal): n_layer x n_embd f32 directions (Flash: 43 x 4096); each
    /// layer's FFN/attention output loses s·v·(v·y). Repeatable: up to 8 files, applied in order.
    #[arg(id = "dir_steering_file", long = "dir-steering-file", value_name = "FILE", action = clap::ArgAction::Append)]
    pub dir_steering_file: Vec<PathBuf>,
    /// Scale after the FFN for the file before it [default: 1]; negative amplifies the direction.
    #[arg(id = "dir_steering_ffn", long = "dir-steering-ffn", value_name = "F", allow_negative_numbers = true, action = clap::ArgAction::Append)]
    pub dir_steering_ffn: Vec<f32>,
    /// Scale after attention for the file before it [default: 0].
    #[arg(id = "dir_steering_attn", long = "dir-steering-attn", value_name = "F", allow_negative_numbers = true, action = clap::ArgAction::Append)]
    pub dir_steering_attn: Vec<f32>,
    /// When steering applies: final-answer (decoding after the reasoning ends), decoding (every
    /// generated token), always (the prompt too), off.
    #[arg(long = "dir-steering-policy", value_name = "MODE", default_value = "final-answer", value_parser = ["final-answer", "decoding", "always", "off"])]
    pub dir_steering_policy: String,
    /// The steering slots, bound by position (`bind_steering`).
    #[arg(skip)]
    pub steering: Vec<ds4_model::steering::SteerSpec>,
    /// Duty-cycle target in percent (1..100): after each prefill chunk or decoded token, the worker
    /// sleeps so the device is busy about N % of the time; same output, lower speed.
    #[arg(long = "power", value_name = "N", default_value_t = 100)]
    pub power: u32,
    #[arg(long = "ssd-streaming", hide = true)]
    pub ssd_streaming: bool,
    #[arg(long = "ssd-streaming-cold", hide = true)]
    pub ssd_streaming_cold: bool,
    #[arg(long = "ssd-streaming-cache-experts", value_name = "N", hide = true)]
    pub ssd_streaming_cache_experts: Option<String>,
    #[arg(long = "ssd-streaming-preload-experts", value_name = "N", hide = true)]
    pub ssd_streaming_preload_experts: Option<String>,
    #[arg(long = "ssd-streaming-full-layers", value_name = "N", hide = true)]
    pub ssd_streaming_full_layers: Option<String>,
    #[arg(long = "simulate-used-memory", value_name = "NGB", hide = true)]
    pub simulate_used_memory: Option<String>,
    #[arg(long = "gpu-vram", value_name = "N", hide = true)]
    pub gpu_vram: Option<String>,
    #[arg(long = "cuda-tensor-parallel", hide = true)]
    pub cuda_tensor_parallel: bool,
    #[arg(long = "tensor-parallel", value_name = "N", hide = true)]
    pub tensor_parallel: Option<String>,
    #[arg(long = "transport", value_name = "NAME", hide = true)]
    pub transport: Option<String>,
    #[arg(long = "vision", value_name = "FILE", hide = true)]
    pub vision: Option<String>,
    #[arg(long = "expert-profile", value_name = "FILE", hide = true)]
    pub expert_profile: Option<String>,
    /// With --batched-session: while other sessions are generating, a prompt is prefilled in slices of
    /// N tokens between their decode steps (alone, in --prefill-chunk slices).
    #[arg(long = "mixed-prefill-quantum", value_name = "N", default_value_t = 128)]
    pub mixed_prefill_quantum: usize,
}

impl Ds4Flags {
    /// The backend named by a shorthand, if any.
    pub fn backend(&self) -> Option<&'static str> {
        if self.cpu {
            Some("cpu")
        } else if self.cuda {
            Some("cuda")
        } else if self.metal {
            Some("metal")
        } else if self.vulkan {
            Some("vulkan")
        } else {
            None
        }
    }

    /// Binds the steering scales to the files by their positions in `m` (the matches these flags were
    /// parsed from); a usage error otherwise.
    pub fn bind_steering(&mut self, m: &clap::ArgMatches) -> Result<(), String> {
        fn placed<T: Clone + Send + Sync + 'static>(m: &clap::ArgMatches, id: &str) -> Vec<(usize, T)> {
            m.get_many::<T>(id).zip(m.indices_of(id)).map(|(v, i)| i.zip(v.cloned()).collect()).unwrap_or_default()
        }
        self.steering = ds4_model::steering::bind(placed(m, "dir_steering_file"), placed(m, "dir_steering_ffn"), placed(m, "dir_steering_attn")).map_err(|e| e.to_string())?;
        Ok(())
    }

    /// When the loaded steering applies (`--dir-steering-policy`).
    pub fn steer_policy(&self) -> crate::steer_policy::SteerPolicy { crate::steer_policy::SteerPolicy::parse(&self.dir_steering_policy) }

    /// The MTP options, or the usage error (checked before anything loads).
    pub fn mtp_options(&self) -> Result<Option<ds4_engine::MtpOptions>, String> {
        let Some(path) = &self.mtp else {
            if self.mtp_draft.is_some() || self.mtp_margin.is_some() {
                return Err("--mtp-draft and --mtp-margin need --mtp FILE".into());
            }
            return Ok(None);
        };
        let mut o = ds4_engine::MtpOptions::new(path.clone());
        o.draft = self.mtp_draft.unwrap_or(o.draft);
        o.margin = self.mtp_margin.unwrap_or(o.margin);
        o.validate().map_err(|e| e.to_string())?;
        Ok(Some(o))
    }

    /// The first flag of a feature this build lacks, as the one-line refusal (exit 2).
    pub fn not_built(&self) -> Option<String> {
        let set = |o: &Option<String>| o.is_some();
        let checks: [(bool, &str, &str); 19] = [
            (self.rocm, "--rocm", "the ROCm backend is not built; AMD GPUs run through --backend vulkan (built with --features wgpu), or use --backend cpu"),
            (set(&self.mtp_model), "--mtp-model", "DSpark speculative decoding is not built; use the MTP drafter (--mtp FILE) or run without it"),
            (self.mtp_exact_sampling, "--mtp-exact-sampling", "DSpark exact sampling is not built; MTP speculative sampling (--mtp) always keeps the sampler's distribution"),
            (self.mtp_timing, "--mtp-timing", "MTP timing output is not built; /metrics and the request log count drafted and accepted tokens"),
            (self.dspark, "--dspark", "DSpark speculative decoding is not built; run without it"),
            (set(&self.dspark_confidence), "--dspark-confidence", "DSpark speculative decoding is not built; run without it"),
            (self.dspark_strict, "--dspark-strict", "DSpark speculative decoding is not built; run without it"),
            (self.ssd_streaming, "--ssd-streaming", "SSD expert streaming is not built; the weights are mapped from the file (use a model that fits in memory)"),
            (self.ssd_streaming_cold, "--ssd-streaming-cold", "SSD expert streaming is not built; run without it"),
            (set(&self.ssd_streaming_cache_experts), "--ssd-streaming-cache-experts", "SSD expert streaming is not built; run without it"),
            (set(&self.ssd_streaming_preload_experts), "--ssd-streaming-preload-experts", "SSD expert streaming is not built; run without it"),
            (set(&self.ssd_streaming_full_layers), "--ssd-streaming-full-layers", "SSD expert streaming is not built; run without it"),
            (set(&self.simulate_used_memory), "--simulate-used-memory", "SSD expert streaming is not built; use --mem-limit-gb to set the memory budget"),
            (set(&self.gpu_vram), "--gpu-vram", "per-GPU memory placement is not built; use --backend cuda --cuda-devices 0,1,... (layers are split evenly)"),
            (self.cuda_tensor_parallel, "--cuda-tensor-parallel", "tensor parallelism is not built; use --cuda-devices 0,1,... (layers split over GPUs) or distributed stages (--role)"),
            (set(&self.tensor_parallel), "--tensor-parallel", "tensor parallelism is not built; use distributed stages (--role coordinator / ds4 --role worker)"),
            (set(&self.transport), "--transport", "tensor-parallel transports are not built; distributed stages use TCP (--role)"),
            (set(&self.vision), "--vision", "the vision encoder is not built; send text only"),
            (set(&self.expert_profile), "--expert-profile", "expert profiling (Metal) is not built; run without it"),
        ];
        checks.iter().find(|(on, _, _)| *on).map(|(_, flag, why)| format!("{flag} is not available in this build: {why}"))
    }
}
