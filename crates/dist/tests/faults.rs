//! Failures on loopback: refused registrations, malformed frames, killed and hung workers.
mod common;
use common::*;
use ds4_dist::worker::WorkerOptions;
use ds4_dist::DistError;
use std::io::{Read, Write};
use std::time::{Duration, Instant};

const CHUNK: usize = 16;
const TIMEOUT: Duration = Duration::from_secs(2);

fn refused(path: &std::path::Path, layers: &str, addr: &str, token: Option<&str>) -> String {
    let w = thread_worker(path, layers, addr, token, TIMEOUT);
    let t0 = Instant::now();
    let mut w = w;
    // Bounded: a worker that is wrongly accepted fails the test instead of hanging it.
    while !w.join.as_ref().unwrap().is_finished() {
        assert!(t0.elapsed() < Duration::from_secs(10), "worker {layers} from {} was not refused within 10 s", path.display());
        std::thread::sleep(Duration::from_millis(20));
    }
    let r = w.join.take().unwrap().join().unwrap();
    match r {
        Err(e @ (DistError::Rejected(_) | DistError::Auth(_))) => e.to_string(),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn wrong_model_range_or_secret_is_refused_with_the_reason() {
    let (c, _local) = coordinator("0:2", 32, Some("s3cret"), TIMEOUT, CHUNK);
    let e = refused(other_model(), "3:output", &c.addr, Some("s3cret"));
    assert!(e.contains("wrong model"), "{e}");
    let e = refused(model(), "1:output", &c.addr, Some("s3cret"));
    assert!(e.contains("overlap"), "{e}");
    let e = refused(model(), "3:5", &c.addr, Some("s3cret"));
    assert!(e.contains("without the output head"), "{e}");
    let e = refused(model(), "3:output", &c.addr, None);
    assert!(e.contains("authentication required"), "{e}");
    let e = refused(model(), "3:output", &c.addr, Some("guess"));
    assert!(e.contains("authentication failed"), "{e}");
    // A worker that requires a secret refuses a coordinator that cannot prove it.
    let (c2, _l2) = coordinator("0:2", 32, None, TIMEOUT, CHUNK);
    let e = refused(model(), "3:output", &c2.addr, Some("s3cret"));
    assert!(e.contains("did not prove"), "{e}");
    assert!(c.coord.plan().is_err());
    // With the secret, the same worker registers.
    let _w = thread_worker(model(), "3:output", &c.addr, Some("s3cret"), TIMEOUT);
    c.coord.wait_complete(Duration::from_secs(10)).unwrap();
}

#[test]
fn same_metadata_and_table_with_other_weights_is_refused() {
    // Another seed of the same synthetic model: metadata and tensor table are equal, so only the
    // weights fingerprint tells the files apart (it used to register and give other text).
    let f = |p: &std::path::Path| std::sync::Arc::new(ds4_gguf::GgufFile::open(p).unwrap());
    let (a, b) = (f(model()), f(reseeded_model()));
    let r = ds4_model::LayerRange::parse("3:output", 6).unwrap();
    assert_eq!(ds4_dist::identity::model_id(&a), ds4_dist::identity::model_id(&b));
    assert_eq!(ds4_dist::identity::table_id(&a, r), ds4_dist::identity::table_id(&b, r));
    let (c, _local) = coordinator("0:2", 32, None, TIMEOUT, CHUNK);
    let e = refused(reseeded_model(), "3:output", &c.addr, None);
    assert!(e.contains("wrong model") && e.contains("weights of layers 3:output differ"), "{e}");
    assert!(c.coord.plan().is_err());
    // The coordinator's own file registers (the fingerprint is cached per range: asked twice).
    for _ in 0..2 {
        let w = thread_worker(model(), "3:output", &c.addr, None, TIMEOUT);
        c.coord.wait_complete(Duration::from_secs(10)).unwrap();
        w.finish().unwrap();
    }
}

#[test]
fn a_coordinator_that_leaves_no_layer_for_the_head_owner_is_a_usage_error() {
    // 0:5 of a 6-layer model without the head: a worker would have to start at layer 6, so the route
    // could never complete (it used to wait DS4_DIST_WAIT_S, 300 s, for a worker that cannot exist).
    let dist = ds4_dist::DistArgs {
        role: Some(ds4_dist::Role::Coordinator),
        layers: Some("0:5".into()),
        listen: vec!["127.0.0.1".into(), "0".into()],
        dist_timeout_s: 2.0,
        ..Default::default()
    };
    dist.validate().unwrap();
    let t0 = Instant::now();
    let e = ds4_dist::cli::start_coordinator(&dist, model(), &load_opts(), Some(Duration::from_secs(30))).err().expect("refused");
    assert!(matches!(e, DistError::Usage(_)) && e.to_string().contains("0:output"), "{e}");
    assert!(t0.elapsed() < Duration::from_secs(5));
}

#[test]
fn malformed_frames_close_only_that_connection() {
    let (c, local) = coordinator("0:2", 32, None, TIMEOUT, CHUNK);
    let _w = thread_worker(model(), "3:output", &c.addr, None, TIMEOUT);
    c.coord.wait_complete(Duration::from_secs(10)).unwrap();
    let garbage: [&[u8]; 4] = [
        &[0xff, 0xff, 0xff, 0xff, 1, 2, 3],                  // length over the pre-auth limit
        &[0, 0, 0, 3, 2, 0, 9],                              // right version, truncated message
        &[0, 0, 0, 6, 7, 0, 0, 0, 0, 0],                     // wrong version
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",                // not our protocol at all
    ];
    for g in garbage {
        let mut s = std::net::TcpStream::connect(&c.addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.write_all(g).unwrap();
        let mut buf = [0u8; 64];
        let t0 = Instant::now();
        // The coordinator closes this connection (EOF or reset), quickly.
        loop {
            match s.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
            assert!(t0.elapsed() < Duration::from_secs(5));
        }
    }
    // The registered worker and the route are untouched.
    let mut s = session(&c, local, 32, CHUNK);
    let p = prompt(20, 9);
    let (rt, rl) = reference(&p, CHUNK, 1);
    assert_eq!(s.sync(&p).unwrap(), &rl[0][..]);
    assert_eq!(argmax(&rl[0]), rt[0]);
}

fn wait_route(c: &Coord) {
    c.coord.wait_complete(Duration::from_secs(20)).expect("route completes");
}

#[test]
fn killed_worker_mid_prefill_fails_in_bounded_time_and_restart_recovers() {
    let (c, local) = coordinator("0:2", 32, None, TIMEOUT, CHUNK);
    let w = proc_worker(model(), "3:output", &c.addr, &[]);
    wait_route(&c);
    let mut s = session(&c, local, 32, CHUNK);
    let p = prompt(200, 5);
    // Freeze the worker so the prefill is certainly in flight, then kill it.
    w.signal("STOP");
    let killer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        w.signal("KILL");
        (w, Instant::now())
    });
    let t0 = Instant::now();
    let e = s.sync(&p).unwrap_err().to_string();
    let (w, killed) = killer.join().unwrap();
    drop(w);
    eprintln!("prefill error after {:.2}s ({:.2}s after the kill): {e}", t0.elapsed().as_secs_f64(), killed.elapsed().as_secs_f64());
    assert!(t0.elapsed() < TIMEOUT + Duration::from_secs(3), "not bounded: {:?}", t0.elapsed());
    assert!(e.contains("stage 1") && e.contains("3:output"), "{e}");
    // The route is incomplete now; a request says so instead of hanging.
    let e2 = s.sync(&p).unwrap_err().to_string();
    assert!(e2.contains("incomplete") || e2.contains("stage 1"), "{e2}");
    // Restart: the next request succeeds with the single-process result.
    let _w2 = proc_worker(model(), "3:output", &c.addr, &[]);
    wait_route(&c);
    let (rt, rl) = reference(&p, CHUNK, 2);
    assert_eq!(s.sync(&p).unwrap(), &rl[0][..]);
    assert_eq!(s.step(rt[0]).unwrap(), &rl[1][..]);
}

#[test]
fn killed_worker_mid_decode_fails_then_replays_history_after_restart() {
    let (c, local) = coordinator("0:1", 32, None, TIMEOUT, CHUNK);
    let _mid = thread_worker(model(), "2:3", &c.addr, None, TIMEOUT);
    let w = proc_worker(model(), "4:output", &c.addr, &[]);
    wait_route(&c);
    let mut s = session(&c, local, 32, CHUNK);
    let p = prompt(60, 6);
    let (rt, rl) = reference(&p, CHUNK, 6);
    assert_eq!(s.sync(&p).unwrap(), &rl[0][..]);
    assert_eq!(s.step(rt[0]).unwrap(), &rl[1][..]);
    assert_eq!(s.step(rt[1]).unwrap(), &rl[2][..]);
    w.signal("KILL");
    drop(w);
    let t0 = Instant::now();
    let e = s.step(rt[2]).unwrap_err().to_string();
    eprintln!("decode error after {:.2}s: {e}", t0.elapsed().as_secs_f64());
    assert!(t0.elapsed() < TIMEOUT + Duration::from_secs(3));
    assert!(e.contains("4:output"), "{e}");
    let _w2 = proc_worker(model(), "4:output", &c.addr, &[]);
    wait_route(&c);
    // The failed token was not committed: the history (prompt + 2 tokens) is replayed, then decode goes on.
    assert_eq!(s.tokens.len(), p.len() + 2);
    assert_eq!(s.step(rt[2]).unwrap(), &rl[3][..]);
    assert_eq!(s.step(rt[3]).unwrap(), &rl[4][..]);
}

#[test]
fn hung_worker_is_detected_by_heartbeat_and_reconnects_when_it_wakes() {
    let (c, local) = coordinator("0:2", 32, None, TIMEOUT, CHUNK);
    let w = proc_worker(model(), "3:output", &c.addr, &[]);
    wait_route(&c);
    let mut s = session(&c, local, 32, CHUNK);
    let p = prompt(30, 7);
    let (rt, rl) = reference(&p, CHUNK, 3);
    assert_eq!(s.sync(&p).unwrap(), &rl[0][..]);
    w.signal("STOP");
    let t0 = Instant::now();
    let e = s.step(rt[0]).unwrap_err().to_string();
    let dt = t0.elapsed();
    eprintln!("hung worker detected after {:.2}s: {e}", dt.as_secs_f64());
    assert!(dt >= TIMEOUT / 2 && dt < TIMEOUT + Duration::from_secs(3), "{dt:?}");
    assert!(e.contains("stage 1") && e.contains("no heartbeat"), "{e}");
    // It wakes up, notices the coordinator dropped it, reconnects and registers again.
    let gen = c.coord.generation();
    w.signal("CONT");
    c.coord.wait_change(gen, Duration::from_secs(10));
    wait_route(&c);
    assert_eq!(s.step(rt[0]).unwrap(), &rl[1][..]);
    assert_eq!(s.step(rt[1]).unwrap(), &rl[2][..]);
}

/// The worker's connection stays up and its heartbeat thread keeps beating, but its compute thread
/// blocks mid-request (test hook after the first layer of its 3rd request = the first decode step,
/// after two prefill chunks): the heartbeats carry no progress, so the coordinator fails the request
/// at the worker's last progress + the timeout, naming the stage; a restarted worker replays.
#[test]
fn hung_compute_with_live_heartbeats_fails_naming_the_stage_and_restart_recovers() {
    let (c, local) = coordinator("0:2", 32, None, TIMEOUT, CHUNK);
    let opts = WorkerOptions { load: load_opts(), timeout: TIMEOUT, test_hang_at: Some(3), ..WorkerOptions::default() };
    let hung = thread_worker_with(model(), "3:output", &c.addr, opts);
    wait_route(&c);
    let mut s = session(&c, local, 32, CHUNK);
    let p = prompt(30, 8);
    let (rt, rl) = reference(&p, CHUNK, 3);
    assert_eq!(s.sync(&p).unwrap(), &rl[0][..]);
    let t0 = Instant::now();
    let e = s.step(rt[0]).unwrap_err().to_string();
    let dt = t0.elapsed();
    eprintln!("hung compute detected after {:.2}s: {e}", dt.as_secs_f64());
    // Not before the bound (the worker was never silent), and not much after it.
    assert!(dt >= TIMEOUT - Duration::from_millis(100) && dt < TIMEOUT + Duration::from_millis(1500), "{dt:?}");
    assert!(e.contains("stage 1") && e.contains("3:output") && e.contains("compute hung") && e.contains("1 of 3 layers + head done"), "{e}");
    assert!(!e.contains("no heartbeat"), "detected by progress, not by silence: {e}");
    // Until a worker registers again the next step fails at once with the same cause (as "route
    // incomplete" once the coordinator has dropped the worker, or from the failed stage before that);
    // then the history is replayed.
    let t1 = Instant::now();
    let e2 = s.step(rt[0]).unwrap_err().to_string();
    assert!(t1.elapsed() < Duration::from_millis(500), "second step took {:?}", t1.elapsed());
    assert!(e2.contains("compute hung") && (e2.contains("incomplete") || e2.contains("stage 1")), "{e2}");
    hung.finish().unwrap();
    let _w2 = thread_worker(model(), "3:output", &c.addr, None, TIMEOUT);
    wait_route(&c);
    assert_eq!(s.step(rt[0]).unwrap(), &rl[1][..]);
    assert_eq!(s.step(rt[1]).unwrap(), &rl[2][..]);
}

/// A replay that fails keeps the history: here the replacement worker hangs in its first request
/// (the replay's first prefill chunk). The next worker then gets the whole history replayed, not a
/// conversation restarted at position 0. (This is the race of the test above made certain: there
/// the second step may still see the route with the hung worker and replay onto it.)
#[test]
fn failed_replay_keeps_the_history_and_the_next_worker_gets_it_replayed() {
    let (c, local) = coordinator("0:2", 32, None, TIMEOUT, CHUNK);
    let first = thread_worker(model(), "3:output", &c.addr, None, TIMEOUT);
    wait_route(&c);
    let mut s = session(&c, local, 32, CHUNK);
    let p = prompt(30, 10);
    let (rt, rl) = reference(&p, CHUNK, 2);
    assert_eq!(s.sync(&p).unwrap(), &rl[0][..]);
    let gen = c.coord.generation();
    first.finish().unwrap();
    c.coord.wait_change(gen, Duration::from_secs(10));
    assert!(c.coord.plan().is_err(), "the stopped worker is forgotten");
    let opts = WorkerOptions { load: load_opts(), timeout: TIMEOUT, test_hang_at: Some(1), ..WorkerOptions::default() };
    let hung = thread_worker_with(model(), "3:output", &c.addr, opts);
    wait_route(&c);
    let e = s.step(rt[0]).unwrap_err().to_string();
    assert!(e.contains("stage 1") && e.contains("compute hung"), "{e}");
    assert_eq!(s.tokens, p, "the history survives the failed replay");
    assert_eq!(s.logits, rl[0], "and so do the logits after it");
    let gen = c.coord.generation();
    hung.finish().unwrap();
    c.coord.wait_change(gen, Duration::from_secs(10));
    let _w = thread_worker(model(), "3:output", &c.addr, None, TIMEOUT);
    wait_route(&c);
    assert_eq!(s.step(rt[0]).unwrap(), &rl[1][..]);
    assert_eq!(s.step(rt[1]).unwrap(), &rl[2][..]);
}

/// The same hang in a worker process (`DS4_DIST_TEST_HANG`), in its 2nd request: a pipelined
/// prefill chunk with more chunks in flight behind it.
#[test]
fn hung_compute_mid_prefill_in_a_worker_process_fails_in_bounded_time() {
    let (c, local) = coordinator("0:2", 32, None, TIMEOUT, CHUNK);
    let w = proc_worker_env(model(), "3:output", &c.addr, &[], &[("DS4_DIST_TEST_HANG", "2")]);
    wait_route(&c);
    let mut s = session(&c, local, 32, CHUNK);
    let p = prompt(120, 4);
    let t0 = Instant::now();
    let e = s.sync(&p).unwrap_err().to_string();
    let dt = t0.elapsed();
    eprintln!("hung prefill detected after {:.2}s: {e}", dt.as_secs_f64());
    assert!(dt >= TIMEOUT - Duration::from_millis(100) && dt < TIMEOUT + Duration::from_millis(1500), "{dt:?}");
    assert!(e.contains("stage 1") && e.contains("3:output") && e.contains("compute hung"), "{e}");
    drop(w);
    let _w2 = proc_worker(model(), "3:output", &c.addr, &[]);
    wait_route(&c);
    let (rt, rl) = reference(&p, CHUNK, 1);
    assert_eq!(s.sync(&p).unwrap(), &rl[0][..]);
    assert_eq!(s.step(rt[0]).unwrap(), &rl[1][..]);
}

/// A slow worker whose every request outlasts the timeout, while its layers keep completing, is
/// not taken for a hung one.
#[test]
fn slow_compute_that_makes_progress_is_not_killed() {
    // 3 layers + head at 400 ms each: 1.6 s per request, with progress every 400 ms.
    let timeout = Duration::from_secs(1);
    let (c, local) = coordinator("0:2", 32, None, timeout, CHUNK);
    let opts = WorkerOptions { load: load_opts(), timeout, test_layer_delay: Some(Duration::from_millis(400)), ..WorkerOptions::default() };
    let _w = thread_worker_with(model(), "3:output", &c.addr, opts);
    wait_route(&c);
    let mut s = session(&c, local, 32, CHUNK);
    let p = prompt(12, 3);
    let (_, rl) = reference(&p, CHUNK, 0);
    let t0 = Instant::now();
    assert_eq!(s.sync(&p).unwrap(), &rl[0][..]);
    let dt = t0.elapsed();
    assert!(dt > timeout + timeout / 2, "the request took {dt:?}, not clearly longer than the timeout");
}

/// A middle worker of a 3-stage route killed during a pipelined prefill (its 3rd chunk blocked by
/// the test hook, more chunks in flight behind it and its results relayed to the last worker): the
/// prefill fails at the kill, naming the stage, long before the hang timeout; after a restart the
/// next request replays and matches the single process.
#[test]
fn killed_middle_worker_mid_pipelined_prefill_fails_at_once_and_restart_recovers() {
    let (c, local) = coordinator("0:1", 32, None, TIMEOUT, CHUNK);
    let w = proc_worker_env(model(), "2:3", &c.addr, &[], &[("DS4_DIST_TEST_HANG", "3")]);
    let _last = thread_worker(model(), "4:output", &c.addr, None, TIMEOUT);
    wait_route(&c);
    let mut s = session(&c, local, 32, CHUNK);
    let p = prompt(150, 6);
    let killer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(400));
        w.signal("KILL");
        (w, Instant::now())
    });
    let e = s.sync(&p).unwrap_err().to_string();
    let (w, killed) = killer.join().unwrap();
    let after = killed.elapsed();
    drop(w);
    eprintln!("pipelined prefill error {:.2}s after the kill: {e}", after.as_secs_f64());
    assert!(e.contains("stage 1") && e.contains("2:3"), "{e}");
    assert!(!e.contains("compute hung") && after < TIMEOUT, "the kill is noticed at once, not by the hang timeout: {after:?} {e}");
    let _w2 = proc_worker(model(), "2:3", &c.addr, &[]);
    wait_route(&c);
    let (rt, rl) = reference(&p, CHUNK, 1);
    assert_eq!(s.sync(&p).unwrap(), &rl[0][..]);
    assert_eq!(s.step(rt[0]).unwrap(), &rl[1][..]);
}

#[test]
fn a_flood_of_silent_connections_is_bounded_and_a_worker_registers_after_it() {
    use ds4_dist::coordinator::MAX_PENDING_HANDSHAKES;
    use std::net::TcpStream;
    let (c, _local) = coordinator("0:2", 32, None, TIMEOUT, CHUNK);
    // Connections that never say Hello fill the handshake places; the next ones are closed at once.
    let silent: Vec<TcpStream> = (0..MAX_PENDING_HANDSHAKES).map(|_| TcpStream::connect(&c.addr).unwrap()).collect();
    std::thread::sleep(Duration::from_millis(200));
    let mut extra = TcpStream::connect(&c.addr).unwrap();
    extra.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
    let t0 = Instant::now();
    let mut b = [0u8; 1];
    assert!(matches!(extra.read(&mut b), Ok(0) | Err(_)), "a connection over the bound was served");
    assert!(t0.elapsed() < Duration::from_millis(900), "the connection over the bound was not closed at once");
    // The silent ones time out (the handshake's timeout) and free their places: a worker registers.
    let w = thread_worker(model(), "3:output", &c.addr, None, TIMEOUT);
    c.coord.wait_complete(Duration::from_secs(15)).unwrap();
    drop(silent);
    w.finish().unwrap();
}
