//! Backend choice as ds4 spells it: `--backend auto|cpu|cuda|vulkan|metal|wgpu` and the switches
//! `--cpu`, `--cuda`, `--metal`, `--vulkan`, `--rocm`. `auto` (the default) is the best backend built in
//! and present (`ds4_engine::Backend::auto`: CUDA, then a wgpu GPU, then the CPU), as ds4 picks its
//! GPU backend when it has one.
use ds4_engine::Backend;

/// ds4's backend switches: aliases of `--backend NAME` (give at most one of them, and not with --backend).
#[derive(clap::Args, Debug, Default, Clone)]
pub struct BackendSwitches {
    /// Same as --backend cpu.
    #[arg(long = "cpu", conflicts_with_all = ["cuda", "metal", "vulkan", "rocm", "backend"])]
    pub cpu: bool,
    /// Same as --backend cuda.
    #[arg(long = "cuda", conflicts_with_all = ["metal", "vulkan", "rocm", "backend"])]
    pub cuda: bool,
    /// Same as --backend metal (Apple GPUs through wgpu; binary built with --features wgpu).
    #[arg(long = "metal", conflicts_with_all = ["vulkan", "rocm", "backend"])]
    pub metal: bool,
    /// Same as --backend vulkan (GPUs through wgpu; binary built with --features wgpu).
    #[arg(long = "vulkan", conflicts_with_all = ["rocm", "backend"])]
    pub vulkan: bool,
    /// ROCm (AMD GPUs): not built here (AMD GPUs run through --vulkan).
    #[arg(long = "rocm", conflicts_with = "backend")]
    pub rocm: bool,
}

/// The engine switches ds4 and ds4-bench share: backend, precision, FP8/FP4 simulation, duty cycle.
#[derive(clap::Args, Debug, Default, Clone)]
pub struct EngineSwitches {
    #[command(flatten)]
    pub backend: BackendSwitches,
    /// Exact kernels: f32 activations everywhere (no int8 fast path).
    #[arg(long = "quality")]
    pub quality: bool,
    /// Diagnostic: the FP8/FP4 simulation of the official model (KV rows, indexer) on or off. `off`
    /// departs from the shipped numerics.
    #[arg(long = "qat", value_name = "on|off", default_value = "on", value_parser = ["on", "off"])]
    pub qat: String,
    /// Duty-cycle target in percent (1..100): sleeps between prefill chunks and decoded tokens; same output.
    #[arg(long = "power", default_value_t = 100)]
    pub power: u32,
    /// Compute backend: auto (CUDA, else a wgpu GPU, when built with them and present; else CPU), cpu,
    /// cuda (--features cuda), vulkan or metal (--features wgpu; wgpu = this platform's one).
    #[arg(id = "backend", long = "backend")]
    pub backend_name: Option<String>,
    /// With --backend cuda: GPUs the layers are spread over, in contiguous parts (e.g. 0,1,2,3).
    #[arg(long = "cuda-devices", visible_alias = "gpu-devices", value_delimiter = ',', default_value = "0")]
    pub cuda_devices: Vec<usize>,
    /// With --backend cuda: where the weights live: device (copied to GPU memory), host (read in place
    /// from the mapped file over the bus; no GPU copy), auto (host on an integrated GPU, else device).
    #[arg(long = "cuda-weights", default_value = "auto", value_parser = ["auto", "device", "host"])]
    pub cuda_weights: String,
    /// Host memory of the weights: copy (huge-page memory, faster CPU decode; the CPU default) or mmap
    /// (map the file; a GPU backend's default).
    #[arg(long = "weights", env = "DS4_WEIGHTS", value_parser = ds4_engine::WeightMemory::parse)]
    pub weights: Option<ds4_engine::WeightMemory>,
    /// Read every weight page at startup (parallel pre-fault of the mapping, with progress), for no
    /// first-use stalls; --weights copy reads them all anyway.
    #[arg(long = "warm-weights")]
    pub warm_weights: bool,
    #[command(flatten)]
    pub mtp: MtpFlags,
    #[command(flatten)]
    pub steering: SteeringFlags,
}

