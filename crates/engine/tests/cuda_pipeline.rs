//! The layers split over several CUDA stages (`--cuda-devices 0,0` puts two parts on one GPU, which is
//! what one lent GPU can check) give the same logits, bit for bit, as one stage: the parts run the same
//! kernels and the hidden state passes between them as f32. Skips without a usable GPU.
#![cfg(feature = "cuda")]
use ds4_engine::{resolve_model, Backend, Engine, LoadOptions, Session};
use std::sync::atomic::AtomicBool;

fn load(devices: Vec<usize>) -> Option<Engine> {
    let src = resolve_model(None).unwrap();
    let opts = LoadOptions { ctx: 256, prefill_chunk: 32, backend: Backend::Cuda, cuda_devices: devices, ..LoadOptions::default() };
    match Engine::load(src.path(), &opts) {
        Ok(e) => Some(e),
        Err(e) if e.to_string().contains("CUDA driver") || e.to_string().contains("usable CUDA device") => {
            eprintln!("SKIPPED: {e}");
            None
        }
        Err(e) => panic!("{e}"),
    }
}

fn greedy_run(eng: &mut Engine) -> (Vec<u32>, Vec<Vec<f32>>) {
    let never = AtomicBool::new(false);
    let prompt: Vec<u32> = (0..70u32).map(|i| (i * 2654435761u32 >> 9) % 500 + 3).collect();
    let mut s = Session::new(eng);
    s.sync(eng, &prompt, &mut |_, _| {}, &never).unwrap();
    let (mut toks, mut logits) = (Vec::new(), Vec::new());
    for _ in 0..24 {
        logits.push(s.logits.clone());
        let t = s.logits.iter().enumerate().fold((0usize, f32::NEG_INFINITY), |b, (i, &v)| if v > b.1 { (i, v) } else { b }).0 as u32;
        toks.push(t);
        s.step(eng, t).unwrap();
    }
    (toks, logits)
}

#[test]
fn two_parts_on_one_gpu_equal_one_stage() {
    let Some(mut one) = load(vec![0]) else { return };
    let (t1, l1) = greedy_run(&mut one);
    drop(one);
    let Some(mut two) = load(vec![0, 0]) else { return };
    let (t2, l2) = greedy_run(&mut two);
    assert_eq!(t1, t2, "greedy tokens differ between one and two CUDA parts");
    assert!(l1 == l2, "logits differ between one and two CUDA parts");
}

/// `Session::generate` with the device taking the argmax (greedy = true) gives the tokens of the
/// host argmax over downloaded logits, on one part and on two, and leaves the same logits to
/// continue from.
#[test]
fn device_greedy_generation_equals_host_argmax() {
    for devices in [vec![0], vec![0, 0]] {
        let Some(mut eng) = load(devices.clone()) else { return };
        let (want, logits) = greedy_run(&mut eng);
        let never = AtomicBool::new(false);
        let prompt: Vec<u32> = (0..70u32).map(|i| (i * 2654435761u32 >> 9) % 500 + 3).collect();
        let mut s = Session::new(&eng);
        s.sync(&mut eng, &prompt, &mut |_, _| {}, &never).unwrap();
        let mut got = Vec::new();
        let mut stats = ds4_engine::GenStats::default();
        let host_argmax = &mut |l: &[f32]| l.iter().enumerate().fold((0usize, f32::NEG_INFINITY), |b, (i, &v)| if v > b.1 { (i, v) } else { b }).0 as u32;
        s.generate(&mut eng, 23, None, true, host_argmax, &mut |t| {
            got.push(t);
            true
        }, &never, &mut stats)
        .unwrap();
        assert_eq!(got, want[..23], "device-greedy tokens differ from the host argmax ({devices:?})");
        // 23 tokens generated and consumed: the logits left are those the 24th was chosen from.
        assert!(s.logits == logits[23], "logits left by device-greedy generation differ ({devices:?})");
    }
}
