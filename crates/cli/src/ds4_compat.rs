//! The C engine's command lines, before clap sees them: its 3-letter short flag `-sys` becomes
//! `--system`, and flags of features this project has not built end the process with exit 2 and one
//! line that says so and what to use instead (never clap's "unexpected argument", which reads as a typo).
use std::ffi::OsString;

/// A ds4 flag (or flag family, when `prefix`) whose feature is not built here.
struct NotBuilt {
    flag: &'static str,
    prefix: bool,
    what: &'static str,
}

const fn nb(flag: &'static str, what: &'static str) -> NotBuilt { NotBuilt { flag, prefix: false, what } }
const fn family(flag: &'static str, what: &'static str) -> NotBuilt { NotBuilt { flag, prefix: true, what } }

const SPECULATIVE: &str = "DSpark/GLM speculative drafters are not built yet: use the MTP drafter (--mtp FILE --mtp-draft N --mtp-margin F), or run without it (plain decoding gives the same tokens)";
const SSD: &str = "SSD expert streaming is not built yet: the whole model must fit in memory (see --mem-limit-gb)";
const TENSOR_PARALLEL: &str =
    "tensor parallelism is not built yet: use --cuda-devices 0,1,.. (layers split over the GPUs of one host) or --role/--layers (pipeline over hosts)";
const GPU_DIAGNOSTICS: &str = "the C engine's CPU-vs-GPU diagnostics are not built: the ds4-cuda device tests (cargo test -p ds4-cuda --features cuda) check the same";

/// Every not-built flag of ds4, ds4-bench (ds4-features.md §3, §4.2, §7).
const NOT_BUILT: &[NotBuilt] = &[
    // --mtp, --mtp-draft, --mtp-margin are built (MTP speculative decoding); the DSpark family is not.
    nb("--mtp-model", SPECULATIVE),
    nb("--mtp-exact-sampling", "--mtp-exact-sampling (DSpark) is not built: MTP speculative sampling (--mtp) always keeps the sampler's distribution"),
    nb("--mtp-timing", "--mtp-timing is not built: --debug prints MTP drafted/accepted counts"),
    nb("--dspark", SPECULATIVE),
    family("--dspark-", SPECULATIVE),
    family("--glm-mtp", SPECULATIVE),
    nb("--dir-steering-policy", "--dir-steering-policy is a ds4-server flag: ds4 and ds4-bench steer every token (prompt and answer)"),
    family("--ssd-streaming", SSD),
    nb("--simulate-used-memory", SSD),
    nb("--gpu-vram", "per-GPU VRAM placement is not built yet: use --cuda-devices 0,1,.. to spread the layers"),
    nb("--cuda-tensor-parallel", TENSOR_PARALLEL),
    nb("--tensor-parallel", TENSOR_PARALLEL),
    nb("--transport", TENSOR_PARALLEL),
    family("--rdma-", TENSOR_PARALLEL),
    nb("--vision", "vision input is not built yet: text prompts only"),
    nb("--expert-profile", "the routed-expert profile is Metal-only and not built: run without it"),
    nb("--head-test", GPU_DIAGNOSTICS),
    nb("--first-token-test", GPU_DIAGNOSTICS),
    family("--metal-graph-", GPU_DIAGNOSTICS),
    nb("--server", "the HTTP server is a separate binary: run ds4-server"),
];

/// Flags whose next argument is free text (a prompt can look like a flag).
const TEXT_VALUE: &[&str] = &["-p", "--prompt", "--system", "-sys"];

/// The not-built line for `arg` (`--flag` or `--flag=value`), if it names a not-built feature.
pub fn not_built(arg: &str) -> Option<String> {
    let name = arg.split_once('=').map_or(arg, |(n, _)| n);
    let hit = NOT_BUILT.iter().find(|n| if n.prefix { name.starts_with(n.flag) } else { name == n.flag })?;
    Some(format!("{name}: {}", hit.what))
}

/// Rewrites ds4 spellings clap cannot take (`-sys` → `--system`) and exits 2 on a not-built flag,
/// printing `BIN: --flag: <what is missing and what to use>`.
pub fn preprocess(bin: &str, args: impl IntoIterator<Item = OsString>) -> Vec<OsString> {
    let mut out = Vec::new();
    let (mut text_next, mut positional) = (false, false);
    for (i, a) in args.into_iter().enumerate() {
        let s = a.to_str().unwrap_or("");
        if i == 0 || text_next || positional {
            text_next = false;
            out.push(a);
            continue;
        }
        if s == "--" {
            positional = true; // clap takes what follows `--` as values
        } else if let Some(line) = not_built(s) {
            eprintln!("{bin}: {line}");
            std::process::exit(2);
        }
        text_next = TEXT_VALUE.contains(&s);
        out.push(if s == "-sys" { OsString::from("--system") } else { a });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_and_values_are_recognised() {
        assert!(not_built("--mtp").is_none(), "MTP is built");
        assert!(not_built("--mtp-draft").is_none());
        assert!(not_built("--mtp-margin=2").is_none());
        assert!(not_built("--mtp-model=draft.gguf").unwrap().starts_with("--mtp-model:"));
        assert!(not_built("--dspark").is_some());
        assert!(not_built("--glm-mtp-draft").is_some());
        assert!(not_built("--dir-steering-ffn").is_none(), "steering is built");
        assert!(not_built("--dir-steering-policy").is_some(), "a server flag");
        assert!(not_built("--rdma-device").is_some());
        assert!(not_built("--prompt").is_none());
        assert!(not_built("--dspark-x").is_some() && not_built("--dsparkx").is_none(), "only the flag or its dash family");
    }

    #[test]
    fn sys_becomes_system_and_prompts_are_left_alone() {
        let v = |a: &[&str]| preprocess("t", a.iter().map(OsString::from)).into_iter().map(|s| s.into_string().unwrap()).collect::<Vec<_>>();
        assert_eq!(v(&["ds4", "-sys", "Be brief", "-p", "-sys"]), ["ds4", "--system", "Be brief", "-p", "-sys"]);
        assert_eq!(v(&["ds4", "-p", "--mtp"]), ["ds4", "-p", "--mtp"], "a prompt that looks like a flag");
    }
}