/// ds4's directional steering flags. A file opens a slot; the scales that follow it (until the next
/// file) are that slot's. Bound in order by `SteeringFlags::bind` from the parsed command line.
#[derive(clap::Args, Debug, Default, Clone)]
pub struct SteeringFlags {
    /// Directional steering (CPU, Vulkan, Metal): n_layer x n_embd f32 directions (Flash: 43 x 4096); each
    /// layer's FFN/attention output loses s·v·(v·y). Repeatable: up to 8 files, applied in order.
    #[arg(id = "dir_steering_file", long = "dir-steering-file", value_name = "FILE", action = clap::ArgAction::Append)]
    pub files: Vec<std::path::PathBuf>,
    /// Scale after the FFN for the file before it [default: 1]; negative amplifies the direction.
    #[arg(id = "dir_steering_ffn", long = "dir-steering-ffn", value_name = "F", allow_negative_numbers = true, action = clap::ArgAction::Append)]
    pub ffn: Vec<f32>,
    /// Scale after attention for the file before it [default: 0].
    #[arg(id = "dir_steering_attn", long = "dir-steering-attn", value_name = "F", allow_negative_numbers = true, action = clap::ArgAction::Append)]
    pub attn: Vec<f32>,
    /// The slots, bound from the command line's order (`bind`).
    #[arg(skip)]
    pub specs: Vec<ds4_model::steering::SteerSpec>,
}

/// Parses a binary's command line (as `Parser::parse_from`, exiting on a clap error) and binds its
/// steering flags (`steering` finds them in the parsed value); a steering usage error exits 2.
pub fn parse_steered<P: clap::Parser>(bin: &str, argv: Vec<std::ffi::OsString>, steering: impl FnOnce(&mut P) -> &mut SteeringFlags) -> P {
    let m = P::command().get_matches_from(argv);
    let mut p = P::from_arg_matches(&m).unwrap_or_else(|e| e.exit());
    if let Err(e) = steering(&mut p).bind(&m) {
        eprintln!("{bin}: {e}");
        std::process::exit(2);
    }
    p
}

/// Values of `id` with their positions on the command line.
fn placed<T: Clone + Send + Sync + 'static>(m: &clap::ArgMatches, id: &str) -> Vec<(usize, T)> {
    match (m.get_many::<T>(id), m.indices_of(id)) {
        (Some(v), Some(i)) => i.zip(v.cloned()).collect(),
        _ => Vec::new(),
    }
}

impl SteeringFlags {
    /// Binds the scales to the files by their order in `m` (the matches these flags were parsed
    /// from) and checks the scales; a usage error otherwise.
    pub fn bind(&mut self, m: &clap::ArgMatches) -> Result<(), String> {
        self.specs = ds4_model::steering::bind(placed(m, "dir_steering_file"), placed(m, "dir_steering_ffn"), placed(m, "dir_steering_attn")).map_err(|e| e.to_string())?;
        Ok(())
    }
}

/// ds4's MTP speculative decoding flags.
#[derive(clap::Args, Debug, Default, Clone)]
pub struct MtpFlags {
    /// MTP drafter GGUF (e.g. DeepSeek-V4-Flash-MTP-Q4K-Q8_0-F32.gguf): speculative decoding on the CPU
    /// backend; greedy output is unchanged, sampling keeps its distribution.
    #[arg(long = "mtp", value_name = "FILE")]
    pub mtp: Option<std::path::PathBuf>,
    /// Tokens drafted per step, 1..4 [default: 1].
    #[arg(long = "mtp-draft", value_name = "N")]
    pub draft: Option<usize>,
    /// Draft only while the drafter's top logit leads its second by at least F [default: 3.0].
    #[arg(long = "mtp-margin", value_name = "F", allow_negative_numbers = true)]
    pub margin: Option<f32>,
}

impl MtpFlags {
    /// The MTP options, or a usage error (`--mtp-draft`/`--mtp-margin` without `--mtp`).
    pub fn options(&self) -> Result<Option<ds4_engine::MtpOptions>, String> {
        let Some(path) = &self.mtp else {
            if self.draft.is_some() || self.margin.is_some() {
                return Err("--mtp-draft and --mtp-margin need --mtp FILE".into());
            }
            return Ok(None);
        };
        let mut o = ds4_engine::MtpOptions::new(path.clone());
        o.draft = self.draft.unwrap_or(o.draft);
        o.margin = self.margin.unwrap_or(o.margin);
        o.validate().map_err(|e| e.to_string())?;
        Ok(Some(o))
    }
}

