//! The memory plan comes before the weights (issue 27): a budget the plan exceeds refuses with the
//! numbers and a fitting flag value before a single weight byte is read, counted by the load
//! counters; loads that fit read exactly what the weight mode says. One test: the counters are
//! process-wide, so the steps run in order.
use ds4_engine::{resolve_model, Engine, EngineError, LoadOptions, WeightMemory};
use ds4_model::residency::{self, Op, Phase};

#[test]
fn refusal_reads_no_weight_and_loads_read_what_the_mode_says() {
    let src = resolve_model(None).unwrap();
    let path = src.path();
    let size = std::fs::metadata(path).unwrap().len();
    let opts = LoadOptions { ctx: 512, prefill_chunk: 32, ..LoadOptions::default() };
    let (bytes0, maps0) = (residency::loaded_bytes(), residency::snapshot().get(Phase::Load, Op::Map));

    // A budget far below the plan: refused, with the limit that would fit, and nothing read or mapped.
    let tiny = LoadOptions { mem_limit_gb: Some(1e-6), ..opts.clone() };
    let err = match Engine::load(path, &tiny) {
        Err(EngineError::Budget(m)) => m,
        Err(e) => panic!("expected a budget refusal, got {e}"),
        Ok(_) => panic!("a 1 KiB budget admitted the model"),
    };
    assert!(err.contains("exceeds the budget") && err.contains("would fit") && err.contains("--mem-limit-gb"), "{err}");
    assert_eq!(residency::loaded_bytes(), bytes0, "weights were read before the refusal");
    assert_eq!(residency::snapshot().get(Phase::Load, Op::Map), maps0, "weights were mapped before the refusal");

    // The plan alone reads nothing either, and what it admits is what the load then uses.
    let plan = Engine::plan(path, &opts).unwrap();
    assert_eq!(residency::loaded_bytes(), bytes0);
    assert!(plan.tokenizer.is_some(), "the tokenizer comes from the metadata, at plan time");
    let planned = plan.memory;
    let weights = planned.weights;
    assert!(weights > 0 && weights <= size, "planned weights {weights} vs file {size}");

    // The copy (CPU default) reads every planned weight byte once.
    let eng = plan.load().unwrap();
    assert_eq!(eng.plan, planned);
    assert_eq!(eng.stage.w.resident_bytes(), weights);
    assert_eq!(residency::loaded_bytes() - bytes0, weights);
    drop(eng);

    // A lazy mapping reads nothing at load; a warmed one reads every page.
    let before = residency::loaded_bytes();
    let eng = Engine::load(path, &LoadOptions { weights: Some(WeightMemory::Mmap), ..opts.clone() }).unwrap();
    assert_eq!(eng.plan.memory, WeightMemory::Mmap);
    assert_eq!(residency::loaded_bytes(), before);
    drop(eng);
    Engine::load(path, &LoadOptions { weights: Some(WeightMemory::Mmap), warm_weights: true, quiet: true, ..opts.clone() }).unwrap();
    assert_eq!(residency::loaded_bytes() - before, weights);

    // A budget just above the plan admits it; just below refuses (the plan is the whole story).
    let gib = (1u64 << 30) as f64;
    let at = |b: u64| LoadOptions { mem_limit_gb: Some(b as f64 / gib), ..opts.clone() };
    assert!(Engine::plan(path, &at(planned.total() + 4096)).is_ok());
    assert!(matches!(Engine::plan(path, &at(planned.total() - 4096)), Err(EngineError::Budget(_))));
}

#[test]
fn bad_options_are_refused_before_the_file_is_opened() {
    let missing = std::path::Path::new("/nonexistent/model.gguf");
    for (opts, flag) in [
        (LoadOptions { ctx: 0, ..LoadOptions::default() }, "--ctx"),
        (LoadOptions { prefill_chunk: 0, ..LoadOptions::default() }, "--prefill-chunk"),
        (LoadOptions { threads: Some(0), ..LoadOptions::default() }, "--threads"),
        (LoadOptions { mem_limit_gb: Some(-1.0), ..LoadOptions::default() }, "--mem-limit-gb"),
        (LoadOptions { mem_limit_gb: Some(f64::NAN), ..LoadOptions::default() }, "--mem-limit-gb"),
    ] {
        match Engine::plan(missing, &opts) {
            Err(EngineError::Invalid(m)) => assert!(m.contains(flag), "{m}"),
            Err(e) => panic!("{flag}: expected a usage error before opening the file, got {e}"),
            Ok(_) => panic!("{flag}: accepted"),
        }
    }
}

#[test]
fn kv_states_are_planned_per_state() {
    let src = resolve_model(None).unwrap();
    let one = Engine::plan(src.path(), &LoadOptions { ctx: 4096, ..LoadOptions::default() }).unwrap().memory;
    let nine = Engine::plan(src.path(), &LoadOptions { ctx: 4096, kv_states: 9, ..LoadOptions::default() }).unwrap().memory;
    assert_eq!(nine.total() - one.total(), 8 * one.kv.total());
}

#[test]
fn values_that_would_overflow_the_plan_are_refused_before_the_file_is_opened() {
    // Each used to wrap the plan's byte counts to a small number and then panic or abort on the
    // allocation (`--ctx 18446744073709551615`, `--prefill-chunk 2^62`, `--concurrency 2^64-1`), or hang
    // spawning threads (`--threads 100000`).
    let missing = std::path::Path::new("/nonexistent/model.gguf");
    for (opts, needle) in [
        (LoadOptions { ctx: usize::MAX, ..LoadOptions::default() }, "--ctx"),
        (LoadOptions { ctx: ds4_engine::MAX_CTX + 1, ..LoadOptions::default() }, "--ctx"),
        (LoadOptions { prefill_chunk: 1 << 62, ..LoadOptions::default() }, "--prefill-chunk"),
        (LoadOptions { threads: Some(100_000), ..LoadOptions::default() }, "--threads"),
        (LoadOptions { kv_states: usize::MAX, ..LoadOptions::default() }, "sessions"),
        (LoadOptions { batch_slots: ds4_engine::MAX_SESSIONS + 1, ..LoadOptions::default() }, "sessions"),
    ] {
        match Engine::plan(missing, &opts) {
            Err(EngineError::Invalid(m)) => assert!(m.contains(needle) && m.contains("at most"), "{m}"),
            Err(e) => panic!("{needle}: expected a usage error before opening the file, got {e}"),
            Ok(_) => panic!("{needle}: accepted"),
        }
    }
    // The largest accepted values still reach the file (and the plan).
    let ok = LoadOptions { ctx: ds4_engine::MAX_CTX, threads: Some(ds4_engine::MAX_THREADS), ..LoadOptions::default() };
    assert!(ok.validate().is_ok());
}
