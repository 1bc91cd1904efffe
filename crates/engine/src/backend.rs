//! Which device runs the forward pass: the names users give (`--backend`), what this binary was built
//! with (cargo features `cuda`, `wgpu`), and `auto`, the best one built in and present.
use crate::error::EngineError;
use std::sync::OnceLock;

/// Which device runs the forward pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Backend {
    #[default]
    Cpu,
    /// NVIDIA GPU (needs the `cuda` cargo feature).
    Cuda,
    /// A GPU through wgpu on Vulkan (needs the `wgpu` cargo feature, a Vulkan loader and driver).
    Vulkan,
    /// An Apple GPU through wgpu on Metal (needs the `wgpu` cargo feature; Apple platforms only).
    Metal,
}

/// What a device probe found: the kind of the best wgpu adapter, for `auto`'s choice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdapterKind {
    /// A real GPU (discrete, integrated, virtual or unclassified).
    Gpu,
    /// A CPU implementation of the API (lavapipe, SwiftShader): slower than the CPU backend.
    Cpu,
}

impl Backend {
    /// `auto`, `cpu`, `cuda`, `vulkan`, `metal`, or `wgpu` (the platform's wgpu API: Metal on Apple,
    /// Vulkan elsewhere). Any name parses in any build; [`Backend::built`] says whether this binary
    /// can run it.
    pub fn parse(s: &str) -> Result<Self, EngineError> {
        match s {
            "auto" => Ok(Self::auto()),
            "cpu" => Ok(Self::Cpu),
            "cuda" => Ok(Self::Cuda),
            "vulkan" => Ok(Self::Vulkan),
            "metal" => Ok(Self::Metal),
            "wgpu" => Ok(Self::wgpu_default()),
            o => Err(EngineError::Invalid(format!("unknown backend `{o}` (expected auto, cpu, cuda, vulkan, metal or wgpu)"))),
        }
    }

    /// The wgpu backend of this platform: Metal on Apple, Vulkan elsewhere.
    pub fn wgpu_default() -> Self { if cfg!(target_vendor = "apple") { Self::Metal } else { Self::Vulkan } }

    pub fn name(self) -> &'static str {
        match self {
            Self::Cpu => "cpu",
            Self::Cuda => "cuda",
            Self::Vulkan => "vulkan",
            Self::Metal => "metal",
        }
    }

    /// True for the backends whose KV state and weights live on a device (every one but the CPU).
    pub fn is_gpu(self) -> bool { self != Self::Cpu }

    /// True for the backends that run through the `wgpu` feature (`ds4-wgpu`).
    pub fn is_wgpu(self) -> bool { matches!(self, Self::Vulkan | Self::Metal) }

    /// Ok when MTP speculative decoding runs on this backend over `devices` GPUs (`--cuda-devices`):
    /// every backend verifies with greedy output unchanged (the CPU's and wgpu's short steps are their
    /// decode steps bit for bit, CUDA verifies as exact rows), on one device; else the refusal for `--mtp`.
    pub fn speculative(self, devices: usize) -> Result<(), String> {
        match self {
            Self::Cuda if devices > 1 => Err(format!("--mtp: speculative decoding verifies on one GPU, not over {devices} --cuda-devices parts; use one device, or run without --mtp (same greedy output)")),
            _ => Ok(()),
        }
    }

    /// Ok when this binary can run the backend; else the refusal naming the cargo feature to build with
    /// (or the platform it needs).
    pub fn built(self) -> Result<(), EngineError> {
        let missing = |feature: &str, what: &str| {
            Err(EngineError::Unsupported(format!(
                "--backend {}: this binary was built without {what}: rebuild with `cargo build --release --features {feature}`, or use --backend cpu",
                self.name()
            )))
        };
        match self {
            Self::Cpu => Ok(()),
            Self::Cuda if !cfg!(feature = "cuda") => missing("cuda", "CUDA support"),
            Self::Vulkan | Self::Metal if !cfg!(feature = "wgpu") => missing("wgpu", "the wgpu GPU backend (Vulkan, Metal)"),
            Self::Metal if !cfg!(target_vendor = "apple") => Err(EngineError::Unsupported(
                "--backend metal: Metal exists on Apple platforms only; use --backend vulkan (or --backend wgpu, this platform's wgpu API)".into(),
            )),
            _ => Ok(()),
        }
    }

    /// The best backend built in and present, probed once per process: CUDA in a CUDA build when the
    /// NVIDIA driver lists a device (checked without loading any CUDA library); else, in a wgpu build,
    /// the platform's wgpu API when its best adapter opens and is a GPU (a CPU implementation such as
    /// lavapipe is slower than the CPU backend); else the CPU.
    pub fn auto() -> Self {
        static AUTO: OnceLock<Backend> = OnceLock::new();
        *AUTO.get_or_init(|| {
            let nvidia = cfg!(feature = "cuda") && nvidia_present();
            // The wgpu probe opens a device: skipped when CUDA is chosen anyway.
            let adapter = if nvidia { None } else { probe_wgpu() };
            Self::pick(nvidia, adapter)
        })
    }

    /// `auto`'s rule, given what the probes found (`nvidia`: a CUDA build with an NVIDIA device;
    /// `adapter`: the best wgpu adapter that opened, in a wgpu build).
    pub fn pick(nvidia: bool, adapter: Option<AdapterKind>) -> Self {
        match (nvidia, adapter) {
            (true, _) => Self::Cuda,
            (false, Some(AdapterKind::Gpu)) => Self::wgpu_default(),
            _ => Self::Cpu,
        }
    }
}

