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

fn load_on(backend: Backend, devices: Vec<usize>) -> Option<Engine> {
    let src = resolve_model(None).unwrap();
    let opts = LoadOptions { ctx: 256, prefill_chunk: 32, backend, cuda_devices: devices, ..LoadOptions::default() };
    match Engine::load(src.path(), &opts) {
        Ok(e) => Some(e),
        Err(e) if e.to_string().contains("CUDA driver") || e.to_string().contains("usable CUDA device") => {
            eprintln!("SKIPPED: {e}");
            None
        }
        Err(e) => panic!("{e}"),
    }
}

fn argmax(l: &[f32]) -> u32 { l.iter().enumerate().fold((0usize, f32::NEG_INFINITY), |b, (i, &v)| if v > b.1 { (i, v) } else { b }).0 as u32 }

/// Prefill of 70 tokens (3 chunks: compressor windows and the indexer threshold crossed) and 9 greedy
/// decode steps: the session a save takes.
fn before_save(eng: &mut Engine) -> Session {
    let never = AtomicBool::new(false);
    let prompt: Vec<u32> = (0..70u32).map(|i| (i * 2654435761u32 >> 9) % 500 + 3).collect();
    let mut s = Session::new(eng);
    s.sync(eng, &prompt, &mut |_, _| {}, &never).unwrap();
    for _ in 0..9 {
        let t = argmax(&s.logits);
        s.step(eng, t).unwrap();
    }
    s
}

/// `n` greedy steps from the session's logits: (tokens, logits after each).
fn continue_greedy(eng: &mut Engine, s: &mut Session, n: usize) -> (Vec<u32>, Vec<Vec<f32>>) {
    let (mut toks, mut logits) = (Vec::new(), Vec::new());
    for _ in 0..n {
        let t = argmax(&s.logits);
        toks.push(t);
        s.step(eng, t).unwrap();
        logits.push(s.logits.clone());
    }
    (toks, logits)
}

fn save(eng: &mut Engine, s: &mut Session, path: &std::path::Path) {
    eng.kv_to_host(&mut s.kv).unwrap();
    let st = ds4_kvstore::StateRef { tokens: &s.tokens, kv: &s.kv, logits: &s.logits, tool_map: &[] };
    ds4_kvstore::save_file(path, &ds4_kvstore::stage_identity(&eng.stage), ds4_kvstore::Reason::Manual, &st).unwrap();
}

fn restore(eng: &mut Engine, path: &std::path::Path) -> Session {
    let mut s = Session::new(eng);
    let id = ds4_kvstore::stage_identity(&eng.stage);
    let vocab = eng.cfg().n_vocab;
    let r = ds4_kvstore::load_file(path, &id, &mut s.kv, &mut s.logits, Some(vocab)).unwrap();
    s.tokens = r.tokens;
    eng.kv_to_device(&s.kv).unwrap();
    s
}

/// Disk KV cache on CUDA: a session saved to a checksummed file, the engine dropped (a restart), a new
/// engine loaded and the file restored continues with the greedy tokens, and the logits bit for bit,
/// of the uninterrupted run; on one part and on two (each part saves and restores its layers).
#[test]
fn cuda_session_saved_and_restored_continues_like_the_uninterrupted_run() {
    let dir = std::env::temp_dir().join(format!("ds4-cuda-kv-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for devices in [vec![0], vec![0, 0]] {
        let Some(mut eng) = load_on(Backend::Cuda, devices.clone()) else { return };
        let mut s = before_save(&mut eng);
        let path = dir.join(format!("s{}.kv", devices.len()));
        save(&mut eng, &mut s, &path);
        let (want, want_logits) = continue_greedy(&mut eng, &mut s, 24);
        drop(s);
        drop(eng);
        let mut eng = load_on(Backend::Cuda, devices.clone()).unwrap();
        let mut r = restore(&mut eng, &path);
        assert_eq!(r.kv.pos, 79);
        let (got, got_logits) = continue_greedy(&mut eng, &mut r, 24);
        println!("cuda {devices:?}: restored at 79 tokens; continuation {got:?}");
        assert_eq!(got, want, "greedy continuation after restore differs ({devices:?})");
        assert!(got_logits == want_logits, "logits after restore differ ({devices:?})");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The files are the backend's common format: a CUDA-saved session continues on the CPU, and a
/// CPU-saved one on CUDA. The backends' arithmetic differs (summation order, the GPU's fast paths),
/// so the continuations are compared with each backend's own uninterrupted run and the agreement is
/// printed; the restore itself must succeed and the first step must agree (the saved logits).
#[test]
fn session_files_move_between_cpu_and_cuda() {
    let dir = std::env::temp_dir().join(format!("ds4-cross-kv-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let Some(mut gpu) = load_on(Backend::Cuda, vec![0]) else { return };
    let mut cpu = load_on(Backend::Cpu, vec![0]).unwrap();
    let (gp, cp) = (dir.join("gpu.kv"), dir.join("cpu.kv"));
    let mut gs = before_save(&mut gpu);
    save(&mut gpu, &mut gs, &gp);
    let mut cs = before_save(&mut cpu);
    save(&mut cpu, &mut cs, &cp);
    let (g_want, _) = continue_greedy(&mut gpu, &mut gs, 16);
    let (c_want, _) = continue_greedy(&mut cpu, &mut cs, 16);
    let mut on_cpu = restore(&mut cpu, &gp);
    let (g_on_cpu, _) = continue_greedy(&mut cpu, &mut on_cpu, 16);
    let mut on_gpu = restore(&mut gpu, &cp);
    let (c_on_gpu, _) = continue_greedy(&mut gpu, &mut on_gpu, 16);
    let same = |a: &[u32], b: &[u32]| a.iter().zip(b).take_while(|(x, y)| x == y).count();
    println!("cuda-saved, continued on cpu: {}/16 tokens as the cuda run, {}/16 as the cpu run", same(&g_on_cpu, &g_want), same(&g_on_cpu, &c_want));
    println!("cpu-saved, continued on cuda: {}/16 tokens as the cpu run, {}/16 as the cuda run", same(&c_on_gpu, &c_want), same(&c_on_gpu, &g_want));
    assert_eq!(g_on_cpu[0], g_want[0]);
    assert_eq!(c_on_gpu[0], c_want[0]);
    let _ = std::fs::remove_dir_all(&dir);
}
