//! Backend choice as ds4 spells it: `--backend auto|cpu|cuda` and the switches `--cpu`, `--cuda`,
//! `--metal`, `--rocm`. `auto` (the default) is CUDA when this binary was built with it and an NVIDIA
//! device is present, else the CPU, as ds4 picks its GPU backend when it has one.
use ds4_engine::Backend;

/// ds4's backend switches: aliases of `--backend NAME` (give at most one of them, and not with --backend).
#[derive(clap::Args, Debug, Default, Clone)]
pub struct BackendSwitches {
    /// Same as --backend cpu.
    #[arg(long = "cpu", conflicts_with_all = ["cuda", "metal", "rocm", "backend"])]
    pub cpu: bool,
    /// Same as --backend cuda.
    #[arg(long = "cuda", conflicts_with_all = ["metal", "rocm", "backend"])]
    pub cuda: bool,
    /// Metal (Apple GPUs): not built here.
    #[arg(long = "metal", conflicts_with_all = ["rocm", "backend"])]
    pub metal: bool,
    /// ROCm (AMD GPUs): not built here.
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
    /// Compute backend: auto (CUDA when built with it and a GPU is present, else CPU), cpu or cuda.
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
        let name = match (self.cpu, self.cuda, self.metal, self.rocm) {
            (true, ..) => "cpu",
            (_, true, ..) => "cuda",
            (_, _, true, _) => "metal",
            (.., true) => "rocm",
            _ => return (backend.unwrap_or("auto").to_string(), format!("--backend {}", backend.unwrap_or("auto"))),
        };
        (name.to_string(), format!("--{name}"))
    }

    /// Resolves the switches and `--backend` to a backend this binary can run, or a usage error.
    pub fn resolve(&self, backend: Option<&str>) -> Result<Backend, BackendUsage> {
        let (name, given) = self.requested(backend);
        match name.as_str() {
            "auto" => Ok(auto()),
            "cpu" => Ok(Backend::Cpu),
            "cuda" if cfg!(feature = "cuda") => Ok(Backend::Cuda),
            "cuda" => Err(BackendUsage(format!("{given}: this binary was built without CUDA (cargo build --release --features cuda); use --backend cpu"))),
            "metal" | "wgpu" | "rocm" => Err(BackendUsage(format!("{given}: not built yet: use --backend cpu or --backend cuda (--cpu, --cuda)"))),
            _ => Err(BackendUsage(format!("{given}: unknown backend (expected auto, cpu or cuda)"))),
        }
    }
}

/// `auto`: CUDA in a CUDA build when the NVIDIA driver lists a device, else the CPU.
pub fn auto() -> Backend { Backend::auto() }

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn switches_and_names() {
        let s = BackendSwitches { cpu: true, ..Default::default() };
        assert_eq!(s.resolve(None).unwrap(), Backend::Cpu);
        let s = BackendSwitches { cuda: true, ..Default::default() };
        assert_eq!(s.resolve(None).is_ok(), cfg!(feature = "cuda"));
        let s = BackendSwitches { metal: true, ..Default::default() };
        assert!(s.resolve(None).unwrap_err().0.contains("not built yet"));
        let none = BackendSwitches::default();
        assert_eq!(none.resolve(Some("auto")).unwrap(), auto());
        assert_eq!(none.resolve(None).unwrap(), auto());
        assert!(none.resolve(Some("vulkan")).is_err());
        if !cfg!(feature = "cuda") {
            assert_eq!(auto(), Backend::Cpu, "a CPU-only build never picks CUDA");
        }
    }
}