impl EngineSwitches {
    /// The backend `--backend` or a switch asks for, resolved for this binary.
    pub fn resolve_backend(&self) -> Result<Backend, BackendUsage> { self.backend.resolve(self.backend_name.as_deref()) }

    /// The forward pass's options these switches ask for.
    pub fn model_options(&self) -> ds4_model::Options {
        let mut options = ds4_model::Options::default();
        if self.quality {
            options.precision = ds4_quant::Precision::Exact;
        }
        options.qat = self.qat == "on";
        options
    }

    /// Load options for `backend` with these switches' devices, weight placement and model options
    /// (context, threads and chunk sizes are the caller's).
    pub fn load_options(&self, backend: Backend) -> ds4_engine::LoadOptions {
        ds4_engine::LoadOptions {
            backend,
            cuda_devices: self.cuda_devices.clone(),
            // clap's value_parser admits only valid names.
            cuda_weights: ds4_engine::CudaWeights::parse(&self.cuda_weights).unwrap_or_default(),
            weights: self.weights,
            warm_weights: self.warm_weights,
            options: self.model_options(),
            // Checked by `MtpFlags::options` in the binaries' usage checks (exit 2 before loading).
            mtp: self.mtp.options().ok().flatten(),
            steering: self.steering.specs.clone(),
            ..ds4_engine::LoadOptions::default()
        }
    }
}

/// Why no backend could be picked: a usage error (exit 2).
#[derive(Debug)]
pub struct BackendUsage(pub String);

impl BackendSwitches {
    /// The backend name the switches or `--backend` ask for (`auto` when neither is given), and
    /// how the user spelled it (for messages).
    fn requested(&self, backend: Option<&str>) -> (String, String) {
        let name = match (self.cpu, self.cuda, self.metal, self.vulkan, self.rocm) {
            (true, ..) => "cpu",
            (_, true, ..) => "cuda",
            (_, _, true, ..) => "metal",
            (_, _, _, true, _) => "vulkan",
            (.., true) => "rocm",
            _ => return (backend.unwrap_or("auto").to_string(), format!("--backend {}", backend.unwrap_or("auto"))),
        };
        (name.to_string(), format!("--{name}"))
    }

