//! `ds4 --dir-steering-*` on the embedded default model: scale 0 gives the plain model's text, a
//! strong scale another text (the edit itself is checked against transformers in hf_forward.rs),
//! `/steer F` changes the scale live, and a file of the wrong size or with a value that is not finite is
//! refused before weights load.
use std::process::{Command, Output, Stdio};

fn ds4(args: &[&str], stdin: &str) -> Output {
    use std::io::Write;
    let mut c = Command::new(env!("CARGO_BIN_EXE_ds4")).args(["--cpu", "--nothink", "--temp", "0", "-n", "16", "-t", "1"]).args(args).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    c.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
    c.wait_with_output().unwrap()
}

fn text(o: &Output) -> String {
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Unit directions for the embedded model (`n_layer` x `n_embd` f32), fixed pseudo-random.
fn direction_file(name: &str) -> std::path::PathBuf {
    let model = ds4_engine::resolve_model(None).unwrap().path().to_path_buf();
    let cfg = ds4_model::Config::from_gguf(&ds4_gguf::GgufFile::open(&model).unwrap()).unwrap();
    let mut x: u32 = 12345;
    let mut bytes = Vec::new();
    for _ in 0..cfg.n_layer {
        let row: Vec<f32> = (0..cfg.n_embd).map(|_| { x = x.wrapping_mul(1_664_525).wrapping_add(1_013_904_223); (x >> 8) as f32 / (1u32 << 24) as f32 - 0.5 }).collect();
        let n = row.iter().map(|v| v * v).sum::<f32>().sqrt();
        row.iter().for_each(|v| bytes.extend_from_slice(&(v / n).to_le_bytes()));
    }
    let p = std::env::temp_dir().join(format!("ds4-cli-steer-{name}-{}.f32", std::process::id()));
    std::fs::write(&p, bytes).unwrap();
    p
}

#[test]
fn steering_changes_the_text_only_when_it_scales() {
    let f = direction_file("scales");
    let fs = f.to_str().unwrap();
    let plain = text(&ds4(&["-p", "steer me"], ""));
    assert_eq!(text(&ds4(&["-p", "steer me", "--dir-steering-file", fs, "--dir-steering-ffn", "0"], "")), plain, "scale 0 is the plain model");
    let steered = text(&ds4(&["-p", "steer me", "--dir-steering-file", fs, "--dir-steering-ffn", "-8", "--dir-steering-attn", "4"], ""));
    assert_ne!(steered, plain, "a strong scale changes the text");
    // Interactive: /steer sets the first file's FFN scale for the next turns (the KV state is kept).
    let o = ds4(&["--dir-steering-file", fs, "--dir-steering-ffn", "0"], "/steer\n/steer -8\n/steer 200\n/quit\n");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("steering 1: ffn 0 attn 0") && err.contains("steering 1: ffn -8 attn 0") && err.contains("-100 to 100"), "{err}");
    std::fs::remove_file(&f).ok();
}

#[test]
fn a_bad_file_is_refused_before_loading() {
    let bad = std::env::temp_dir().join(format!("ds4-cli-steer-bad-{}.f32", std::process::id()));
    std::fs::write(&bad, [0u8; 12]).unwrap();
    let o = ds4(&["-p", "x", "--dir-steering-file", bad.to_str().unwrap()], "");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("12 bytes, expected") && !err.contains("loading weights"), "{err}");
    // The right size with a value that is not finite: refused at plan time too.
    let good = direction_file("nan");
    let mut bytes = std::fs::read(&good).unwrap();
    bytes[40..44].copy_from_slice(&f32::NAN.to_le_bytes());
    std::fs::write(&bad, bytes).unwrap();
    let o = ds4(&["-p", "x", "--dir-steering-file", bad.to_str().unwrap()], "");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("value 10 (layer 0) is not finite") && !err.contains("loading weights"), "{err}");
    std::fs::remove_file(&bad).ok();
    std::fs::remove_file(&good).ok();
}