/// True when the NVIDIA driver lists a device.
fn nvidia_present() -> bool {
    std::fs::read_dir("/proc/driver/nvidia/gpus").map(|mut d| d.next().is_some()).unwrap_or(false) || std::path::Path::new("/dev/nvidia0").exists()
}

/// The kind of the best adapter of the platform's wgpu API, None when none opens (or no wgpu build).
pub fn probe_wgpu() -> Option<AdapterKind> {
    #[cfg(feature = "wgpu")]
    {
        crate::wgpu_stage::probe()
    }
    #[cfg(not(feature = "wgpu"))]
    {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_and_round_trip() {
        for b in [Backend::Cpu, Backend::Cuda, Backend::Vulkan, Backend::Metal] {
            assert_eq!(Backend::parse(b.name()).unwrap(), b);
        }
        assert_eq!(Backend::parse("wgpu").unwrap(), if cfg!(target_vendor = "apple") { Backend::Metal } else { Backend::Vulkan });
        assert_eq!(Backend::parse("auto").unwrap(), Backend::auto());
        let e = Backend::parse("rocm").unwrap_err().to_string();
        assert!(e.contains("unknown backend `rocm`") && e.contains("vulkan"), "{e}");
        assert!(Backend::parse("Vulkan").is_err(), "names are lower case, as ds4's");
    }

    #[test]
    fn a_backend_not_built_names_the_cargo_feature() {
        assert!(Backend::Cpu.built().is_ok());
        for b in [Backend::Vulkan, Backend::Metal] {
            let r = b.built();
            if !cfg!(feature = "wgpu") {
                let e = r.unwrap_err().to_string();
                assert!(e.contains("--features wgpu") && e.contains(b.name()), "{e}");
            }
        }
        if cfg!(feature = "wgpu") {
            assert!(Backend::Vulkan.built().is_ok());
            assert_eq!(Backend::Metal.built().is_ok(), cfg!(target_vendor = "apple"));
        }
        let r = Backend::Cuda.built();
        assert_eq!(r.is_ok(), cfg!(feature = "cuda"));
        if let Err(e) = r {
            assert!(e.to_string().contains("--features cuda"), "{e}");
        }
    }

    #[test]
    fn auto_prefers_cuda_then_a_real_gpu_never_a_cpu_adapter() {
        assert_eq!(Backend::pick(true, None), Backend::Cuda);
        assert_eq!(Backend::pick(true, Some(AdapterKind::Gpu)), Backend::Cuda);
        assert_eq!(Backend::pick(false, Some(AdapterKind::Gpu)), Backend::wgpu_default());
        assert_eq!(Backend::pick(false, Some(AdapterKind::Cpu)), Backend::Cpu);
        assert_eq!(Backend::pick(false, None), Backend::Cpu);
    }

    #[test]
    fn auto_agrees_with_the_probe() {
        let auto = Backend::auto();
        eprintln!("wgpu probe: {:?}; auto: {auto:?}", probe_wgpu());
        assert!(auto.built().is_ok(), "auto picks a backend this binary runs: {auto:?}");
        if !cfg!(feature = "wgpu") {
            assert!(!auto.is_wgpu());
        }
        if probe_wgpu() == Some(AdapterKind::Cpu) {
            // lavapipe (CI): a CPU-type adapter is never chosen.
            assert!(!auto.is_wgpu(), "auto chose {auto:?} over a CPU-type adapter");
        }
    }
}