    /// Resolves the switches and `--backend` to a backend this binary can run, or a usage error.
    pub fn resolve(&self, backend: Option<&str>) -> Result<Backend, BackendUsage> {
        let (name, given) = self.requested(backend);
        if name == "rocm" {
            return Err(BackendUsage(format!("{given}: ROCm is not built: AMD GPUs run through --backend vulkan (cargo build --release --features wgpu), or use --backend cpu")));
        }
        let b = Backend::parse(&name).map_err(|_| BackendUsage(format!("{given}: unknown backend (expected auto, cpu, cuda, vulkan, metal or wgpu)")))?;
        // The engine's refusal names the backend as `--backend NAME`; say it as the user spelled it.
        b.built().map_err(|e| BackendUsage(e.to_string().replacen(&format!("--backend {}", b.name()), &given, 1)))?;
        Ok(b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn auto() -> Backend { Backend::auto() }

    #[derive(Parser, Debug)]
    struct Cli {
        #[command(flatten)]
        sw: EngineSwitches,
    }

    /// The backend a command line picks, or clap's or the resolver's error message.
    fn pick(args: &[&str]) -> Result<Backend, String> {
        let cli = Cli::try_parse_from(std::iter::once("ds4").chain(args.iter().copied())).map_err(|e| e.to_string())?;
        cli.sw.resolve_backend().map_err(|e| e.0)
    }

    #[test]
    fn every_spelling_resolves_or_names_the_cargo_feature() {
        assert_eq!(pick(&["--cpu"]).unwrap(), Backend::Cpu);
        assert_eq!(pick(&["--backend", "cpu"]).unwrap(), Backend::Cpu);
        assert_eq!(pick(&[]).unwrap(), auto());
        assert_eq!(pick(&["--backend", "auto"]).unwrap(), auto());
        for args in [&["--cuda"][..], &["--backend", "cuda"]] {
            match pick(args) {
                Ok(b) => assert!(cfg!(feature = "cuda") && b == Backend::Cuda),
                Err(e) => assert!(!cfg!(feature = "cuda") && e.contains("--features cuda") && e.starts_with(args[0]), "{e}"),
            }
        }
        let apple = cfg!(target_vendor = "apple");
        let wgpu = cfg!(feature = "wgpu");
        let native = if apple { Backend::Metal } else { Backend::Vulkan };
        for (args, want, runs) in [
            (&["--vulkan"][..], Backend::Vulkan, wgpu),
            (&["--backend", "vulkan"], Backend::Vulkan, wgpu),
            (&["--metal"], Backend::Metal, wgpu && apple),
            (&["--backend", "metal"], Backend::Metal, wgpu && apple),
            (&["--backend", "wgpu"], native, wgpu),
        ] {
            match pick(args) {
                Ok(b) => assert!(runs && b == want, "{args:?} gave {b:?}"),
                Err(e) => {
                    assert!(!runs, "{args:?}: {e}");
                    assert!(e.starts_with(args[0]), "names the flag as given: {e}");
                    assert!(e.contains(if wgpu { "Apple" } else { "--features wgpu" }), "{e}");
                }
            }
        }
        assert!(pick(&["--rocm"]).unwrap_err().contains("--backend vulkan"));
    }

    #[test]
    fn steering_scales_bind_to_the_file_before_them() {
        use clap::{CommandFactory, FromArgMatches};
        let parse = |args: &[&str]| -> Result<Vec<ds4_model::steering::SteerSpec>, String> {
            let m = Cli::command().try_get_matches_from(std::iter::once("ds4").chain(args.iter().copied())).map_err(|e| e.to_string())?;
            let mut cli = Cli::from_arg_matches(&m).map_err(|e| e.to_string())?;
            cli.sw.steering.bind(&m)?;
            Ok(cli.sw.steering.specs)
        };
        let s = parse(&["--dir-steering-file", "a", "--dir-steering-ffn", "2", "--cpu", "--dir-steering-file=b", "--dir-steering-attn", "-0.5"]).unwrap();
        assert_eq!((s.len(), s[0].ffn, s[0].attn, s[1].ffn, s[1].attn), (2, 2.0, 0.0, 1.0, -0.5));
        assert_eq!(s[1].file, std::path::PathBuf::from("b"));
        assert!(parse(&[]).unwrap().is_empty());
        assert!(parse(&["--dir-steering-ffn", "1"]).unwrap_err().contains("need --dir-steering-file"));
        assert!(parse(&["--dir-steering-file", "a", "--dir-steering-ffn", "250"]).unwrap_err().contains("-100 to 100"));
        assert!(parse(&["--dir-steering-file", "a", "--dir-steering-attn", "x"]).is_err());
    }

    #[test]
    fn bad_values_and_conflicts_are_usage_errors() {
        let e = pick(&["--backend", "opencl"]).unwrap_err();
        assert!(e.contains("--backend opencl: unknown backend") && e.contains("vulkan"), "{e}");
        for args in [
            &["--cpu", "--cuda"][..],
            &["--cpu", "--vulkan"],
            &["--cuda", "--metal"],
            &["--metal", "--vulkan"],
            &["--vulkan", "--backend", "cpu"],
            &["--metal", "--backend", "metal"],
            &["--cpu", "--rocm"],
        ] {
            let e = pick(args).unwrap_err();
            assert!(e.contains("cannot be used with"), "{args:?}: {e}");
        }
    }

    #[test]
    fn a_cpu_only_build_auto_picks_the_cpu() {
        if !cfg!(feature = "cuda") && !cfg!(feature = "wgpu") {
            assert_eq!(auto(), Backend::Cpu);
        }
        // Never a CPU-type adapter (lavapipe in CI): that is slower than the CPU backend.
        if ds4_engine::probe_wgpu() == Some(ds4_engine::AdapterKind::Cpu) {
            assert!(!auto().is_wgpu(), "auto chose {:?} over a CPU-type adapter", auto());
        }
    }
}
