//! ds4's interactive `/ctx N` (`Engine::set_ctx`): a new context is admitted by the memory plan as
//! `--ctx N` is at startup, never allocated unchecked (a huge N used to abort the process on the KV
//! allocation), and a refusal leaves the engine as it was.
use ds4_engine::{resolve_model, Engine, EngineError, LoadOptions, Session, MAX_CTX};

#[test]
fn a_new_context_is_planned_and_admitted_by_the_load_budget() {
    let src = resolve_model(None).unwrap();
    let opts = LoadOptions { ctx: 256, prefill_chunk: 32, mem_limit_gb: Some(1.0), quiet: true, ..LoadOptions::default() };
    let mut eng = Engine::load(src.path(), &opts).unwrap();
    let before = eng.plan;

    // Over the 1 GiB budget the engine was loaded with: refused with the plan's numbers, nothing changed.
    match eng.set_ctx(100_000_000) {
        Err(EngineError::Budget(m)) => assert!(m.contains("exceeds the budget") && m.contains("would fit"), "{m}"),
        Err(e) => panic!("expected a budget refusal, got {e}"),
        Ok(p) => panic!("admitted {:.1} GiB over a 1 GiB budget", p.total() as f64 / (1u64 << 30) as f64),
    }
    for (n, what) in [(0, "at least 1"), (MAX_CTX + 1, "at most")] {
        match eng.set_ctx(n) {
            Err(EngineError::Invalid(m)) => assert!(m.contains(what), "{n}: {m}"),
            other => panic!("{n}: expected a usage error, got {:?}", other.map(|p| p.ctx)),
        }
    }
    assert_eq!((eng.ctx, eng.plan), (256, before), "a refusal changes nothing");

    // A context that fits: the plan is the one `--ctx 4096` would make, and sessions get it.
    let plan = *eng.set_ctx(4096).unwrap();
    assert_eq!((eng.ctx, plan.ctx), (4096, 4096));
    let fresh = Engine::plan(src.path(), &LoadOptions { ctx: 4096, ..opts.clone() }).unwrap().memory;
    assert_eq!(plan.kv, fresh.kv);
    assert!(plan.total() > before.total());
    let s = Session::new(&eng);
    assert_eq!(s.kv.ctx, 4096);
    // Shrinking is planned too.
    assert_eq!(eng.set_ctx(128).unwrap().ctx, 128);
}
